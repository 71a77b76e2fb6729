"""One reconcile pass over one pipeline: read live, decide (lifecycle.next_action),
record the decision in the status, then act. Blocking; handlers run it in threads.

Recording before acting, conditional on the resourceVersion read, is what makes a pass
safe to interrupt and to repeat: a crash between the two leaves a status that says what
was about to happen, and the next pass (of this or another replica) sees whether it did.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pipeline_operator import builders, names, observe, policy, status
from pipeline_operator.errors import InvalidSpec, Refused
from pipeline_operator.kube import Kube
from pipeline_operator.lifecycle import (
    CreateCleanup,
    Decision,
    Event,
    Launch,
    Observed,
    Release,
    Remove,
    Stop,
    next_action,
)
from pipeline_operator.memory import Memory
from pipeline_operator.metrics import Metrics
from pipeline_operator.settings import Settings
from pipeline_operator.spec import PipelineSpec, parse_spec, prerequisites
from spark_app import contract


@dataclass(frozen=True)
class Outcome:
    resource: Mapping[str, Any] | None
    """The resource as read (for posting Events); None once it is gone."""
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    released: bool = False
    """While deleting: the state is taken care of and the finalizer may go."""


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings, metrics: Metrics,
                 clock: Callable[[], float] = time.time) -> None:
        self._kube = kube
        self._tunables = settings.tunables()
        self._allow_privileged = settings.allow_privileged_pod_templates
        self._metrics = metrics
        self._clock = clock

    def reconcile(self, namespace: str, name: str) -> Outcome:
        """Raises ``Conflict`` when the resource changed under it (retry at once) and
        ``ApiUnavailable`` when the API server failed (retry later)."""
        with self._metrics.reconcile_seconds.time():
            resource = self._kube.get_pipeline(namespace, name)
            if resource is None:
                self._metrics.forget(namespace, name)
                return Outcome(resource=None)
            observed, spec, tables = self._observe(resource)
            decision = next_action(observed, self._tunables)
            self._record(resource, decision)
            self._act(resource, spec, decision, tables)
            events = decision.events + self._deliver_live_settings(namespace, spec, observed.driver)
        memory = decision.memory
        checkpoint = memory.checkpoint
        self._metrics.pipeline(namespace, name, memory.phase, checkpoint.time if checkpoint else None,
                               checkpoint.lag() if checkpoint else None)
        self._metrics.tables(namespace, name, memory.tables)
        if decision.restart_reason:
            self._metrics.restarts.labels(namespace, name, decision.restart_reason).inc()
        return Outcome(resource=resource, events=events, requeue_after=decision.requeue_after,
                       released=isinstance(decision.action, Release))

    def _observe(self, resource: Mapping[str, Any]
                 ) -> tuple[Observed, PipelineSpec | None, tuple[contract.TableInput, ...]]:
        meta = resource["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        deleting = bool(meta.get("deletionTimestamp"))
        spec: PipelineSpec | None = None
        problems: tuple[str, ...] = ()
        try:
            spec = parse_spec(resource.get("spec") or {}, namespace=namespace, name=name,
                              allow_privileged=self._allow_privileged)
        except InvalidSpec as invalid:
            problems = tuple(str(p) for p in invalid.problems)
        pod = self._kube.get_pod(namespace, names.driver_pod_name(name))
        driver = observe.driver_pod(pod) if pod is not None else None
        if driver is not None and driver.ended and driver.exit_code and not driver.message:
            # What FallbackToLogsOnError gives, for a kubelet that does not honour it: the
            # log's end says why (and, for exit code 3, which epoch is stored).
            tail = self._kube.log_tail(namespace, driver.name, names.DRIVER_CONTAINER)
            driver = replace(driver, message=contract.scrub_credentials(tail.strip()))
        memory = status.read_memory(resource.get("status"))
        missing: tuple[str, ...] = ()
        root_taken_by = ""
        tables: tuple[contract.TableInput, ...] = ()
        waiting: tuple[str, ...] = ()
        if spec is not None and driver is None and spec.state == "running" and not deleting:
            inputs = self._resolve_inputs(spec)
            tables, waiting = inputs.tables, inputs.waiting
            missing = self._kube.missing(namespace, prerequisites(spec)) or (
                () if waiting else self._refusal(resource, spec, memory, tables))
            others = [p for p in self._kube.list_pipelines(namespace) if p["metadata"].get("uid") != meta["uid"]]
            root_taken_by = policy.root_taken_by(spec, meta.get("creationTimestamp") or "", others)
        cleanup = None
        if deleting and spec is not None and (spec.persistence.on_delete == "Delete" or spec.table_inputs):
            cleanup = observe.pod_phase(self._kube.get_pod(namespace, names.cleanup_pod_name(name)))
        observed = Observed(
            now=self._clock(), generation=int(meta.get("generation") or 0), uid=meta["uid"], spec=spec,
            memory=memory, driver=driver, problems=problems,
            missing=missing, waiting=waiting, root_taken_by=root_taken_by, deleting=deleting, cleanup_phase=cleanup,
        )
        return observed, spec, tables

    def _deliver_live_settings(self, namespace: str, spec: PipelineSpec | None,
                               driver: observe.DriverPod | None) -> tuple[Event, ...]:
        """The spec's live settings (a backfill's rate) onto the running driver's pod, whose
        kubelet rewrites the file the driver reads: changed without a restart, so they are
        not in the pod hash and no decision is taken on them."""
        if spec is None or driver is None or driver.ended or driver.terminating:
            return ()
        wanted = spec.live_settings.to_json()
        if driver.live_settings == wanted:
            return ()
        if not self._kube.annotate_pod(namespace, driver.name, driver.uid, {contract.LIVE_SETTINGS_ANNOTATION: wanted}):
            return ()
        rates = ", ".join(f"{pid} " + ("unlimited" if rate is None else "paused" if rate == 0 else f"{rate:g} rows/s")
                          for pid, rate in sorted(spec.live_settings.backfill_rates.items()))
        return (Event("Normal", "LiveSettingsChanged",
                      f"driver epoch {driver.epoch} now reads its backfills at: {rates or 'the rates its code sets'}"),)

    def _resolve_inputs(self, spec: PipelineSpec) -> policy.ResolvedInputs:
        """The shared tables the spec reads: each publisher read as it is now, so that a
        reader waiting for a table starts by itself once the table appears."""
        if not spec.table_inputs:
            return policy.ResolvedInputs()
        publishers: dict[tuple[str, str], Mapping[str, Any] | str | None] = {}
        for key in {(ref.namespace, ref.pipeline) for _, ref in spec.table_inputs}:
            try:
                publishers[key] = self._kube.get_pipeline(*key)
            except Refused as refused:
                # An operator that serves listed namespaces only: say so on the reader.
                publishers[key] = (f"the operator may not read PersistentPipelines in namespace {key[0]} "
                                   f"({refused.status})")
        return policy.resolve_inputs(spec, publishers)

    def _refusal(self, resource: Mapping[str, Any], spec: PipelineSpec, memory: Memory,
                 tables: tuple[contract.TableInput, ...]) -> tuple[str, ...]:
        """Why the API server would refuse the next driver pod (Pod Security, an admission
        policy, a quota), asked before the launch is recorded: a refused pod is then
        reported on the pipeline, like a missing claim, instead of failing each launch."""
        pod = builders.driver_pod(spec, epoch=memory.epoch + 1, state_root=memory.state_root or spec.persistence.base_uri,
                                  owner=builders.owner_reference(resource), tables=tables)
        refusal = self._kube.refusal(pod)
        return (contract.scrub_credentials(refusal),) if refusal else ()

    def _record(self, resource: Mapping[str, Any], decision: Decision) -> None:
        meta = resource["metadata"]
        previous = resource.get("status") or {}
        rendered = status.render(decision.memory, name=meta["name"], generation=int(meta.get("generation") or 0),
                                 previous=previous, now=self._clock())
        if rendered != previous:
            self._kube.replace_status(resource, rendered)

    def _act(self, resource: Mapping[str, Any], spec: PipelineSpec | None, decision: Decision,
             tables: tuple[contract.TableInput, ...]) -> None:
        action = decision.action
        meta = resource["metadata"]
        namespace, pod_name = meta["namespace"], names.driver_pod_name(meta["name"])
        if isinstance(action, Launch):
            assert spec is not None
            owner = builders.owner_reference(resource)
            self._kube.ensure_service(builders.driver_service(spec, owner=owner))
            self._kube.create_pod(builders.driver_pod(spec, epoch=action.epoch, state_root=action.state_root,
                                                      owner=owner, tables=tables))
        elif isinstance(action, Stop):
            self._kube.delete_pod(namespace, pod_name, action.uid)
        elif isinstance(action, Remove):
            # The pod has ended: no process to signal, so no grace period to wait out.
            self._kube.delete_pod(namespace, pod_name, action.uid, grace_seconds=0)
        elif isinstance(action, CreateCleanup):
            assert spec is not None
            # The holds to release are on the tables its publishers still have; one gone has none.
            tables = self._resolve_inputs(spec).tables
            self._kube.create_pod(builders.cleanup_pod(spec, owner=builders.owner_reference(resource), tables=tables))
