"""Shared tables: one pipeline maintains a keyed, versioned table; others read it as a
changelog or look it up, without recomputing it or keeping a copy.

    # the publisher
    totals = orders.groupBy("customer_id").agg(F.sum("amount").alias("total"))
    sa.io.tables.publish(totals, name="customers", key=["customer_id"])

    # a reader of its changes (an update is -old +new)
    changes = sa.io.tables.read("orders-enriched/customers", persistent_id="customers")
    # one that reads a large table's contents in key order, a chunk at a time, while its changes flow
    changes = sa.io.tables.read("orders-enriched/customers", persistent_id="customers", backfill=True,
                                chunk_rows=50_000, rows_per_second=20_000)
    # a reader that joins its stream against the latest version
    customers = sa.io.tables.lookup("orders-enriched/customers", persistent_id="customers_now")
    enriched = clicks.join(customers, "customer_id", "left")

A table is named ``pipeline/name`` (a publisher in the reader's namespace) or
``namespace/pipeline/name``. Under the operator, a reader lists the tables it reads in
the PersistentPipeline's ``spec.inputs`` and the operator tells it where they are; run
locally, pass ``location=``, the publisher's state root.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark_app.runtime.pipeline import current, table_backfill_settings
from spark_app.runtime.tables.compaction import CompactionSettings
from spark_app.runtime.tables.publish import PublishOptions


def publish(
    df: DataFrame,
    *,
    name: str,
    key: list[str],
    delete_when: str | None = None,
    max_hold_age_s: float | None = None,
    compact_every_batches: int = 10,
    compact_every_s: float = 60.0,
    compaction_margin_s: float = 60.0,
) -> None:
    """Maintains ``df`` as the shared table ``name``: one current row per ``key``, one table
    version per committed batch, exactly once (a replayed batch makes no second version).

    It lives at ``<state root>/tables/<name>``, on the pipeline's own storage (a claim or
    S3), as a Delta table with its change data feed. ``delete_when`` is a SQL condition on
    ``df``'s rows: a row for which it holds deletes its key (e.g. ``"open_orders = 0"``).

    Readers hold the oldest version they may still need; compaction (every
    ``compact_every_batches`` batches and every ``compact_every_s`` seconds, in a thread of
    its own) merges small files and deletes what no hold needs, keeping whatever is younger
    than ``compaction_margin_s``. A reader whose hold has been behind for longer than
    ``max_hold_age_s`` loses it (None: holds are kept for ever; the PersistentPipeline's
    ``spec.tables[].maxHoldAgeSeconds`` overrides it) and then refuses to start until it
    is reset.
    """
    pipeline = current()
    configured = pipeline.environment.tables.get(name)
    if configured is not None and configured.max_hold_age_seconds is not None:
        max_hold_age_s = configured.max_hold_age_seconds
    settings = CompactionSettings(every_batches=compact_every_batches, every_s=compact_every_s,
                                  margin_s=compaction_margin_s, max_hold_age_s=max_hold_age_s)
    pipeline.publish(df, name, key, PublishOptions(delete_when=delete_when, compaction=settings))


def read(table: str, *, persistent_id: str, location: str | None = None,
         max_files_per_trigger: int | None = None, with_version: bool = False, backfill: bool = False,
         chunk_rows: int | None = None, rows_per_second: float | None = None,
         max_plans_per_trigger: int | None = None) -> DataFrame:
    """A streaming DataFrame of the table's changes: its contents as of a version (every
    row with ``diff`` +1), then each later version's changes (+1 insert, -1 delete, an
    update -1 for the old row and +1 for the new). ``persistent_id`` names this input in
    the reader's state and in the table's holds: keep it stable. Its position in the
    table commits with the reader's batches, so a reader killed at any moment resumes at
    exactly the next change. ``with_version`` adds ``_commit_version``, the version of each
    change.

    By default the contents come as Delta's change data feed hands them over: the whole
    table first (in batches of ``max_files_per_trigger`` files), its changes after it.
    With ``backfill=True`` they are read as ``sa.io.delta.read`` reads a keyed table: in
    the order of the key the publisher recorded, ``chunk_rows`` at a time (default
    100,000), while the changes to the rows already read keep flowing; a batch takes at
    most ``max_plans_per_trigger`` chunks (default 1), where the backfill stands commits
    with the batch, and ``rows_per_second`` limits it (0 pauses it; the operator's
    ``spec.inputs[].backfill.rowsPerSecond`` changes it while the reader runs). The
    reader's hold follows its committed chunks. The backfill is opt-in: it keeps its
    chunks in the reader's state and reads the table with a Spark job per chunk, which a
    small table does not need, and a reader's state knows one mode (switching needs a
    reset).
    """
    settings = table_backfill_settings(backfill, chunk_rows, rows_per_second, max_plans_per_trigger,
                                       max_files_per_trigger, with_version)
    return current().add_table_changelog(table, persistent_id, location, max_files_per_trigger, with_version,
                                         settings)


def lookup(table: str, *, persistent_id: str, location: str | None = None) -> DataFrame:
    """A static DataFrame of the table's latest committed version, read anew at the start
    of each of the reader's batches and the same throughout the batch; the version a batch
    read is recorded in its commit. Join a stream against it (``stream.join(lookup, key)``).
    """
    return current().add_table_lookup(table, persistent_id, location)
