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
from dataclasses import asdict, dataclass, field
from typing import Any

from spark_app.contract import InjectedConfig, S3Keys, S3Options
from spark_app.storage import FilesystemStorage, RetryingStorage, RetryPolicy, S3Location, S3Storage, Storage
from spark_app.storage.s3 import client_with_keys

DEFAULT_SNAPSHOT_INTERVAL_MS = 10_000
_DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class Backend:
    """A place that keeps persisted state: a filesystem folder or an S3 prefix."""

    kind: str
    """"filesystem" or "s3"."""
    root: str
    """An absolute folder, or s3://bucket/prefix."""
    s3_options: S3Options = field(default_factory=S3Options)
    """How S3 is reached (for an S3 backend)."""

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
        options: S3Options | None = None,
    ) -> Backend:
        """State under ``s3://bucket/prefix``; credentials come from the standard AWS chain.
        ``path_style`` defaults to on with an ``endpoint_url`` (S3-compatible servers)."""
        location = S3Location.parse(root)
        return Backend(kind="s3", root=location.uri,
                       s3_options=options or S3Options(endpoint=endpoint_url, region=region, path_style=path_style))

    @staticmethod
    def from_uri(uri: str, *, endpoint_url: str | None = None, region: str | None = None,
                 path_style: bool | None = None, options: S3Options | None = None) -> Backend:
        """``s3://…`` or ``s3a://…`` gives an S3 backend, anything else a folder."""
        if uri.startswith(("s3://", "s3a://")):
            return Backend.s3(uri, endpoint_url=endpoint_url, region=region, path_style=path_style, options=options)
        return Backend.filesystem(uri.removeprefix("file://"))

    def child(self, path: str) -> Backend:
        """The backend of a folder below this one's root."""
        return Backend(kind=self.kind, root=f"{self.root.rstrip('/')}/{path.strip('/')}", s3_options=self.s3_options)

    @property
    def endpoint_url(self) -> str | None:
        return self.s3_options.endpoint

    @property
    def region(self) -> str | None:
        return self.s3_options.region

    @property
    def path_style(self) -> bool:
        return self.s3_options.path_style_addressing

    def storage(self, retry: RetryPolicy = _DEFAULT_RETRY, keys: S3Keys | None = None) -> Storage:
        """The storage client for this backend, retrying transient failures. ``keys``: S3
        credentials of its own (a shared table's), instead of the standard AWS chain."""
        inner: Storage
        if self.kind == "s3":
            location = S3Location.parse(self.root, endpoint_url=self.endpoint_url, region=self.region,
                                        path_style=self.path_style)
            client = None if keys is None else client_with_keys(
                location, keys.access_key_id, keys.secret_access_key, keys.session_token)
            inner = S3Storage(location, client=client)
        else:
            inner = FilesystemStorage(self.root)
        return RetryingStorage(inner, retry)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Backend:
        return cls(kind=value["kind"], root=value["root"], s3_options=S3Options(**value.get("s3_options", {})))


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
    lease_ttl_s: float = 30.0
    """How long the driver's lease stays live without a renewal; it is renewed every
    sixth of this. Until it lapses, a second local driver on the same state refuses to
    start (unless the holder's process is visibly gone). Longer rides out longer pauses
    of a live driver (a frozen node, a long GC); shorter lets a successor on another host
    take over sooner after a crash."""

    def __post_init__(self) -> None:
        if self.snapshot_interval_ms <= 0:
            raise ValueError(f"snapshot_interval_ms must be positive, got {self.snapshot_interval_ms}")
        if self.outage_budget_s <= 0:
            raise ValueError(f"outage_budget_s must be positive, got {self.outage_budget_s}")
        if self.lease_ttl_s < 1:
            raise ValueError(f"lease_ttl_s must be at least 1 second, got {self.lease_ttl_s}")

    @classmethod
    def simple_config(cls, backend: Backend, snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS,
                      **kwargs: object) -> Config:
        """Metadata and snapshots on one backend."""
        return cls(metadata_storage=backend, snapshot_storage=backend,
                   snapshot_interval_ms=snapshot_interval_ms, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """The configuration the operator injected into this driver pod (see spark_app.contract)."""
        return cls.injected(InjectedConfig.from_env(os.environ if environ is None else environ))

    @classmethod
    def injected(cls, injected: InjectedConfig) -> Config:
        """The configuration the operator injected, as parsed by spark_app.contract."""
        return cls(
            metadata_storage=Backend.from_uri(injected.metadata_uri, options=injected.s3),
            snapshot_storage=Backend.from_uri(injected.snapshot_uri, options=injected.s3),
            snapshot_interval_ms=injected.snapshot_interval_ms,
            epoch=injected.epoch,
            pipeline=injected.pipeline,
            spark_conf=injected.spark_conf,
            dead_letter_uri=injected.dead_letter_uri,
            outage_budget_s=float(injected.outage_budget_seconds or 900),
            source_limits={k: v for k, v in (("max_files_per_trigger", injected.max_files_per_trigger),
                                             ("max_bytes_per_trigger", injected.max_bytes_per_trigger)) if v},
        )
