"""How a pipeline persists its state: ``Backend`` says where, ``Config`` says what and how often.

    backend = sa.persistence.Backend.filesystem("./state/")
    config = sa.persistence.Config.simple_config(backend, snapshot_interval_ms=10_000)
    sa.run(persistence_config=config)

Metadata storage holds what does not grow with the data: the metadata log (one commit
per batch with the sources' offsets and the outputs' positions), the lease of the
running driver and the pipeline's identity. Snapshot storage holds what does: Spark's
checkpoints (offsets and operator state), snapshots of output state and iterate tables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from spark_app.contract import InjectedConfig
from spark_app.storage import FilesystemStorage, RetryingStorage, RetryPolicy, S3Location, S3Storage, Storage

DEFAULT_SNAPSHOT_INTERVAL_MS = 10_000
_DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class Backend:
    """A place that keeps persisted state: a filesystem folder or an S3 prefix."""

    kind: str
    """"filesystem" or "s3"."""
    root: str
    """An absolute folder, or s3://bucket/prefix."""
    endpoint_url: str | None = None
    """For S3-compatible servers; None means AWS."""
    region: str | None = None
    path_style: bool = False
    """Path-style S3 addressing, which most S3-compatible servers need."""

    @staticmethod
    def filesystem(path: str | os.PathLike[str]) -> Backend:
        """State in a local or mounted folder, created if absent."""
        return Backend(kind="filesystem", root=os.path.abspath(os.fspath(path)))

    @staticmethod
    def s3(
        root: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
    ) -> Backend:
        """State under ``s3://bucket/prefix``; credentials come from the standard AWS chain."""
        location = S3Location.parse(root)
        return Backend(
            kind="s3",
            root=location.uri,
            endpoint_url=endpoint_url,
            region=region,
            path_style=bool(endpoint_url) if path_style is None else path_style,
        )

    @staticmethod
    def from_uri(uri: str, *, endpoint_url: str | None = None, region: str | None = None,
                 path_style: bool | None = None) -> Backend:
        """``s3://…`` or ``s3a://…`` gives an S3 backend, anything else a folder."""
        if uri.startswith(("s3://", "s3a://")):
            return Backend.s3(uri, endpoint_url=endpoint_url, region=region, path_style=path_style)
        return Backend.filesystem(uri.removeprefix("file://"))

    def storage(self, retry: RetryPolicy = _DEFAULT_RETRY) -> Storage:
        """The storage client for this backend, retrying transient failures."""
        inner: Storage
        if self.kind == "s3":
            location = S3Location.parse(
                self.root, endpoint_url=self.endpoint_url, region=self.region, path_style=self.path_style
            )
            inner = S3Storage(location)
        else:
            inner = FilesystemStorage(self.root)
        return RetryingStorage(inner, retry)


@dataclass(frozen=True)
class Config:
    """What a persistent pipeline stores and how often."""

    metadata_storage: Backend
    snapshot_storage: Backend
    snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS
    """The longest time the stored snapshot of operator and output state may fall behind
    the last commit. Commits happen every batch regardless; between snapshots the changelog
    (RocksDB's per-batch changelog files, the output's own lines) covers the difference,
    so a restart loads the last snapshot and replays at most this much changelog."""
    epoch: int | None = None
    """A fencing token from the operator. Without one, a local run takes the next epoch
    and refuses to start while another live driver holds the lease."""
    pipeline: str = ""
    """A name for the lease holder and for messages."""
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    dead_letter_uri: str | None = None
    outage_budget_s: float = 900.0
    """How long a storage outage is ridden out (retries of each operation, restarts of a
    failing query) before the driver exits with contract.EXIT_STORAGE_UNAVAILABLE."""
    source_limits: Mapping[str, int] = field(default_factory=dict)
    """Default batch bounds of file sources: max_files_per_trigger, max_bytes_per_trigger."""
    log_retained: int = 100
    """Metadata log entries kept when it is compacted (every this many appends)."""
    index_compact_after: int = 64
    """A file source's index merges its segments into one after this many admissions."""

    def __post_init__(self) -> None:
        if self.snapshot_interval_ms <= 0:
            raise ValueError(f"snapshot_interval_ms must be positive, got {self.snapshot_interval_ms}")
        if self.outage_budget_s <= 0:
            raise ValueError(f"outage_budget_s must be positive, got {self.outage_budget_s}")

    @classmethod
    def simple_config(cls, backend: Backend, snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS,
                      **kwargs: object) -> Config:
        """Metadata and snapshots on one backend."""
        return cls(metadata_storage=backend, snapshot_storage=backend,
                   snapshot_interval_ms=snapshot_interval_ms, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """The configuration the operator injected into this driver pod (see spark_app.contract)."""
        injected = InjectedConfig.from_env(os.environ if environ is None else environ)
        s3 = {"endpoint_url": injected.s3_endpoint, "region": injected.s3_region,
              "path_style": injected.s3_path_style}
        return cls(
            metadata_storage=Backend.from_uri(injected.metadata_uri, **s3),
            snapshot_storage=Backend.from_uri(injected.snapshot_uri, **s3),
            snapshot_interval_ms=injected.snapshot_interval_ms,
            epoch=injected.epoch,
            pipeline=injected.pipeline,
            spark_conf=injected.spark_conf,
            dead_letter_uri=injected.dead_letter_uri,
            outage_budget_s=float(injected.outage_budget_seconds or 900),
            source_limits={k: v for k, v in (("max_files_per_trigger", injected.max_files_per_trigger),
                                             ("max_bytes_per_trigger", injected.max_bytes_per_trigger)) if v},
        )
