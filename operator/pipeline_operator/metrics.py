"""The operator's Prometheus metrics.

    persistent_pipeline_restarts_total{namespace,pipeline,reason}       driver relaunches
    persistent_pipeline_seconds_since_checkpoint{namespace,pipeline}    at scrape time
    persistent_pipeline_phase{namespace,pipeline,phase}                 1 for the current phase
    persistent_pipeline_source_lag{namespace,pipeline,source,topic,partition}
                                                                        Kafka records beyond the committed offsets
    persistent_pipeline_reconcile_seconds                               one pass over one pipeline
    persistent_pipeline_table_version{namespace,pipeline,table}         a published table's latest version
    persistent_pipeline_table_bytes{namespace,pipeline,table}           its size as of the last compaction
    persistent_pipeline_table_holder_lag_versions{namespace,pipeline,table,reader}
                                                                        versions a reader has not consumed
    persistent_pipeline_table_holder_lag_seconds{namespace,pipeline,table,reader}
                                                                        how long the oldest of them has existed
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from spark_app.contract import TableReport


class Metrics(Collector):
    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._pipelines: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._lag: dict[tuple[str, str], dict[tuple[str, str, str], int]] = {}
        self._tables: dict[tuple[str, str], Mapping[str, TableReport]] = {}
        self.restarts = Counter("persistent_pipeline_restarts", "Driver relaunches, by reason.",
                                ["namespace", "pipeline", "reason"], registry=self.registry)
        self.reconcile_seconds = Histogram(
            "persistent_pipeline_reconcile_seconds", "Time of one reconcile pass over one pipeline.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=self.registry)
        self.registry.register(self)

    def pipeline(self, namespace: str, name: str, phase: str, checkpoint_time: float | None,
                 lag: Mapping[tuple[str, str, str], int] | None = None) -> None:
        """``lag``: (source, topic, partition) -> records waiting, as last reported."""
        with self._lock:
            self._pipelines[(namespace, name)] = (phase, checkpoint_time)
            self._lag[(namespace, name)] = dict(lag or {})

    def tables(self, namespace: str, name: str, tables: Mapping[str, TableReport]) -> None:
        with self._lock:
            self._tables[(namespace, name)] = dict(tables)

    def forget(self, namespace: str, name: str) -> None:
        """A deleted pipeline leaves the gauges; its restart counters stay, as counters do."""
        with self._lock:
            self._pipelines.pop((namespace, name), None)
            self._lag.pop((namespace, name), None)
            self._tables.pop((namespace, name), None)

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        age = GaugeMetricFamily("persistent_pipeline_seconds_since_checkpoint",
                                "Seconds since the newest commit the driver reported.",
                                labels=["namespace", "pipeline"])
        phases = GaugeMetricFamily("persistent_pipeline_phase", "The pipeline's phase (1 for the current one).",
                                   labels=["namespace", "pipeline", "phase"])
        lag = GaugeMetricFamily("persistent_pipeline_source_lag",
                                "Records in a Kafka partition beyond the offset the pipeline committed.",
                                labels=["namespace", "pipeline", "source", "topic", "partition"])
        with self._lock:
            pipelines = dict(self._pipelines)
            lags = {k: dict(v) for k, v in self._lag.items()}
        for (namespace, name), (phase, checkpoint) in sorted(pipelines.items()):
            if checkpoint is not None:
                age.add_metric([namespace, name], max(0.0, now - checkpoint))
            phases.add_metric([namespace, name, phase], 1)
            for (source, topic, partition), waiting in sorted(lags.get((namespace, name), {}).items()):
                lag.add_metric([namespace, name, source, topic, partition], waiting)
        yield age
        yield phases
        yield lag
        yield from self._collect_tables()

    def _collect_tables(self) -> Iterator[Metric]:
        table = ["namespace", "pipeline", "table"]
        version = GaugeMetricFamily("persistent_pipeline_table_version", "A published table's latest version.",
                                    labels=table)
        size = GaugeMetricFamily("persistent_pipeline_table_bytes",
                                 "A published table's stored bytes, as of its last compaction.", labels=table)
        lag = GaugeMetricFamily("persistent_pipeline_table_holder_lag_versions",
                                "Versions of a published table a reader has not consumed yet.",
                                labels=[*table, "reader"])
        age = GaugeMetricFamily("persistent_pipeline_table_holder_lag_seconds",
                                "How long the oldest version a reader has not consumed has existed.",
                                labels=[*table, "reader"])
        with self._lock:
            published = dict(self._tables)
        for (namespace, name), tables in sorted(published.items()):
            for table_name, t in sorted(tables.items()):
                labels = [namespace, name, table_name]
                if t.version is not None:
                    version.add_metric(labels, t.version)
                if t.bytes is not None:
                    size.add_metric(labels, t.bytes)
                for h in t.holders:
                    lag.add_metric([*labels, h.reader], h.behind)
                    if h.age_s is not None:
                        age.add_metric([*labels, h.reader], h.age_s)
        yield from (version, size, lag, age)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
