"""The operator's Prometheus metrics, as scraped."""

from __future__ import annotations

from pipeline_operator.metrics import Metrics
from prometheus_client import generate_latest


def test_restarts_checkpoint_age_phase_and_reconcile_latency() -> None:
    now = [1000.0]
    metrics = Metrics(clock=lambda: now[0])
    metrics.restarts.labels("team", "wc", "Error").inc()
    metrics.pipeline("team", "wc", "Running", 970.0)
    metrics.pipeline("team", "idle", "Suspended", None)
    with metrics.reconcile_seconds.time():
        pass
    now[0] = 1010.0
    text = generate_latest(metrics.registry).decode()
    assert 'persistent_pipeline_restarts_total{namespace="team",pipeline="wc",reason="Error"} 1.0' in text
    assert 'persistent_pipeline_seconds_since_checkpoint{namespace="team",pipeline="wc"} 40.0' in text
    assert 'pipeline="idle"' not in text.split("persistent_pipeline_phase")[0]
    assert 'persistent_pipeline_phase{namespace="team",phase="Suspended",pipeline="idle"} 1.0' in text
    assert "persistent_pipeline_reconcile_seconds_count 1.0" in text
    metrics.forget("team", "wc")
    assert 'seconds_since_checkpoint{namespace="team",pipeline="wc"}' not in generate_latest(metrics.registry).decode()


def test_kafka_lag_per_source_topic_and_partition_leaves_with_the_pipeline() -> None:
    metrics = Metrics(clock=lambda: 1000.0)
    metrics.pipeline("team", "events", "Running", 990.0, {("clicks", "raw-clicks", "0"): 12, ("clicks", "raw-clicks", "1"): 0})
    text = generate_latest(metrics.registry).decode()
    assert ('persistent_pipeline_source_lag{namespace="team",partition="0",pipeline="events",source="clicks",'
            'topic="raw-clicks"} 12.0') in text
    assert 'partition="1",pipeline="events",source="clicks",topic="raw-clicks"} 0.0' in text
    metrics.forget("team", "events")
    assert "persistent_pipeline_source_lag{" not in generate_latest(metrics.registry).decode()
