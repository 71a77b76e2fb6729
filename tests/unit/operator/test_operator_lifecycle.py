"""next_action, transition by transition: what each observation leads to (action, phase,
memory, Events), without a cluster. The property tests at the end drive it against a
simulated world and check the invariants listed in pipeline_operator.lifecycle."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pipeline_operator.lifecycle import (
    CreateCleanup,
    Decision,
    Launch,
    Release,
    Remove,
    Stop,
    next_action,
)
from pipeline_operator.memory import MAX_LAG_PARTITIONS, MAX_MESSAGE_CHARS, Checkpoint, Failure, Halt, Memory
from pipeline_operator.observe import BackfillReport, QueryReport
from ppl_factories import NOW, TUNABLES, driver, ended, launched, observed, report, root_of, spec

from spark_app import contract


def decide(*args, **kwargs) -> Decision:  # type: ignore[no-untyped-def]
    return next_action(observed(*args, **kwargs), TUNABLES)


def reasons(decision: Decision) -> list[str]:
    return [e.reason for e in decision.events]


def condition(decision: Decision, kind: str) -> tuple[str, str]:
    found = next(c for c in decision.memory.conditions if c.type == kind)
    return found.status, found.reason


S = spec()


# ---- launching ---------------------------------------------------------------------------


def test_a_new_pipeline_launches_epoch_1_with_its_state_root() -> None:
    d = decide(S)
    assert d.action == Launch(epoch=1, state_root="pvc://state/team/wc")
    assert d.memory.phase == "Starting" and d.memory.epoch == 1
    assert d.memory.state_root == "pvc://state/team/wc" and d.memory.applied_hash == S.pod_hash
    assert reasons(d) == ["Created"] and d.restart_reason == "" and d.memory.restarts_total == 0
    assert condition(d, "Progressing") == ("True", "DriverStarting")


def test_a_missing_prerequisite_creates_no_pod_and_is_announced_once() -> None:
    missing = ("spec.persistence.filesystem.claimName: PersistentVolumeClaim team/state does not exist",)
    d = decide(S, missing=missing)
    assert d.action is None and d.memory.phase == "Invalid" and reasons(d) == ["InvalidSpec"]
    assert condition(d, "Degraded") == ("True", "InvalidSpec") and d.requeue_after == TUNABLES.recheck_seconds
    again = decide(S, d.memory, missing=missing)
    assert again.action is None and again.events == ()
    fixed = decide(S, again.memory)
    assert isinstance(fixed.action, Launch) and reasons(fixed) == ["Created"]


def test_an_invalid_spec_creates_no_pod_and_leaves_a_running_driver_alone() -> None:
    problems = ("spec.persistence.s3.bucket: must not be empty",)
    d = decide(None, problems=problems)
    assert d.action is None and d.memory.phase == "Invalid" and reasons(d) == ["InvalidSpec"]
    assert condition(d, "Ready") == ("False", "InvalidSpec")
    running = decide(None, launched(S, driver_uid="pod-1"), problems=problems, driver=driver(S))
    assert running.action is None and condition(running, "Ready") == ("True", "DriverRunning")


def test_a_long_list_of_problems_is_recorded_bounded_and_still_announced_once() -> None:
    problems = tuple(f"spec.driver.env[{i}].name: SPARK_APP_EPOCH is set by the operator" for i in range(400))
    d = decide(None, problems=problems)
    assert reasons(d) == ["InvalidSpec"] and len(d.memory.announced_problem) <= MAX_MESSAGE_CHARS
    assert decide(None, d.memory, problems=problems).events == ()
    missing = tuple(f"spec.persistence.filesystem.claimName: PersistentVolumeClaim team/c{i} does not exist"
                    for i in range(400))
    d = decide(S, missing=missing)
    assert reasons(d) == ["InvalidSpec"] and len(d.memory.announced_problem) <= MAX_MESSAGE_CHARS
    assert decide(S, d.memory, missing=missing).events == ()


# ---- a driver running --------------------------------------------------------------------------


def test_a_new_driver_pod_is_adopted_and_starting() -> None:
    d = decide(S, launched(S), driver=driver(S, phase="Pending"))
    assert d.action is None and d.memory.driver_uid == "pod-1" and d.memory.phase == "Starting"


def test_a_pod_of_a_launch_whose_status_write_was_lost_is_adopted_with_its_epoch() -> None:
    d = decide(S, Memory(epoch=3), driver=driver(S, epoch=4, uid="pod-4"))
    assert d.action is None and d.memory.epoch == 4 and d.memory.driver_uid == "pod-4"


def test_running_without_a_report_is_ready_but_checkpoint_health_is_unknown() -> None:
    d = decide(S, launched(S, driver_uid="pod-1"), driver=driver(S))
    assert d.memory.phase == "Running" and condition(d, "Ready") == ("True", "DriverRunning")
    assert condition(d, "CheckpointHealthy") == ("Unknown", "NoDriverReport")
    assert d.requeue_after == TUNABLES.resync_seconds


def test_a_starting_report_keeps_the_phase_starting() -> None:
    d = decide(S, launched(S, driver_uid="pod-1"), driver=driver(S, report=report(state="starting")))
    assert d.memory.phase == "Starting" and d.events == ()


def test_the_first_running_report_announces_empty_state_once() -> None:
    d = decide(S, launched(S, driver_uid="pod-1"), driver=driver(S, report=report()))
    assert reasons(d) == ["Started"] and d.memory.announced_epoch == 1
    assert decide(S, d.memory, driver=driver(S, report=report())).events == ()


def test_a_resumed_driver_announces_the_checkpoint_it_resumes_from() -> None:
    before = Checkpoint(time=NOW - 100, epoch=1, queries={"counts": QueryReport(batch=7)})
    memory = launched(S, epoch=2, driver_uid="pod-2", checkpoint=before, announced_epoch=1)
    now = report(2, stored_epoch=1, counts=QueryReport(batch=8, commit_time_ms=int(NOW * 1000)))
    d = decide(S, memory, driver=driver(S, epoch=2, uid="pod-2", report=now))
    assert reasons(d) == ["Resumed"]
    assert "resumed the state of epoch 1 from checkpoint: counts batch 7" in d.events[0].message
    assert d.memory.checkpoint == Checkpoint(time=NOW, epoch=2, queries={"counts": QueryReport(
        batch=8, commit_time_ms=int(NOW * 1000))})


def test_a_resumed_drivers_starting_report_does_not_replace_the_checkpoint_it_resumes_from() -> None:
    """A driver reports while it starts (its queries at the batches it restored), then runs
    and commits; the Resumed event must still name the previous epoch's last commit. It
    named the new driver's first batch once the starting report had replaced the memory
    (the e2e story, with drivers quick enough to commit before the operator saw them run)."""
    before = Checkpoint(time=NOW - 100, epoch=1, queries={"counts": QueryReport(batch=7)})
    memory = launched(S, epoch=2, driver_uid="pod-2", checkpoint=before, announced_epoch=1)
    starting = report(2, stored_epoch=1, state="starting", counts=QueryReport(batch=7))
    d = decide(S, memory, driver=driver(S, epoch=2, uid="pod-2", report=starting))
    assert d.events == () and d.memory.checkpoint == before
    running = report(2, stored_epoch=1, counts=QueryReport(batch=8, commit_time_ms=int(NOW * 1000)))
    d = decide(S, d.memory, driver=driver(S, epoch=2, uid="pod-2", report=running))
    assert reasons(d) == ["Resumed"]
    assert "resumed the state of epoch 1 from checkpoint: counts batch 7" in d.events[0].message


def test_the_checkpoint_in_memory_is_bounded() -> None:
    many = {f"q{i:02d}": QueryReport(batch=i, offsets={f"s{j:02d}": {"files": j} for j in range(50)},
                                      iterate={"blob": "x" * 5000}) for i in range(30)}
    d = decide(S, launched(S, driver_uid="pod-1", announced_epoch=1), driver=driver(S, report=report(**many)))
    checkpoint = d.memory.checkpoint
    assert checkpoint is not None and len(checkpoint.queries) == 10
    assert all(len(q.offsets) == 20 for q in checkpoint.queries.values())
    assert all(set(q.iterate) == {"truncated"} for q in checkpoint.queries.values())


def test_the_kafka_lag_a_driver_reports_reaches_the_checkpoint_bounded() -> None:
    """The LAG column, status.checkpoint.queries[].lag and the lag metric all read the
    checkpoint in memory: bounding the report once dropped the lag, so none ever showed it
    (seen in make demo). A topic of many partitions keeps its most-lagging ones."""
    lag = {"clicks": {"raw": {"0": 5, "1": 0}}}
    committed = QueryReport(batch=3, commit_time_ms=int(NOW * 1000), lag=lag)
    d = decide(S, launched(S, driver_uid="pod-1", announced_epoch=1), driver=driver(S, report=report(q=committed)))
    assert d.memory.checkpoint is not None and d.memory.checkpoint.queries["q"].lag == lag
    assert d.memory.checkpoint.lag() == {("clicks", "raw", "0"): 5, ("clicks", "raw", "1"): 0}

    wide = {"clicks": {"raw": {str(p): p for p in range(MAX_LAG_PARTITIONS + 50)}}}
    many = decide(S, launched(S, driver_uid="pod-1", announced_epoch=1),
                  driver=driver(S, report=report(q=replace(committed, lag=wide)))).memory.checkpoint
    assert many is not None
    kept = many.queries["q"].lag["clicks"]["raw"]
    assert len(kept) == MAX_LAG_PARTITIONS and min(kept.values()) == 50


def test_the_checkpoint_follows_a_busy_driver_at_most_every_refresh_interval() -> None:
    memory = launched(S, driver_uid="pod-1", announced_epoch=1)
    first = decide(S, memory, driver=driver(S, report=report(q=QueryReport(batch=1, commit_time_ms=int(NOW * 1000)))))
    soon = QueryReport(batch=2, commit_time_ms=int((NOW + 2) * 1000))
    assert decide(S, first.memory, driver=driver(S, report=report(q=soon))).memory.checkpoint == first.memory.checkpoint
    later = QueryReport(batch=7, commit_time_ms=int((NOW + TUNABLES.checkpoint_refresh_seconds) * 1000))
    updated = decide(S, first.memory, driver=driver(S, report=report(q=later))).memory.checkpoint
    assert updated is not None and updated.queries["q"].batch == 7


def test_waiting_out_a_backoff_does_not_change_the_status_at_every_look() -> None:
    failed = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, 1)).memory
    assert decide(S, failed, now=NOW + 1).memory == decide(S, failed, now=NOW + 3).memory


def test_no_commit_while_input_waits_for_longer_than_the_window_is_degraded_then_recovers() -> None:
    window = S.persistence.degraded_after_seconds
    late = QueryReport(batch=3, commit_time_ms=int((NOW - window - 1) * 1000), backlog=True)
    memory = launched(S, driver_uid="pod-1", announced_epoch=1, running_since=NOW - 3600)
    d = decide(S, memory, driver=driver(S, report=report(counts=late)))
    assert condition(d, "Degraded") == ("True", "NoRecentCommit") and reasons(d) == ["Degraded"]
    assert condition(d, "CheckpointHealthy") == ("False", "NoRecentCommit") and d.memory.phase == "Running"
    assert decide(S, d.memory, driver=driver(S, report=report(counts=late))).events == ()
    caught_up = QueryReport(batch=4, commit_time_ms=int(NOW * 1000), backlog=True)
    healed = decide(S, d.memory, driver=driver(S, report=report(counts=caught_up)))
    assert condition(healed, "Degraded") == ("False", "Healthy") and reasons(healed) == ["Recovered"]
    assert condition(healed, "CheckpointHealthy") == ("True", "Committing")


def test_the_window_starts_when_a_restarted_driver_runs_not_at_the_last_commit() -> None:
    """Catching up after a restart is no stall, even if the last commit is old."""
    old_commit = QueryReport(batch=3, commit_time_ms=int((NOW - 3600) * 1000), backlog=True)
    memory = launched(S, epoch=2, driver_uid="pod-2", announced_epoch=1)
    first = decide(S, memory, driver=driver(S, epoch=2, uid="pod-2", report=report(2, stored_epoch=1, q=old_commit)))
    assert first.memory.running_since == NOW and condition(first, "Degraded") == ("False", "Healthy")
    window = S.persistence.degraded_after_seconds
    later = decide(S, first.memory, now=NOW + window + 1,
                   driver=driver(S, epoch=2, uid="pod-2", report=report(2, stored_epoch=1, q=old_commit)))
    assert condition(later, "Degraded") == ("True", "NoRecentCommit")


def test_an_idle_stream_that_commits_nothing_is_healthy() -> None:
    old = QueryReport(batch=3, commit_time_ms=int((NOW - 3600) * 1000))
    d = decide(S, launched(S, driver_uid="pod-1", announced_epoch=1),
               driver=driver(S, report=report(counts=old, reported_at=NOW - 3600)))
    assert condition(d, "Degraded") == ("False", "Healthy") and condition(d, "CheckpointHealthy") == ("True", "Idle")


def test_a_report_gone_stale_while_busy_is_degraded() -> None:
    busy = QueryReport(batch=3, commit_time_ms=int((NOW - 5) * 1000), active=True)
    d = decide(S, launched(S, driver_uid="pod-1", announced_epoch=1),
               driver=driver(S, report=report(counts=busy, reported_at=NOW - 120)))
    assert condition(d, "Degraded") == ("True", "DriverReportStale")


def test_a_report_of_the_previous_epoch_is_not_trusted() -> None:
    d = decide(S, launched(S, epoch=2, driver_uid="pod-2"), driver=driver(S, epoch=2, uid="pod-2", report=report(1)))
    assert condition(d, "CheckpointHealthy") == ("Unknown", "NoDriverReport") and d.events == ()


def test_a_healthy_period_clears_the_consecutive_failures() -> None:
    memory = launched(S, driver_uid="pod-1", consecutive_failures=3)
    short = decide(S, memory, driver=driver(S, started_at=NOW - 100))
    assert short.memory.consecutive_failures == 3 and short.requeue_after == TUNABLES.resync_seconds
    due = decide(S, memory, driver=driver(S, started_at=NOW - S.restart_policy.reset_after_seconds + 4))
    assert due.requeue_after == pytest.approx(4)
    long = decide(S, memory, driver=driver(S, started_at=NOW - S.restart_policy.reset_after_seconds))
    assert long.memory.consecutive_failures == 0


# ---- failures -------------------------------------------------------------------------------


def test_a_failed_driver_is_recorded_removed_and_relaunched_after_the_backoff() -> None:
    memory = launched(S, driver_uid="pod-1")
    d = decide(S, memory, driver=ended(S, 1, message="Py4JError: boom"))
    assert d.action == Remove("pod-1") and d.memory.phase == "Restarting"
    assert d.memory.last_failure == Failure("Error", 1, "Py4JError: boom", NOW, 1, "pod-1", 1)
    assert d.memory.consecutive_failures == 1 and d.memory.driver_uid == "" and d.memory.ended_uid == "pod-1"
    delay = d.memory.next_launch_at - NOW  # type: ignore[operator]
    assert 8 <= delay <= 12 and d.requeue_after == pytest.approx(delay)
    assert reasons(d) == ["DriverLost"] and "relaunching in" in d.events[0].message
    assert condition(d, "Degraded") == ("True", "Error") and condition(d, "Ready") == ("False", "DriverNotRunning")

    seen_again = decide(S, d.memory, driver=ended(S, 1))
    assert seen_again.action == Remove("pod-1") and seen_again.memory.consecutive_failures == 1
    assert seen_again.events == ()

    waiting = decide(S, d.memory, now=NOW + 1)
    assert waiting.action is None and waiting.memory.phase == "Restarting"
    assert waiting.requeue_after == pytest.approx(delay - 1)

    relaunch = decide(S, d.memory, now=NOW + delay)
    assert relaunch.action == Launch(2, root_of(S)) and reasons(relaunch) == ["Restarting"]
    assert relaunch.memory.restarts_total == 1 and relaunch.restart_reason == "Error"
    assert [(r.reason, r.epoch) for r in relaunch.memory.recent_restarts] == [("Error", 2)]
    assert relaunch.memory.next_launch_at is None and relaunch.memory.consecutive_failures == 1


@pytest.mark.parametrize(("before", "low", "high"), [(3, 80 * 0.8, 80 * 1.2), (8, 300 * 0.8, 300)])
def test_the_backoff_grows_and_is_capped(before: int, low: float, high: float) -> None:
    memory = launched(S, driver_uid="pod-1", consecutive_failures=before)
    d = decide(S, memory, driver=ended(S, 1))
    assert low <= d.memory.next_launch_at - NOW <= high  # type: ignore[operator]


def test_a_spec_change_cuts_the_backoff_wait() -> None:
    failed = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, 1)).memory
    fixed = spec(application={"file": "examples/wordcount.py", "args": ["--input", "/data/in2"]})
    d = decide(fixed, failed, generation=2, now=NOW + 1)
    assert isinstance(d.action, Launch) and d.action.epoch == 2


def test_exhausting_the_failure_budget_halts_until_the_user_changes_something() -> None:
    memory = launched(S, driver_uid="pod-1", consecutive_failures=S.restart_policy.max_failures)
    d = decide(S, memory, driver=ended(S, 1))
    assert d.memory.phase == "Failed" and reasons(d) == ["DriverLost", "BackoffExhausted"]
    assert d.memory.halt == Halt("BackoffExhausted", 1, "") and d.memory.next_launch_at is None
    assert condition(d, "Degraded") == ("True", "BackoffExhausted")
    stays = decide(S, d.memory, now=NOW + 10_000)
    assert stays.action is None and stays.memory.phase == "Failed"
    assert condition(stays, "Degraded") == ("True", "BackoffExhausted")
    retried = decide(spec(restartNonce="try-again"), d.memory, generation=2)
    assert isinstance(retried.action, Launch) and retried.memory.consecutive_failures == 0
    assert retried.memory.halt is None


def test_a_storage_outage_relaunches_with_capped_backoff_and_never_exhausts_the_budget() -> None:
    """Exit code 5: the driver rode out the outage for its budget. Relaunched for as long as
    it lasts, however many times, and healthy again by itself once storage is back."""
    memory = launched(S, driver_uid="pod-1", consecutive_failures=S.restart_policy.max_failures)
    delays = []
    for outage in range(1, 13):
        d = decide(S, memory, driver=ended(S, contract.EXIT_STORAGE_UNAVAILABLE, uid=f"pod-{outage}",
                                              message="query counts kept failing for 901s"))
        assert d.memory.phase == "Restarting" and d.memory.halt is None and reasons(d) == ["StorageUnavailable"]
        assert d.memory.consecutive_failures == S.restart_policy.max_failures  # not counted
        assert condition(d, "StorageUnavailable") == ("True", "DriverCouldNotReachStorage")
        assert condition(d, "Degraded") == ("True", "StorageUnavailable")
        delays.append(d.memory.next_launch_at - NOW)  # type: ignore[operator]
        relaunched = decide(S, d.memory, now=NOW + delays[-1])
        assert isinstance(relaunched.action, Launch)
        memory = replace(relaunched.memory, driver_uid=f"pod-{outage + 1}")
    assert delays[0] < delays[3] and max(delays) <= S.restart_policy.backoff.max_seconds
    back = decide(S, memory, driver=driver(S, uid="pod-13", epoch=memory.epoch,
                                           report=report(epoch=memory.epoch, state="running")))
    assert "StorageAvailable" in reasons(back) and condition(back, "StorageUnavailable") == ("False", "Reachable")


def test_a_state_root_taken_by_an_older_pipeline_creates_no_pod_and_names_it() -> None:
    d = decide(S, root_taken_by="team/older")
    assert d.action is None and d.memory.phase == "Invalid" and reasons(d) == ["StateRootConflict"]
    assert "overlaps the state of PersistentPipeline team/older" in d.memory.message
    assert decide(S, d.memory, root_taken_by="team/older").events == ()
    assert isinstance(decide(S, d.memory).action, Launch)


def test_restart_policy_never_does_not_relaunch_a_failed_driver() -> None:
    never = spec(restartPolicy={"type": "Never"})
    d = decide(never, launched(never, driver_uid="pod-1"), driver=ended(never, 1))
    assert d.memory.phase == "Failed" and d.memory.halt is not None and d.memory.halt.reason == "Failed"


@pytest.mark.parametrize("policy", ["OnFailure", "Never"])
def test_a_clean_exit_completes_a_pipeline_that_restarts_only_on_failure(policy: str) -> None:
    s = spec(restartPolicy={"type": policy})
    d = decide(s, launched(s, driver_uid="pod-1"), driver=ended(s, 0, reason="Completed"))
    assert d.memory.phase == "Completed" and reasons(d) == ["Completed"] and d.action == Remove("pod-1")
    assert condition(d, "Degraded") == ("False", "Healthy")
    assert decide(s, d.memory).memory.phase == "Completed"


def test_a_clean_exit_under_always_is_relaunched_without_counting_a_failure() -> None:
    d = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, 0, reason="Completed"))
    assert d.memory.phase == "Restarting" and d.memory.consecutive_failures == 0
    relaunch = decide(S, d.memory, now=d.memory.next_launch_at)
    assert isinstance(relaunch.action, Launch) and relaunch.restart_reason == "Completed"


def test_a_misconfigured_driver_waits_the_backoff_cap_and_says_why() -> None:
    message = "IncompatibleChange: output counts changed its key"
    d = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, contract.EXIT_MISCONFIGURED, message=message))
    assert d.memory.last_failure is not None and d.memory.last_failure.reason == "Misconfigured"
    assert d.memory.next_launch_at == NOW + S.restart_policy.backoff.max_seconds
    assert message in d.events[0].message and condition(d, "Degraded") == ("True", "Misconfigured")


def test_a_stale_epoch_relaunches_at_once_above_the_stored_epoch_without_counting_a_failure() -> None:
    message = f"{contract.STALE_EPOCH_PREFIX}7: epoch 1 is not above it"
    d = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, contract.EXIT_FENCED, message=message))
    assert d.action == Remove("pod-1") and reasons(d) == ["StaleEpoch"] and d.requeue_after == 0
    assert d.memory.consecutive_failures == 0 and d.memory.last_failure is None and d.memory.epoch_floor == 8
    relaunch = decide(S, d.memory)
    assert relaunch.action == Launch(8, root_of(S)) and reasons(relaunch) == ["Relaunching"]
    assert relaunch.memory.restarts_total == 0 and relaunch.restart_reason == "StaleEpoch"
    assert relaunch.memory.epoch_floor == 0


def test_the_stale_epoch_is_found_in_a_log_tail_too() -> None:
    tail = f"INFO ...\nERROR spark_app: {contract.STALE_EPOCH_PREFIX}12: epoch 1 is not above it\n"
    d = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, contract.EXIT_FENCED, message=tail))
    assert d.memory.epoch_floor == 13


def test_a_fenced_driver_without_the_stale_prefix_is_a_failure() -> None:
    d = decide(S, launched(S, driver_uid="pod-1"),
               driver=ended(S, contract.EXIT_FENCED, message="driver epoch 1 was superseded"))
    assert d.memory.last_failure is not None and d.memory.last_failure.reason == "Fenced"


@pytest.mark.parametrize(("exit_code", "reason", "expected"), [
    (137, "OOMKilled", "OOMKilled"),
    (137, "Error", "Killed(signal 9)"),
    (None, "Evicted", "Evicted"),
    (contract.EXIT_ALREADY_RUNNING, "Error", "AlreadyRunning"),
])
def test_failure_reasons(exit_code: int | None, reason: str, expected: str) -> None:
    pod = driver(S, phase="Failed", exit_code=exit_code, reason=reason)
    d = decide(S, launched(S, driver_uid="pod-1"), driver=pod)
    assert d.memory.last_failure is not None and d.memory.last_failure.reason == expected


def test_a_driver_pod_deleted_behind_the_operators_back_is_a_failure() -> None:
    d = decide(S, launched(S, driver_uid="pod-1"))
    assert d.action is None and d.memory.phase == "Restarting" and reasons(d) == ["DriverLost"]
    assert d.memory.last_failure is not None and d.memory.last_failure.reason == "DriverPodDeleted"
    assert d.memory.driver_uid == "" and d.memory.consecutive_failures == 1


def test_a_pod_terminating_on_someone_elses_request_is_waited_for_then_counted() -> None:
    memory = launched(S, driver_uid="pod-1")
    d = decide(S, memory, driver=driver(S, terminating=True))
    assert d.action is None and d.memory.phase == "Restarting" and d.requeue_after == TUNABLES.poll_seconds
    gone = decide(S, d.memory)
    assert gone.memory.last_failure is not None and gone.memory.last_failure.reason == "DriverPodDeleted"


@pytest.mark.parametrize("waiting", ["ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError"])
def test_a_driver_stuck_on_an_image_or_configuration_error_is_replaced(waiting: str) -> None:
    memory = launched(S, driver_uid="pod-1")
    young = driver(S, phase="Pending", waiting_reason=waiting, created_at=NOW - 10)
    assert decide(S, memory, driver=young).action is None
    old = driver(S, phase="Pending", waiting_reason=waiting, created_at=NOW - S.driver.stuck_after_seconds)
    d = decide(S, memory, driver=old)
    assert d.action == Stop("pod-1") and d.memory.last_failure is not None
    assert d.memory.last_failure.reason == waiting and d.memory.ended_uid == "pod-1"
    assert decide(S, d.memory, driver=replace(old, terminating=True)).memory.consecutive_failures == 1


def test_a_driver_pod_that_never_starts_is_replaced_after_the_startup_timeout() -> None:
    pending = driver(S, phase="Pending", created_at=NOW - S.driver.startup_timeout_seconds)
    d = decide(S, launched(S, driver_uid="pod-1"), driver=pending)
    assert d.action == Stop("pod-1") and d.memory.last_failure is not None
    assert d.memory.last_failure.reason == "StartupTimeout"


# ---- stops the user asks for ------------------------------------------------------------------


def test_suspend_stops_gracefully_then_resume_relaunches_without_counting_a_restart() -> None:
    suspended = spec(state="suspended")
    memory = launched(S, driver_uid="pod-1")
    d = decide(suspended, memory, driver=driver(S), generation=2)
    assert d.action == Stop("pod-1") and d.memory.phase == "Stopping" and reasons(d) == ["Stopping"]
    assert decide(suspended, d.memory, driver=driver(S), generation=2).events == ()
    waiting = decide(suspended, d.memory, driver=driver(S, terminating=True), generation=2)
    assert waiting.action is None and waiting.memory.phase == "Stopping"
    stopped = decide(suspended, waiting.memory, generation=2)
    assert stopped.action is None and stopped.memory.phase == "Suspended" and reasons(stopped) == ["Suspended"]
    assert stopped.memory.last_failure is None and condition(stopped, "Ready") == ("False", "Suspended")
    assert decide(suspended, stopped.memory, generation=2).events == ()
    resumed = decide(S, stopped.memory, generation=3)
    assert resumed.action == Launch(2, root_of(S)) and reasons(resumed) == ["Resuming"]
    assert resumed.memory.restarts_total == 0


def test_a_driver_that_exits_cleanly_on_sigterm_is_not_a_failure() -> None:
    stopping = replace(launched(S, driver_uid="pod-1"), stopping="Suspending")
    d = decide(spec(state="suspended"), stopping, driver=ended(S, 0, reason="Completed"), generation=2)
    assert d.action == Remove("pod-1") and d.memory.last_failure is None and d.memory.halt is None


def test_suspending_during_a_backoff_cancels_it() -> None:
    failed = decide(S, launched(S, driver_uid="pod-1"), driver=ended(S, 1)).memory
    d = decide(spec(state="suspended"), failed, generation=2)
    assert d.memory.phase == "Suspended" and d.memory.next_launch_at is None


def test_a_halted_pipeline_can_be_suspended() -> None:
    halted = Memory(phase="Failed", epoch=3, halt=Halt("BackoffExhausted", 1, ""))
    assert decide(spec(state="suspended"), halted, generation=2).memory.phase == "Suspended"


def test_restart_nonce_restarts_gracefully_and_counts_a_restart() -> None:
    bumped = spec(restartNonce="n1")
    d = decide(bumped, launched(S, driver_uid="pod-1"), driver=driver(S), generation=2)
    assert d.action == Stop("pod-1") and d.memory.stopping == "RestartRequested"
    relaunch = decide(bumped, d.memory, generation=2)
    assert relaunch.action == Launch(2, root_of(S)) and relaunch.memory.restarts_total == 1
    assert reasons(relaunch) == ["Restarting"] and relaunch.restart_reason == "RestartRequested"
    assert decide(bumped, relaunch.memory, driver=driver(bumped, epoch=2, uid="pod-2"), generation=2).action is None


def test_a_spec_change_under_last_state_restarts_gracefully_on_the_same_state() -> None:
    upgraded = spec(image="ghcr.io/persistent-pipelines/spark-app:0.2.0")
    d = decide(upgraded, launched(S, driver_uid="pod-1"), driver=driver(S), generation=2)
    assert d.action == Stop("pod-1") and d.memory.stopping == "SpecChanged"
    relaunch = decide(upgraded, d.memory, generation=2)
    assert relaunch.action == Launch(2, root_of(S)) and relaunch.restart_reason == "SpecChanged"


def test_a_change_of_restart_policy_only_does_not_restart_the_driver() -> None:
    relaxed = spec(restartPolicy={"maxFailures": 3})
    assert decide(relaxed, launched(S, driver_uid="pod-1"), driver=driver(S), generation=2).action is None


def test_a_new_storage_root_under_last_state_is_refused_and_the_driver_kept() -> None:
    moved = spec(persistence={"filesystem": {"claimName": "other"}})
    memory = launched(S, driver_uid="pod-1")
    d = decide(moved, memory, driver=driver(S), generation=2)
    assert d.action is None and reasons(d) == ["StateRootChangeRefused"]
    assert condition(d, "Progressing") == ("False", "StateRootChangeRefused") and d.memory.phase == "Running"
    assert decide(moved, d.memory, driver=driver(S), generation=2).events == ()
    no_driver = decide(moved, replace(memory, driver_uid=""), generation=2)
    assert no_driver.action is None and no_driver.memory.phase == "Invalid"


def test_a_reset_nonce_starts_from_empty_state_at_a_new_root_and_accepts_a_new_base() -> None:
    reset = spec(persistence={"filesystem": {"claimName": "other"}, "resetNonce": "r1"})
    d = decide(reset, launched(S, driver_uid="pod-1"), driver=driver(S), generation=2)
    assert d.action == Stop("pod-1")
    relaunch = decide(reset, d.memory, generation=2)
    assert relaunch.action == Launch(2, "pvc://other/team/wc/resets/r1")
    assert relaunch.memory.reset_nonce == "r1"


def test_stateless_mode_starts_each_new_spec_in_a_new_generation() -> None:
    stateless = spec(upgradeMode="stateless")
    first = decide(stateless)
    assert first.action == Launch(1, "pvc://state/team/wc/generations/1")
    upgraded = spec(upgradeMode="stateless", image="spark-app:0.2.0")
    running = decide(upgraded, replace(first.memory, driver_uid="pod-1"), driver=driver(stateless), generation=2)
    assert running.action == Stop("pod-1")
    relaunch = decide(upgraded, running.memory, generation=2)
    assert relaunch.action == Launch(2, "pvc://state/team/wc/generations/2")
    after_failure = decide(upgraded, replace(relaunch.memory, next_launch_reason="Error"), generation=2)
    assert after_failure.action == Launch(3, "pvc://state/team/wc/generations/2")


# ---- deletion --------------------------------------------------------------------------------


def test_deleting_stops_the_driver_gracefully_then_retains_the_state() -> None:
    memory = launched(S, driver_uid="pod-1")
    d = decide(S, memory, driver=driver(S), deleting=True)
    assert d.action == Stop("pod-1") and d.memory.phase == "Deleting" and reasons(d) == ["Stopping"]
    waiting = decide(S, d.memory, driver=driver(S, terminating=True), deleting=True)
    assert waiting.action is None
    done = decide(S, waiting.memory, deleting=True)
    assert done.action == Release() and reasons(done) == ["StateRetained"]
    assert "pvc://state/team/wc" in done.events[0].message


def test_deleting_an_ended_driver_removes_its_pod() -> None:
    assert decide(S, launched(S), driver=ended(S, 1), deleting=True).action == Remove("pod-1")


def test_deleting_with_ondelete_delete_runs_the_cleanup_pod_before_releasing() -> None:
    doomed = spec(persistence={"filesystem": {"claimName": "state"}, "onDelete": "Delete"})
    start = decide(doomed, launched(doomed), deleting=True)
    assert start.action == CreateCleanup() and reasons(start) == ["StateCleanup"]
    running = decide(doomed, start.memory, deleting=True, cleanup_phase="Running")
    assert running.action is None and running.requeue_after
    done = decide(doomed, running.memory, deleting=True, cleanup_phase="Succeeded")
    assert done.action == Release() and reasons(done) == ["StateDeleted"]


def test_deleting_a_pipeline_with_an_invalid_spec_retains_the_state() -> None:
    assert decide(None, Memory(state_root="/s"), problems=("x",), deleting=True).action == Release()


# ---- properties ----------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

WORLD_EVENTS = st.lists(st.sampled_from([
    "tick", "start", "report", "crash", "exit0", "stale", "delete_pod", "stuck", "terminate_done",
    "suspend", "resume", "upgrade", "nonce", "crash_before_act",
]), max_size=60)


@settings(max_examples=300, deadline=None)
@given(WORLD_EVENTS, st.sampled_from(["Always", "OnFailure", "Never"]), st.integers(0, 4))
def test_invariants_hold_in_any_sequence_of_events(events: list[str], policy: str, max_failures: int) -> None:
    """A simulated API server with one driver pod at most (the fixed pod name guarantees
    it). Whatever happens, the operator launches only when no pod exists, each time with
    a higher epoch, above any stored epoch a stale driver named; it counts each ended pod
    once and keeps its status bounded. ``crash_before_act``: the status was written but
    the operator died before acting."""
    generation, nonce, image, state = 1, "", "img:1", "running"
    memory, pod, now, stale_floor, last_epoch, pods = Memory(), None, NOW, 0, 0, 0
    failures_seen: set[str] = set()

    for event in [*events, "tick", "tick"]:
        now += 3
        if event == "start" and pod is not None and pod.phase == "Pending" and not pod.terminating:
            pod = replace(pod, phase="Running", started_at=now)
        elif event == "report" and pod is not None and pod.phase == "Running":
            pod = replace(pod, report=report(pod.epoch, reported_at=now))
        elif event in ("crash", "exit0", "stale") and pod is not None and not pod.ended:
            code = {"crash": 1, "exit0": 0, "stale": contract.EXIT_FENCED}[event]
            message = ""
            if event == "stale":
                stale_floor = pod.epoch + 5
                message = f"{contract.STALE_EPOCH_PREFIX}{stale_floor}"
            pod = replace(pod, phase="Succeeded" if code == 0 else "Failed", exit_code=code, message=message)
        elif event == "delete_pod" or (event == "terminate_done" and pod is not None and pod.terminating):
            pod = None
        elif event == "stuck" and pod is not None and pod.phase == "Pending":
            pod = replace(pod, waiting_reason="ImagePullBackOff", created_at=now - 3600)
        elif event in ("suspend", "resume", "upgrade", "nonce"):
            generation += 1
            state = {"suspend": "suspended", "resume": "running"}.get(event, state)
            image = f"img:{generation}" if event == "upgrade" else image
            nonce = f"n{generation}" if event == "nonce" else nonce
        s = spec(image=image, restartNonce=nonce, state=state,
                 restartPolicy={"type": policy, "maxFailures": max_failures,
                                "backoff": {"initialSeconds": 1, "maxSeconds": 8}})
        d = next_action(observed(s, memory, driver=pod, now=now, generation=generation), TUNABLES)

        assert d.memory.consecutive_failures <= max_failures + 1
        assert len(d.memory.recent_restarts) <= 5 and len(d.memory.message) <= 1024
        assert d.memory.restarts_total >= memory.restarts_total
        assert [c.type for c in d.memory.conditions] == ["Ready", "Progressing", "Degraded", "CheckpointHealthy",
                                                          "StorageUnavailable"]
        failure = d.memory.last_failure
        if failure is not None and failure != memory.last_failure:
            assert failure.pod_uid not in failures_seen, "an ended driver was counted twice"
            failures_seen.add(failure.pod_uid)
        memory = d.memory
        if event == "crash_before_act":
            continue
        if isinstance(d.action, Launch):
            assert pod is None, "launched while a driver pod exists"
            assert d.action.epoch > last_epoch and d.action.epoch > stale_floor
            last_epoch, pods = d.action.epoch, pods + 1
            pod = driver(s, epoch=d.action.epoch, uid=f"pod-{pods}", phase="Pending", started_at=None,
                         created_at=now)
        elif isinstance(d.action, Stop) and pod is not None:
            pod = replace(pod, terminating=True)
        elif isinstance(d.action, Remove):
            pod = None


def _backfill(percent: float, **fields: object) -> BackfillReport:
    return BackfillReport(rows_read=int(percent * 10), rows_total=1000, percent=percent, version=4,
                          **fields)  # type: ignore[arg-type]


def test_a_backfill_is_shown_and_its_start_pause_resume_and_end_are_announced_once() -> None:
    memory = launched(S, driver_uid="pod-1", announced_epoch=1)
    steps = [(NOW, _backfill(10, rows_per_second=500.0, eta_seconds=180.0), ["BackfillStarted"]),
             (NOW + 1, _backfill(20, rows_per_second=500.0, eta_seconds=160.0), []),
             (NOW + 2, _backfill(20, paused=True), ["BackfillPaused"]),
             (NOW + 3, _backfill(20, paused=True), []),
             (NOW + 4, _backfill(30, rows_per_second=100.0), ["BackfillResumed"]),
             (NOW + 5, _backfill(100, finished=True), ["BackfillFinished"]),
             (NOW + 99, _backfill(100, finished=True), [])]
    for now, progress, expected in steps:
        r = replace(report(reported_at=now - 1), backfills={"accounts": progress})
        d = decide(S, memory, driver=driver(S, report=r), now=now)
        assert [r for r in reasons(d) if r.startswith("Backfill")] == expected, (now, progress)
        if expected:
            assert d.memory.backfills == {"accounts": progress}
        memory = d.memory
    assert memory.describe_backfills() == "done"


def test_backfill_progress_follows_at_most_every_refresh_interval() -> None:
    memory = launched(S, driver_uid="pod-1", announced_epoch=1)
    first = decide(S, memory, driver=driver(S, report=replace(report(), backfills={"a": _backfill(10)})))
    soon = decide(S, first.memory, driver=driver(S, report=replace(report(), backfills={"a": _backfill(11)})),
                  now=NOW + 1)
    assert soon.memory.backfills == first.memory.backfills
    later = decide(S, first.memory, driver=driver(S, report=replace(report(), backfills={"a": _backfill(40)})),
                   now=NOW + TUNABLES.checkpoint_refresh_seconds)
    assert later.memory.backfills["a"].percent == 40
