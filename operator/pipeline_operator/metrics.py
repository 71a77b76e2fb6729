"""The operator's Prometheus metrics.

    persistent_pipeline_restarts_total{namespace,pipeline,reason}       driver relaunches
    persistent_pipeline_seconds_since_checkpoint{namespace,pipeline}    at scrape time
    persistent_pipeline_phase{namespace,pipeline,phase}                 1 for the current phase
    persistent_pipeline_source_lag{namespace,pipeline,source,topic,partition}
                                                                        Kafka records beyond the committed offsets
    persistent_pipeline_reconcile_seconds                               one pass over one pipeline
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class Metrics(Collector):
    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._pipelines: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._lag: dict[tuple[str, str], dict[tuple[str, str, str], int]] = {}
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

    def forget(self, namespace: str, name: str) -> None:
        """A deleted pipeline leaves the gauges; its restart counters stay, as counters do."""
        with self._lock:
            self._pipelines.pop((namespace, name), None)
            self._lag.pop((namespace, name), None)

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

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
