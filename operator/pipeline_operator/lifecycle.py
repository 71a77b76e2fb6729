"""The lifecycle of a pipeline as one pure function: ``next_action(observed, tunables)``.

Given what was just read from the API server (the resource, its driver pod, the
prerequisites) and what the status remembers, it returns one step: the status to
record, at most one action, the Events to post and when to look again. The caller
records the status first (with the resource's resourceVersion, so a stale view fails
instead of acting) and then acts; every step is safe to repeat after a crash.

Invariants, each tested in tests/unit/operator/test_operator_lifecycle.py:

* A driver is launched only when the live API server says no driver pod exists, and
  with an epoch above every epoch launched or found stored before (the fencing token).
* An ended driver's outcome is counted once (``Memory.ended_uid``).
* A stop the operator asked for (suspend, spec change, restartNonce, delete) is graceful
  and never counts as a failure; a failure waits out the backoff, which a spec change cuts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pipeline_operator.memory import (
    RECENT_RESTARTS,
    Checkpoint,
    Condition,
    Failure,
    Halt,
    Memory,
    Restart,
    bounded_backfills,
    bounded_queries,
    bounded_tables,
    truncate,
)
from pipeline_operator.observe import BackfillReport, DriverPod, DriverReport, format_time
from pipeline_operator.policy import Health, RootRefused, assess, backoff_delay, state_root
from pipeline_operator.spec import PipelineSpec, RestartPolicy
from spark_app import contract

# Waiting reasons of a container that will not start by itself.
STUCK_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                           "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


@dataclass(frozen=True)
class Tunables:
    """Operator-wide timings the decision needs (from pipeline_operator.settings)."""

    resync_seconds: float = 10.0
    poll_seconds: float = 2.0
    recheck_seconds: float = 30.0
    report_stale_after_seconds: float = 60.0
    checkpoint_refresh_seconds: float = 5.0


@dataclass(frozen=True)
class Observed:
    now: float
    generation: int
    uid: str
    spec: PipelineSpec | None
    """None when the spec is invalid; ``problems`` says why."""
    memory: Memory
    driver: DriverPod | None = None
    """The driver pod read live from the API server; None means it does not exist."""
    problems: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    """Prerequisites (Secret, claim, service account) not found; looked up only when no driver runs."""
    waiting: tuple[str, ...] = ()
    """Shared tables of spec.inputs that cannot be read yet (absent, not granted, no version);
    looked up only when no driver runs."""
    root_taken_by: str = ""
    """Another PersistentPipeline whose state root is this one's, or holds or lies inside it
    (its namespace/name); looked up only when no driver runs."""
    deleting: bool = False
    cleanup_phase: str | None = None
    """The state cleanup pod's phase while deleting with onDelete: Delete (None: no such pod)."""


# ---- actions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    epoch: int
    state_root: str


@dataclass(frozen=True)
class Stop:
    """Delete a live driver pod gracefully: SIGTERM, final commit, exit within the grace period."""

    uid: str


@dataclass(frozen=True)
class Remove:
    """Delete an ended driver pod (its process is gone; nothing to wait for)."""

    uid: str


@dataclass(frozen=True)
class CreateCleanup:
    pass


@dataclass(frozen=True)
class Release:
    """Deletion is complete: the finalizer may go."""


Action = Launch | Stop | Remove | CreateCleanup | Release


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    memory: Memory
    """The new memory; its phase, message and conditions are this step's."""
    action: Action | None = None
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    """Look again after this many seconds (None: when something changes, or at the resync)."""
    restart_reason: str = ""
    """Set when this step launches a replacement driver (for the restarts metric)."""


def next_action(o: Observed, t: Tunables) -> Decision:
    if o.deleting:
        return _deleting(o, t)
    d, m = o.driver, o.memory
    if d is not None and d.ended:
        return _driver_ended(o, t)
    if d is not None and d.terminating:
        return _driver_terminating(o, t)
    if d is None and m.driver_uid:
        return _driver_vanished(o, t)
    if o.spec is None:
        return _invalid(o, t)
    if d is not None:
        return _driver_alive(o, o.spec, t)
    return _no_driver(o, o.spec, m, t)


# ---- branches --------------------------------------------------------------------------


def _deleting(o: Observed, t: Tunables) -> Decision:
    d, m, spec = o.driver, o.memory, o.spec
    if d is not None and d.ended:
        return _step(o, m, "Deleting", "removing the ended driver pod", action=Remove(d.uid), requeue=t.poll_seconds)
    if d is not None and not d.terminating:
        events = () if m.stopping else (_normal("Stopping", f"stopping driver epoch {d.epoch} gracefully: "
                                                            "the pipeline is being deleted"),)
        return _step(o, replace(m, stopping="Deleting"), "Deleting", "stopping the driver before deletion",
                     action=Stop(d.uid), events=events, requeue=t.poll_seconds)
    if d is not None:
        return _step(o, m, "Deleting", f"waiting for driver pod {d.name} to terminate", requeue=t.poll_seconds)
    root = m.state_root or (spec.persistence.base_uri if spec else "")
    releasing = spec is not None and bool(spec.table_inputs)
    if spec is None or (spec.persistence.on_delete == "Retain" and not releasing):
        return _step(o, m, "Deleting", "state retained", action=Release(), events=(_normal(
            "StateRetained", f"the state is kept at {root or 'its storage'} (onDelete: Retain); a "
            "PersistentPipeline with the same persistence settings resumes from it"),))
    base = spec.persistence.base_uri
    deleting = spec.persistence.on_delete == "Delete"
    work = ("releasing its holds on shared tables" if releasing else "") + (
        (" and " if releasing else "") + f"deleting the state at {base}" if deleting else "")
    if o.cleanup_phase is None:
        return _step(o, m, "Deleting", work, action=CreateCleanup(),
                     events=(_normal("StateCleanup", f"{work} (onDelete: {spec.persistence.on_delete})"),),
                     requeue=t.poll_seconds)
    if o.cleanup_phase == "Succeeded":
        done = ("released its holds on shared tables" if releasing else "") + (
            ("; " if releasing else "") + f"deleted the state at {base}" if deleting else
            f"; the state is kept at {root} (onDelete: Retain)")
        return _step(o, m, "Deleting", done, action=Release(),
                     events=(_normal("StateDeleted" if deleting else "HoldsReleased", done),))
    return _step(o, m, "Deleting", f"waiting for the cleanup pod ({o.cleanup_phase}) {work}; delete that pod's "
                                   "owner's finalizer only once it is done, or holds stay until the "
                                   "publisher's maxHoldAgeSeconds breaks them",
                 requeue=t.poll_seconds * 2)


def _driver_ended(o: Observed, t: Tunables) -> Decision:
    d, m = o.driver, o.memory
    assert d is not None
    stored = d.stale_epoch
    if stored is not None:  # whatever else happens, the next epoch must be above the stored one
        m = replace(m, epoch_floor=max(m.epoch_floor, stored + 1, m.epoch + 1))
    if d.uid == m.ended_uid:
        return _step(o, m, m.phase or "Restarting", m.message, action=Remove(d.uid), requeue=t.poll_seconds)
    m = replace(m, ended_uid=d.uid, driver_uid="" if m.driver_uid in ("", d.uid) else m.driver_uid,
                epoch=max(m.epoch, d.epoch))
    if m.stopping:
        return _step(o, m, "Stopping", f"driver epoch {d.epoch} stopped", action=Remove(d.uid), requeue=t.poll_seconds)
    if stored is not None:
        m = replace(m, next_launch_at=o.now, next_launch_reason="StaleEpoch")
        return _step(o, m, "Restarting", f"relaunching above the stored epoch {stored}", action=Remove(d.uid),
                     events=(_normal("StaleEpoch", f"driver epoch {d.epoch} is not above the stored epoch "
                                                   f"{stored}; relaunching at epoch {m.epoch_floor}"),),
                     requeue=0)
    policy = o.spec.restart_policy if o.spec else RestartPolicy()
    if d.exit_code == contract.EXIT_OK:
        if policy.type != "Always":
            m = replace(m, halt=Halt("Completed", o.generation, o.spec.restart_nonce if o.spec else ""))
            return _step(o, m, "Completed", f"the driver exited cleanly (restartPolicy {policy.type})",
                         action=Remove(d.uid), events=(_normal(
                             "Completed", f"driver epoch {d.epoch} exited cleanly; not relaunching "
                                          f"(restartPolicy {policy.type})"),))
        delay = backoff_delay(policy, 1, f"{o.uid}/{d.uid}")
        m = replace(m, next_launch_at=o.now + delay, next_launch_reason="Completed")
        return _step(o, m, "Restarting", f"the driver exited cleanly; relaunching in {delay:.0f}s",
                     action=Remove(d.uid), requeue=delay, events=(_normal(
                         "DriverExited", f"driver epoch {d.epoch} exited cleanly; relaunching in {delay:.0f}s "
                                         "(restartPolicy Always)"),))
    failure = Failure(reason=_failure_reason(d), exit_code=d.exit_code, message=truncate(d.message),
                      time=o.now, epoch=d.epoch, pod_uid=d.uid, generation=o.generation)
    return _failed(o, m, failure, policy, Remove(d.uid), t)


def _driver_terminating(o: Observed, t: Tunables) -> Decision:
    d, m = o.driver, o.memory
    assert d is not None
    phase = "Stopping" if m.stopping else "Restarting"
    return _step(o, m, phase, f"waiting for driver pod {d.name} (epoch {d.epoch}) to terminate",
                 requeue=t.poll_seconds)


def _driver_vanished(o: Observed, t: Tunables) -> Decision:
    """The pod of the driver we launched is gone, confirmed by a live read."""
    m = replace(o.memory, driver_uid="")
    if m.stopping or o.spec is None:
        return next_action(replace(o, memory=m), t)
    failure = Failure(reason="DriverPodDeleted", exit_code=None, generation=o.generation, time=o.now,
                      message="the driver pod disappeared (deleted, or evicted and removed) before it ended",
                      epoch=m.epoch, pod_uid=o.memory.driver_uid)
    return _failed(o, m, failure, o.spec.restart_policy, None, t)


def _invalid(o: Observed, t: Tunables) -> Decision:
    problem = truncate("; ".join(o.problems))
    m = o.memory
    events = () if m.announced_problem == problem else (_warning("InvalidSpec", truncate(problem)),)
    running = o.driver is not None
    message = f"invalid spec: {problem}" + (" (the running driver is left as it is)" if running else "")
    return _step(o, replace(m, announced_problem=problem), "Invalid", truncate(message), events=events,
                 requeue=t.recheck_seconds, ready=running)


def _driver_alive(o: Observed, spec: PipelineSpec, t: Tunables) -> Decision:
    d, m = o.driver, o.memory
    assert d is not None
    if d.uid != m.driver_uid:  # launched by a step whose follow-up read was lost: adopt it
        m = replace(m, driver_uid=d.uid, epoch=max(m.epoch, d.epoch))
    if spec.state == "suspended":
        return _stop(o, m, d, "Suspending", "the pipeline is suspended", t)
    root = state_root(spec, m, launching=False)
    if isinstance(root, RootRefused):
        events = () if m.announced_problem == root.message else (_warning("StateRootChangeRefused", root.message),)
        return _running(o, spec, replace(m, announced_problem=root.message), d, t, events,
                        progressing=Condition("Progressing", "False", "StateRootChangeRefused", root.message))
    if d.restart_nonce != spec.restart_nonce:
        return _stop(o, m, d, "RestartRequested", "spec.restartNonce changed", t)
    if d.spec_hash != spec.pod_hash or d.state_root != root.uri:
        return _stop(o, m, d, "SpecChanged", f"the spec changed (upgradeMode {spec.upgrade_mode})", t)
    stuck = _stuck(d, spec, o.now)
    if stuck is not None:
        failure = Failure(reason=stuck[0], exit_code=None, message=stuck[1], time=o.now, epoch=d.epoch,
                          pod_uid=d.uid, generation=o.generation)
        return _failed(o, replace(m, ended_uid=d.uid), failure, spec.restart_policy, Stop(d.uid), t)
    return _running(o, spec, m, d, t, ())


def _no_driver(o: Observed, spec: PipelineSpec, m: Memory, t: Tunables) -> Decision:
    """No driver pod exists (a live read said so): launch one, or say why not."""
    if spec.state == "suspended":
        m = replace(m, stopping="", next_launch_at=None, next_launch_reason="")
        events = () if o.memory.phase == "Suspended" else (_normal(
            "Suspended", f"the pipeline is suspended; its state is kept at {m.state_root or 'its storage'}"),)
        return _step(o, m, "Suspended", "suspended: set spec.state to running to resume", events=events)
    if m.halt is not None:
        if m.halt.generation == o.generation and m.halt.restart_nonce == spec.restart_nonce:
            phase = "Completed" if m.halt.reason == "Completed" else "Failed"
            return _step(o, m, phase, m.message, degraded=(m.halt.reason, m.message) if phase == "Failed" else None)
        m = replace(m, halt=None, consecutive_failures=0, next_launch_at=None, next_launch_reason="")
    root = state_root(spec, m, launching=True)
    if isinstance(root, RootRefused):
        events = () if m.announced_problem == root.message else (_warning("StateRootChangeRefused", root.message),)
        return _step(o, replace(m, announced_problem=root.message), "Invalid", root.message, events=events,
                     requeue=t.recheck_seconds)
    if o.root_taken_by:
        problem = (f"spec.persistence: the state root {spec.persistence.base_uri} overlaps the state of "
                   f"PersistentPipeline {o.root_taken_by}, created before this one; two pipelines on one state "
                   "would fence each other, and deleting one could delete the other's state: give this one a "
                   "path (filesystem.path or s3.prefix) of its own")
        events = () if m.announced_problem == problem else (_warning("StateRootConflict", problem),)
        return _step(o, replace(m, announced_problem=problem), "Invalid", problem, events=events,
                     requeue=t.recheck_seconds)
    if o.missing:
        problem = truncate("; ".join(o.missing))
        events = () if m.announced_problem == problem else (_warning("InvalidSpec", problem),)
        return _step(o, replace(m, announced_problem=problem), "Invalid", f"cannot launch the driver: {problem}",
                     events=events, requeue=t.recheck_seconds)
    if o.waiting:
        problem = truncate("; ".join(o.waiting))
        events = () if m.announced_problem == problem else (_normal("WaitingForTable", problem),)
        return _step(o, replace(m, announced_problem=problem), "Pending", f"waiting for shared tables: {problem}",
                     events=events, requeue=t.recheck_seconds,
                     progressing=Condition("Progressing", "False", "WaitingForTable", problem))
    failure = m.last_failure if m.last_failure and m.next_launch_reason == m.last_failure.reason else None
    fixed = failure is not None and failure.generation != o.generation  # a spec change cuts the backoff
    if m.next_launch_at is not None and o.now < m.next_launch_at and not fixed:
        delay = m.next_launch_at - o.now
        # The message names the moment, not the time left, so the status is not rewritten at every look.
        return _step(o, m, "Restarting", f"relaunching at {format_time(m.next_launch_at, fraction=False)} after "
                                         f"{m.next_launch_reason} (backoff)", requeue=delay, degraded=(failure.reason, failure.message) if failure else None)
    return _launch(o, spec, m, root.uri, root.stateless_generation, t)


# ---- steps shared by branches ------------------------------------------------------------


def _launch(o: Observed, spec: PipelineSpec, m: Memory, root: str, generation: int, t: Tunables) -> Decision:
    epoch = max(m.epoch + 1, m.epoch_floor)
    reason = m.next_launch_reason or m.stopping
    restart = reason not in ("", "Suspending", "StaleEpoch")
    if reason == "StaleEpoch":
        event = _normal("Relaunching", f"creating driver epoch {epoch}, above the stored epoch")
    elif o.memory.phase == "Suspended" or reason == "Suspending":
        event = _normal("Resuming", f"resuming: creating driver epoch {epoch} with its state at {root}")
    elif m.epoch == 0 or not reason:
        event = _normal("Created", f"creating driver epoch {epoch} with its state at {root}")
    else:
        event = _normal("Restarting", f"creating driver epoch {epoch} after {reason}")
    m = replace(
        m, epoch=epoch, driver_uid="", next_launch_at=None, next_launch_reason="", stopping="", epoch_floor=0,
        state_root=root, reset_nonce=spec.persistence.reset_nonce, stateless_generation=generation,
        applied_hash=spec.pod_hash, announced_problem="",
        restarts_total=m.restarts_total + (1 if restart else 0),
        recent_restarts=(m.recent_restarts + (Restart(o.now, reason, epoch),))[-RECENT_RESTARTS:]
        if restart else m.recent_restarts,
    )
    # The new pod's creation wakes the operator too; the poll only bounds the wait.
    return _step(o, m, "Starting", f"launching driver epoch {epoch}", action=Launch(epoch, root),
                 events=(event,), requeue=t.poll_seconds,
                 restart_reason="" if reason in ("", "Suspending") else reason)


def _stop(o: Observed, m: Memory, d: DriverPod, reason: str, why: str, t: Tunables) -> Decision:
    events = () if m.stopping == reason else (_normal("Stopping", f"stopping driver epoch {d.epoch} gracefully: {why}"),)
    return _step(o, replace(m, stopping=reason), "Stopping", f"stopping the driver: {why}", action=Stop(d.uid),
                 events=events, requeue=t.poll_seconds)


def _failed(o: Observed, m: Memory, failure: Failure, policy: RestartPolicy, action: Action | None,
            t: Tunables) -> Decision:
    if failure.reason == "StorageUnavailable":
        return _storage_unavailable(o, m, failure, policy, action)
    count = m.consecutive_failures + 1
    m = replace(m, last_failure=failure, consecutive_failures=count, driver_uid="")
    what = f"driver epoch {failure.epoch} ended: {failure.reason}" + (
        f" (exit code {failure.exit_code})" if failure.exit_code is not None else "") + (
        f": {truncate(failure.message, 200)}" if failure.message else "")
    halt = "Failed" if policy.type == "Never" else "BackoffExhausted" if count > policy.max_failures else ""
    if halt:
        detail = ("restartPolicy Never" if halt == "Failed"
                  else f"{count} consecutive failures exceed maxFailures {policy.max_failures}")
        m = replace(m, halt=Halt(halt, o.generation, o.spec.restart_nonce if o.spec else ""),
                    next_launch_at=None, next_launch_reason="")
        message = f"{what}; not relaunching ({detail}); change the spec or restartNonce to try again"
        return _step(o, replace(m, message=message), "Failed", truncate(message), action=action,
                     events=(_warning("DriverLost", truncate(what)), _warning(halt, truncate(message))),
                     degraded=(halt, truncate(message)))
    if failure.reason == "Misconfigured":
        # Exit 2: retrying cannot help until something changes, so wait the cap, not the ramp.
        delay = policy.backoff.max_seconds
    else:
        delay = backoff_delay(policy, count, f"{o.uid}/{failure.pod_uid}/{count}")
    m = replace(m, next_launch_at=o.now + delay, next_launch_reason=failure.reason)
    message = f"{what}; relaunching in {delay:.0f}s (failure {count} of at most {policy.max_failures})"
    return _step(o, m, "Restarting", truncate(message), action=action, requeue=delay,
                 events=(_warning("DriverLost", truncate(message)),),
                 degraded=(failure.reason, truncate(what)))


def _storage_unavailable(o: Observed, m: Memory, failure: Failure, policy: RestartPolicy,
                         action: Action | None) -> Decision:
    """The driver rode out a storage outage for its whole budget and gave up: a condition of
    the storage, not of the pipeline. Relaunched with capped backoff for as long as it
    lasts, never counted against maxFailures, so the pipeline recovers by itself."""
    outages = m.storage_outages + 1
    delay = backoff_delay(policy, outages, f"{o.uid}/{failure.pod_uid}/storage")
    m = replace(m, last_failure=failure, storage_outages=outages, driver_uid="",
                next_launch_at=o.now + delay, next_launch_reason=failure.reason)
    message = (f"driver epoch {failure.epoch} could not reach its state's storage" +
               (f": {truncate(failure.message, 200)}" if failure.message else "") +
               f"; relaunching in {delay:.0f}s (outage {outages}; not counted against maxFailures)")
    return _step(o, m, "Restarting", truncate(message), action=action, requeue=delay,
                 events=(_warning("StorageUnavailable", truncate(message)),),
                 degraded=("StorageUnavailable", truncate(message)))


def _running(o: Observed, spec: PipelineSpec, m: Memory, d: DriverPod, t: Tunables, events: tuple[Event, ...],
             progressing: Condition | None = None) -> Decision:
    report = d.report
    fresh = report is not None and report.epoch == d.epoch
    events_list = list(events)
    if fresh and report.state == "running" and m.announced_epoch < d.epoch:  # type: ignore[union-attr]
        events_list.append(_announce(d, m))
        if m.storage_outages:
            events_list.append(_normal("StorageAvailable", f"driver epoch {d.epoch} reached its state's storage "
                                                           f"again after {m.storage_outages} relaunches"))
        m = replace(m, announced_epoch=d.epoch, running_since=o.now, storage_outages=0)
    health = assess(spec, d, o.now, t.report_stale_after_seconds,
                    m.running_since if m.announced_epoch == d.epoch else None)
    # Not from a starting driver's report: until its epoch is announced, the memory holds the
    # previous epoch's last commit, which the Resumed event names.
    if (fresh and m.announced_epoch == d.epoch and report.queries  # type: ignore[union-attr]
            and _checkpoint_due(m.checkpoint, d.epoch, report, o.now, t)):  # type: ignore[arg-type]
        last = report.last_commit_ms  # type: ignore[union-attr]
        m = replace(m, checkpoint=Checkpoint(time=last / 1000 if last else None, epoch=d.epoch,
                                             queries=bounded_queries(report.queries)))  # type: ignore[union-attr]
    if fresh and report.tables:  # type: ignore[union-attr]
        m = replace(m, tables=bounded_tables(report.tables))  # type: ignore[union-attr]
    if fresh and report.backfills:  # type: ignore[union-attr]
        m, backfill_events = _follow_backfills(o, m, report.backfills, t)  # type: ignore[union-attr]
        events_list.extend(backfill_events)
    requeue = t.resync_seconds
    if d.started_at is not None and m.consecutive_failures:
        healthy_for = o.now - d.started_at
        if healthy_for >= spec.restart_policy.reset_after_seconds and not health.degraded_reason:
            m = replace(m, consecutive_failures=0)
        else:
            requeue = min(requeue, max(1.0, spec.restart_policy.reset_after_seconds - healthy_for))
    if health.degraded_reason and not m.degraded:
        events_list.append(_warning("Degraded", health.degraded_message))
    elif m.degraded and not health.degraded_reason:
        events_list.append(_normal("Recovered", f"no longer degraded ({m.degraded} cleared)"))
    m = replace(m, degraded=health.degraded_reason)
    starting = d.phase != "Running" or (fresh and report.state == "starting")  # type: ignore[union-attr]
    phase = "Starting" if starting else "Running"
    message = f"driver epoch {d.epoch} " + ("is starting" if starting else "is running")
    if m.checkpoint is not None and m.checkpoint.epoch == d.epoch:
        message += f"; last checkpoint: {m.checkpoint.describe()}"
    return _step(o, m, phase, message, events=tuple(events_list), requeue=requeue, health=health,
                 progressing=progressing)


def _follow_backfills(o: Observed, m: Memory, reported: Mapping[str, BackfillReport],
                      t: Tunables) -> tuple[Memory, list[Event]]:
    """The backfills' progress into the status: at once when one starts, pauses, resumes
    or finishes (each an Event), else at most every checkpoint_refresh_seconds (the
    driver reports after every batch; the status is not rewritten that often)."""
    events: list[Event] = []
    for pid, now in sorted(reported.items()):
        before = m.backfills.get(pid)
        if before is None and not now.finished:
            events.append(_normal("BackfillStarted", f"backfill of {pid} started: {now.rows_total} rows in "
                                                     f"the table at version {now.version}"))
        elif before is not None and now.finished and not before.finished:
            events.append(_normal("BackfillFinished", f"backfill of {pid} finished: {now.rows_read} rows read; "
                                                      "only its changes follow"))
        elif before is not None and now.paused != before.paused and not now.finished:
            events.append(_normal("BackfillPaused" if now.paused else "BackfillResumed",
                                  f"backfill of {pid} " + (f"paused at {now.percent:g}% (rowsPerSecond 0)"
                                                           if now.paused else f"resumed at {now.percent:g}%")))
    due = m.backfill_seen_at is None or o.now - m.backfill_seen_at >= t.checkpoint_refresh_seconds
    if events or due:
        m = replace(m, backfills=bounded_backfills(reported), backfill_seen_at=o.now)
    return m, events


def _checkpoint_due(known: Checkpoint | None, epoch: int, report: DriverReport, now: float, t: Tunables) -> bool:
    """A busy driver commits every batch; the status follows at most every
    checkpoint_refresh_seconds, so that it is not rewritten at every commit. Kafka lag
    moves without commits too (input arriving at a stalled pipeline): a new lag is shown
    once that long has passed since the last commit."""
    last_commit_ms = report.last_commit_ms
    if known is None or known.epoch != epoch or known.time is None or last_commit_ms is None:
        return True
    if last_commit_ms / 1000 - known.time >= t.checkpoint_refresh_seconds:
        return True
    lag_moved = {n: q.lag for n, q in report.queries.items()} != {n: q.lag for n, q in known.queries.items()}
    return lag_moved and now - known.time >= t.checkpoint_refresh_seconds


def _announce(d: DriverPod, m: Memory) -> Event:
    report = d.report
    assert report is not None
    if not report.stored_epoch:
        return _normal("Started", f"driver epoch {d.epoch} started with empty state")
    # The previous driver's last reported commit is what this one resumes from (its own first
    # report may already include a newer batch).
    source = m.checkpoint if m.checkpoint is not None and m.checkpoint.epoch < d.epoch else None
    where = source.describe() if source else Checkpoint(None, d.epoch, report.queries).describe()
    return _normal("Resumed", f"driver epoch {d.epoch} resumed the state of epoch {report.stored_epoch} "
                              f"from checkpoint: {where} (the last the operator saw)")


def _stuck(d: DriverPod, spec: PipelineSpec, now: float) -> tuple[str, str] | None:
    age = now - d.created_at
    if d.waiting_reason in STUCK_REASONS and age >= spec.driver.stuck_after_seconds:
        return d.waiting_reason or "", f"the driver container has been waiting for {age:.0f}s ({d.waiting_reason})"
    if d.started_at is None and d.phase == "Pending" and age >= spec.driver.startup_timeout_seconds:
        return "StartupTimeout", f"the driver pod has not started after {age:.0f}s"
    return None


def _failure_reason(d: DriverPod) -> str:
    if d.exit_code == contract.EXIT_MISCONFIGURED:
        return "Misconfigured"
    if d.exit_code == contract.EXIT_FENCED:
        return "Fenced"
    if d.exit_code == contract.EXIT_ALREADY_RUNNING:
        return "AlreadyRunning"
    if d.exit_code == contract.EXIT_STORAGE_UNAVAILABLE:
        return "StorageUnavailable"
    if d.reason in ("OOMKilled", "Evicted", "ContainerStatusUnknown", "DeadlineExceeded"):
        return d.reason
    if d.exit_code is not None and d.exit_code > 128:
        return f"Killed(signal {d.exit_code - 128})"
    return "Error"


# ---- decisions and conditions ---------------------------------------------------------------

_PHASES: dict[str, tuple[tuple[str, str], tuple[str, str], bool]] = {
    # phase: (Ready status, reason), (Progressing status, reason), Degraded by default
    "Pending": (("False", "Launching"), ("True", "Launching"), False),
    "Starting": (("False", "DriverStarting"), ("True", "DriverStarting"), False),
    "Running": (("True", "DriverRunning"), ("False", "Running"), False),
    "Restarting": (("False", "DriverNotRunning"), ("True", "Restarting"), False),
    "Stopping": (("False", "Stopping"), ("True", "Stopping"), False),
    "Suspended": (("False", "Suspended"), ("False", "Suspended"), False),
    "Completed": (("False", "Completed"), ("False", "Completed"), False),
    "Failed": (("False", "Failed"), ("False", "Failed"), True),
    "Invalid": (("False", "InvalidSpec"), ("False", "InvalidSpec"), True),
    "Deleting": (("False", "Deleting"), ("True", "Deleting"), False),
}


def _step(o: Observed, m: Memory, phase: str, message: str, *, action: Action | None = None,
          events: tuple[Event, ...] = (), requeue: float | None = None, restart_reason: str = "",
          degraded: tuple[str, str] | None = None, health: Health | None = None, ready: bool | None = None,
          progressing: Condition | None = None) -> Decision:
    (ready_status, ready_reason), (prog_status, prog_reason), degraded_default = _PHASES[phase]
    if ready is not None:
        ready_status, ready_reason = ("True", "DriverRunning") if ready else ("False", ready_reason)
    if health is not None and health.degraded_reason:
        degraded = (health.degraded_reason, health.degraded_message)
    if degraded is None and degraded_default:
        degraded = (prog_reason, message)
    conditions = (
        Condition("Ready", ready_status, ready_reason, message),
        progressing or Condition("Progressing", prog_status, prog_reason, message),
        Condition("Degraded", "True", degraded[0], degraded[1]) if degraded
        else Condition("Degraded", "False", "Healthy", ""),
        Condition("CheckpointHealthy", health.checkpoint_status, health.checkpoint_reason, health.checkpoint_message)
        if health else Condition("CheckpointHealthy", "Unknown", "DriverNotRunning", "no driver is running"),
        Condition("StorageUnavailable", "True", "DriverCouldNotReachStorage",
                  f"{m.storage_outages} drivers in a row ended because the state's storage was unreachable")
        if m.storage_outages else Condition("StorageUnavailable", "False", "Reachable", ""),
    )
    memory = replace(m, phase=phase, message=truncate(message), conditions=conditions)
    return Decision(memory=memory, action=action, events=events, requeue_after=requeue, restart_reason=restart_reason)


def _normal(reason: str, message: str) -> Event:
    return Event("Normal", reason, message)


def _warning(reason: str, message: str) -> Event:
    return Event("Warning", reason, message)
