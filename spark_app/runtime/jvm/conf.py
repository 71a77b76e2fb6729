"""A driver's session configuration: everything spark_app relies on, set in one place.

The JVM packages' settings (Delta Lake, hadoop-aws, spark-hadoop-cloud), the RocksDB state
store with changelog checkpointing, the snapshot interval, S3A settings for an S3 backend
(without credentials: S3A reads the standard AWS variables), Delta's commits on S3 with
put-if-absent. Pure, and without pyspark: the driver computes it to start its JVM before
it imports Spark's Python side (``launch``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from spark_app import contract
from spark_app.persistence import Backend, Config
from spark_app.runtime.jvm import state_stores

STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# tools/jars/java/dev/sparkapp/fs/InPlaceCheckpointFileManager.java: Spark's checkpoint on S3.
IN_PLACE_CHECKPOINT_MANAGER = "dev.sparkapp.fs.InPlaceCheckpointFileManager"
# tools/jars/java/dev/sparkapp/delta/S3PutIfAbsentLogStore.java, compiled by `make jars`.
DELTA_S3_LOG_STORE = "dev.sparkapp.delta.S3PutIfAbsentLogStore"
# tools/jars/java/dev/sparkapp/fs: local files with their permissions set in-process.
LOCAL_FILE_SYSTEM = "dev.sparkapp.fs.NioLocalFileSystem"
LOCAL_FS = "dev.sparkapp.fs.NioLocalFs"
FAIR_SCHEDULER_POOLS = Path(__file__).with_name("fairscheduler.xml")
"""The pools of the fair scheduler, shipped with the package (the wheel carries it)."""

_DEFAULTS = {
    "spark.master": "local[*]",
    "spark.app.name": "spark_app",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    # Fixed into a stateful query's checkpoint on its first batch; small suits one driver.
    "spark.sql.shuffle.partitions": "4",
    STATE_STORE_PROVIDER: ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # A store snapshots at least every 10 versions, and its last version once the snapshot
    # interval has passed (state_stores.snapshot_now); the maintenance interval (the
    # snapshot interval too) uploads what it snapshotted.
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(state_stores.MIN_DELTAS_FOR_SNAPSHOT),
    "spark.sql.streaming.minBatchesToRetain": "100",
    "spark.ui.showConsoleProgress": "false",
    # Jobs in the default pool keep their one queue (first in, first out); a backfill reads
    # its chunks in a pool of its own (sources/delta_table.py: read_aside), shared task by
    # task with the default pool, so a long chunk read does not hold up the live changes.
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(FAIR_SCHEDULER_POOLS),
    # Delta rebuilds a table's snapshot from its log with this many tasks (50 by default);
    # the logs here are small, and 50 tasks cost seconds per read on a small driver.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Delta refuses to read any version but the latest once its commit is older than the
    # table's deletedFileRetentionDuration, whether or not its files are still there. A
    # shared table keeps tombstones for a minute (tables/publish.py) and its versions for
    # as long as a reader's hold needs them, so a reader that lagged a minute was refused
    # versions it held. Reads of versions whose files are gone still fail, and the
    # readers report them as gone (sources/delta_table.py: _translate).
    "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
    # A Delta version on s3a:// is committed by creating its log file only if absent (S3's
    # If-None-Match: *), so two drivers cannot both commit it; Delta's own store for s3a
    # checks, then writes (delta-io/delta#3596). The store needs S3A's conditional create
    # (HADOOP-19256). In every session, not only those with S3 state: a pipeline may write
    # a Delta table to S3 whatever its state backend.
    "spark.delta.logStore.s3a.impl": DELTA_S3_LOG_STORE,
    "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
    # Without Hadoop's native library, Hadoop set each local file's permissions with a
    # chmod process: a state store's first load copies every RocksDB file of its snapshot
    # (1,000 per partition after 1,000 batches of keys that arrive in order), and took 25 s.
    "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM,
    "spark.hadoop.fs.AbstractFileSystem.file.impl": LOCAL_FS,
}


def spark_conf(snapshot: Backend, snapshot_interval_ms: int, extra: Mapping[str, str]) -> dict[str, str]:
    """The complete configuration for a pipeline's session. Pure: tests call it directly."""
    conf = dict(_DEFAULTS)
    conf["spark.sql.streaming.stateStore.maintenanceInterval"] = f"{snapshot_interval_ms}ms"
    if snapshot.kind == "s3":
        conf.update(s3a_conf(snapshot))
        # Spark's checkpoint written in place, not under a temporary name then copied and
        # deleted (a rename on S3), through one S3A client, and never a failed write taken
        # for a written file (the manager's docstring). Spark reads the setting from the
        # Hadoop configuration (CheckpointFileManager.create), where it can still be set
        # once the session runs: as a SQL setting it cannot, and a pipeline whose state is
        # named in run(), after its sources built the session, lost it.
        conf["spark.hadoop.spark.sql.streaming.checkpointFileManagerClass"] = IN_PLACE_CHECKPOINT_MANAGER
    conf.update(extra)
    return conf


def s3a_conf(backend: Backend) -> dict[str, str]:
    conf = {
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
        "spark.hadoop.fs.s3a.path.style.access": "true" if backend.path_style else "false",
        # S3A rides out a short blip (about 15 s of retries of a failed connection); a longer
        # outage fails the query, which the driver restarts for its outage budget, and then
        # the operator relaunches the driver until storage is back (README: reliability).
        "spark.hadoop.fs.s3a.retry.limit": "5",
        "spark.hadoop.fs.s3a.retry.interval": "500ms",
        "spark.hadoop.fs.s3a.attempts.maximum": "3",
        "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
        "spark.hadoop.fs.s3a.connection.timeout": "60s",
        "spark.hadoop.fs.s3a.committer.magic.enabled": "true",
    }
    if backend.endpoint_url:
        conf["spark.hadoop.fs.s3a.endpoint"] = backend.endpoint_url
        # An S3-compatible server: local files (a RocksDB state store's snapshot files) go
        # up through S3A's output stream, as every other write, not the SDK's asynchronous
        # transfer, which the local S3 server (moto's) answers with an error (S3Exception,
        # status 100): every snapshot upload failed, silently (Spark ignores a maintenance
        # error), and each start replayed the state's changelog from its first version.
        conf["spark.hadoop.fs.s3a.optimized.copy.from.local.enabled"] = "false"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(backend.endpoint_url.startswith("https")).lower()
    if backend.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = backend.region
    elif backend.endpoint_url:
        # S3-compatible servers ignore the region, but the AWS SDK v2 insists on one.
        conf["spark.hadoop.fs.s3a.endpoint.region"] = "us-east-1"
    return conf


def initial_conf(environment: contract.DriverEnvironment) -> dict[str, str]:
    """A driver's session configuration before ``run`` says where its state lives: what the
    operator injected, or a local run's defaults. The environment alone decides it, so the
    driver can start its JVM before it reads the pipeline (``launch.start_early``)."""
    injected = environment.injected
    if injected is not None:
        config = Config.injected(injected)
        return spark_conf(config.snapshot_storage, config.snapshot_interval_ms, config.spark_conf)
    return spark_conf(Backend.filesystem(tempfile.gettempdir()), 10_000, environment.spark_conf)
