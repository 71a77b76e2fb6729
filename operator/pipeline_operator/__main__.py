"""``python -m pipeline_operator``: runs the operator with kopf, as in production.

    python -m pipeline_operator                      all namespaces, standalone
    python -m pipeline_operator -n team-a -n team-b  only these namespaces
    python -m pipeline_operator --peering=pipelines  several replicas, one active

Every flag has a PIPELINE_OPERATOR_<NAME> variable (see pipeline_operator.settings).
"""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import kopf

from pipeline_operator import handlers
from pipeline_operator.kube import Kube
from pipeline_operator.metrics import Metrics
from pipeline_operator.reconcile import Reconciler
from pipeline_operator.settings import Settings, load
from pipeline_operator.wakeups import Wakeups

_LOG_FORMATS = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


def main(argv: Sequence[str] | None = None) -> int:
    settings = load(argv)
    kopf.configure(verbose=settings.verbose, log_format=_LOG_FORMATS.get(settings.log_format, kopf.LogFormat.FULL))
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # the liveness probe, every few seconds
    logging.getLogger("kopf.objects").addFilter(_quiet_wakeups)
    metrics = Metrics()
    if settings.metrics_port:
        try:
            metrics.serve(settings.metrics_port, settings.liveness_host)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            logging.getLogger(__name__).error(
                "the metrics port %s:%d is taken by another process; on a shared host network, give each "
                "operator its own --metrics-port (the chart's operator.metrics.port), or 0 to turn metrics off",
                settings.liveness_host, settings.metrics_port)
            return 1
    assert handlers.RESOURCE  # importing the module registers the handlers with kopf
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=not settings.peering,
        peering_name=settings.peering or None,
        priority=settings.priority,
        liveness_endpoint=settings.liveness_endpoint,
        memo=memo(settings, metrics),
    )
    return 0


def _quiet_wakeups(record: logging.LogRecord) -> bool:
    """kopf logs each event handler's success; the wake-up handlers run on every pod event."""
    return not record.getMessage().startswith("Handler 'wake_on_")


def memo(settings: Settings, metrics: Metrics) -> kopf.Memo:
    """What the handlers share: the API client, one Reconciler, the wake-up flags, the API thread pool."""
    kube = Kube.connect(settings.kubeconfig, pool_size=settings.api_threads)
    return kopf.Memo(
        settings=settings,
        kube=kube,
        reconciler=Reconciler(kube, settings, metrics),
        wakeups=Wakeups(),
        executor=ThreadPoolExecutor(settings.api_threads, thread_name_prefix="api"),
    )


if __name__ == "__main__":
    sys.exit(main())
