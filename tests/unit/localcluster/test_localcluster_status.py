"""Pod phase, conditions and container statuses as kubelet reports them."""

from typing import Any

import pytest

from localcluster.kubelet.status import (
    ContainerView,
    Terminated,
    container_status,
    exit_code_of,
    pod_conditions,
    pod_phase,
    pod_status,
    rfc3339,
    termination_message,
)


def running(name: str = "c", ready: bool = True) -> ContainerView:
    return ContainerView(name, "img", "running", started_at=100.0, ready=ready, started=True)


def exited(code: int, name: str = "c") -> ContainerView:
    return ContainerView(
        name, "img", "terminated", terminated=Terminated(code, "Error" if code else "Completed", 200.0, 100.0)
    )


def waiting(name: str = "c", reason: str = "ContainerCreating") -> ContainerView:
    return ContainerView(name, "img", "waiting", reason=reason)


def restarting(code: int = 1, name: str = "c") -> ContainerView:
    return ContainerView(
        name,
        "img",
        "waiting",
        reason="CrashLoopBackOff",
        last_terminated=Terminated(code, "Error", 200.0),
        restart_count=2,
    )


@pytest.mark.parametrize(
    ("policy", "init", "containers", "phase"),
    [
        ("Never", [], [exited(3)], "Failed"),
        ("Never", [], [exited(0)], "Succeeded"),
        ("Never", [], [exited(0), running()], "Running"),
        ("Never", [], [running(), waiting("d")], "Pending"),
        ("Always", [], [exited(0)], "Running"),
        ("Always", [], [restarting()], "Running"),
        ("OnFailure", [], [restarting()], "Running"),
        ("OnFailure", [], [exited(0), exited(0, "d")], "Succeeded"),
        ("Never", [exited(0, "i")], [waiting()], "Pending"),
        ("Never", [exited(1, "i")], [waiting()], "Failed"),
        ("Always", [restarting(1, "i")], [waiting()], "Pending"),
        ("Never", [running("i")], [waiting()], "Pending"),
        ("Never", [], [waiting(reason="ErrImagePull")], "Pending"),
    ],
)
def test_phase(policy: str, init: list[ContainerView], containers: list[ContainerView], phase: str) -> None:
    assert pod_phase(policy, init, containers) == phase


def test_exit_codes_of_signals_are_128_plus_the_signal() -> None:
    assert exit_code_of(3) == (3, None)
    assert exit_code_of(-15) == (143, 15)
    assert exit_code_of(-9) == (137, 9)


def test_terminated_container_status_carries_code_reason_and_times() -> None:
    status = container_status(exited(3))
    assert status["state"]["terminated"] == {
        "exitCode": 3,
        "reason": "Error",
        "startedAt": rfc3339(100.0),
        "finishedAt": rfc3339(200.0),
    }
    assert status["ready"] is False


def test_restarting_container_shows_back_off_and_its_last_exit() -> None:
    status = container_status(restarting(2))
    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert status["lastState"]["terminated"]["exitCode"] == 2
    assert status["restartCount"] == 2


def conditions_by_type(conditions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conditions}


def test_ready_conditions_and_transition_times_are_kept_while_unchanged() -> None:
    first = conditions_by_type(pod_conditions("Running", [], [running(ready=False)], [], now=10.0))
    assert first["Ready"]["status"] == "False"
    assert first["Ready"]["message"] == "containers with unready status: [c]"
    second = conditions_by_type(pod_conditions("Running", [], [running()], list(first.values()), now=20.0))
    assert second["Ready"]["status"] == "True"
    assert second["Ready"]["lastTransitionTime"] == rfc3339(20.0)
    assert second["PodScheduled"]["lastTransitionTime"] == rfc3339(10.0)


def test_initialized_waits_for_init_containers() -> None:
    conditions = conditions_by_type(pod_conditions("Pending", [running("setup")], [waiting()], [], now=1.0))
    assert conditions["Initialized"]["status"] == "False"
    assert "setup" in conditions["Initialized"]["message"]


def test_completed_pods_are_not_ready() -> None:
    conditions = conditions_by_type(pod_conditions("Succeeded", [], [exited(0)], [], now=1.0))
    assert conditions["Ready"] == {**conditions["Ready"], "status": "False", "reason": "PodCompleted"}


def test_pod_status_uses_the_loopback_address_and_keeps_start_time() -> None:
    status = pod_status("Never", [], [running()], {"startTime": "2020-01-01T00:00:00Z"}, 5.0, 6.0)
    assert status["podIP"] == status["hostIP"] == "127.0.0.1"
    assert status["startTime"] == "2020-01-01T00:00:00Z"
    assert status["phase"] == "Running"


def test_the_termination_message_is_the_file_read_up_to_4_kib() -> None:
    assert termination_message(b"stale epoch; stored epoch is 4", b"log", "File", 3) == "stale epoch; stored epoch is 4"
    assert termination_message(b"x" * 5000, b"", "File", 1) == "x" * 4096


@pytest.mark.parametrize(
    ("written", "policy", "exit_code", "message"),
    [
        (b"", "FallbackToLogsOnError", 1, "the log's tail"),
        (b"", "FallbackToLogsOnError", 0, ""),  # only a failed run falls back
        (b"", "File", 1, ""),
        (b"own words", "FallbackToLogsOnError", 1, "own words"),  # the file wins
    ],
)
def test_fallback_to_logs_only_for_a_failed_run_that_wrote_nothing(
    written: bytes, policy: str, exit_code: int, message: str
) -> None:
    assert termination_message(written, b"the log's tail", policy, exit_code) == message


def test_the_log_fallback_keeps_at_most_the_last_2_kib() -> None:
    assert termination_message(b"", b"a" * 100 + b"b" * 2048, "FallbackToLogsOnError", 2) == "b" * 2048
