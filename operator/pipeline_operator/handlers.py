"""kopf handlers: glue between kopf and the Reconciler, and the edge where the
operator's domain errors become kopf's.

* One daemon per PersistentPipeline keeps it as its spec says: reconcile, then sleep
  until a watch event wakes it or the step's own deadline (a backoff, a poll) comes.
* Events on driver pods and on spec changes only wake that daemon.
* Deletion runs the same reconcile under kopf's finalizer until the state is handled.

The Reconciler, the Wakeups and the thread pool come in ``memo`` (see __main__).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from pipeline_operator import names
from pipeline_operator.errors import ApiUnavailable, Conflict
from pipeline_operator.reconcile import Outcome

RESOURCE = (names.GROUP, names.VERSION, names.PLURAL)
CONFLICT_RETRIES = 5


def _own_pods(value: str | None, **_: Any) -> bool:
    """Driver and cleanup pods; not Spark's executor pods, which carry the pipeline label too."""
    return value in (names.ROLE_DRIVER, names.ROLE_CLEANUP)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # The status belongs to the operator's own bookkeeping (written whole, with the
    # resourceVersion); kopf keeps its progress in annotations instead.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=names.GROUP)
    settings.persistence.finalizer = f"{names.GROUP}/finalizer"


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf connects as the operator's own client does (--kubeconfig, in-cluster or $KUBECONFIG)."""
    return kopf.ConnectionInfo(**memo.kube.credentials())


@kopf.daemon(*RESOURCE, cancellation_timeout=10.0, backoff=5.0)
async def keep_running(namespace: str | None, name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo,
                       **_: Any) -> None:
    """Keeps one pipeline's driver as its spec says, until the resource is deleted."""
    key = (_namespaced(namespace), name)
    try:
        while not stopped:
            outcome = await reconcile(memo, key[0], name)
            if outcome.resource is None:
                return
            await memo.wakeups.sleep(key, _delay(memo, outcome), stopped.wait())
    finally:
        memo.wakeups.forget(key)


@kopf.on.delete(*RESOURCE)
async def stop_and_release(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Stops the driver gracefully, then keeps or deletes the state (spec.persistence.onDelete)."""
    outcome = await reconcile(memo, _namespaced(namespace), name)
    if outcome.resource is not None and not outcome.released:
        raise kopf.TemporaryError("waiting for the driver to stop and the state to be handled",
                                  delay=_delay(memo, outcome))


@kopf.on.event("", "v1", "pods", labels={names.LABEL_PIPELINE: kopf.PRESENT, names.LABEL_ROLE: _own_pods})
async def wake_on_pod_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.wakeups.wake((_namespaced(namespace), labels[names.LABEL_PIPELINE]))


@kopf.on.event(*RESOURCE)
async def wake_on_change(namespace: str | None, name: str, meta: kopf.Meta, status: kopf.Status,
                         memo: kopf.Memo, **_: Any) -> None:
    if meta.get("generation") != status.get("observedGeneration") or meta.get("deletionTimestamp"):
        memo.wakeups.wake((_namespaced(namespace), name))


async def reconcile(memo: kopf.Memo, namespace: str, name: str) -> Outcome:
    """One pass in the API thread pool; posts its Events; maps domain errors to kopf's.
    A conflict (kopf's own annotations, a user's edit) is normal: read again at once."""
    loop = asyncio.get_running_loop()
    for attempt in range(CONFLICT_RETRIES):
        try:
            outcome: Outcome = await loop.run_in_executor(memo.executor, memo.reconciler.reconcile, namespace, name)
            break
        except Conflict as conflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise kopf.TemporaryError(f"the resource keeps changing ({conflict})", delay=1.0) from None
        except ApiUnavailable as error:
            raise kopf.TemporaryError(str(error), delay=5.0) from None
    if outcome.resource is not None:
        for event in outcome.events:
            # kopf reads only the metadata of what it is given; a plain resource will do.
            resource: Any = dict(outcome.resource)
            kopf.event(resource, type=event.type, reason=event.reason, message=event.message)
    return outcome


def _namespaced(namespace: str | None) -> str:
    """PersistentPipelines and their pods are namespaced: kopf always names the namespace."""
    if namespace is None:
        raise kopf.PermanentError("a PersistentPipeline or driver pod without a namespace")
    return namespace


def _delay(memo: kopf.Memo, outcome: Outcome) -> float:
    resync: float = memo.settings.resync_seconds
    return resync if outcome.requeue_after is None else min(resync, outcome.requeue_after)
