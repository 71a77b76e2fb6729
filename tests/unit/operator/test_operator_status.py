"""The status: a Memory survives the round trip through it (a restarted operator carries
on), conditions keep their transition times, and nothing in it grows without bound."""

from __future__ import annotations

from dataclasses import replace

from pipeline_operator.memory import (
    MAX_MESSAGE_CHARS,
    Checkpoint,
    Condition,
    Failure,
    Memory,
    Restart,
)
from pipeline_operator.observe import QueryReport, format_time
from pipeline_operator.status import read_memory, render
from ppl_factories import NAME, NOW, RICH_MEMORY


def test_memory_survives_the_round_trip_through_status() -> None:
    status = render(RICH_MEMORY, name=NAME, generation=3, previous={}, now=NOW)
    assert read_memory(status) == RICH_MEMORY
    assert status["driver"] == {"epoch": 4, "pod": "wc-driver", "uid": "pod-4"}
    assert status["checkpoint"]["time"] == format_time(NOW - 5.5)
    assert status["observedGeneration"] == 3 and status["lastFailure"]["exitCode"] == 1


def test_an_empty_status_is_a_fresh_memory() -> None:
    assert read_memory(None) == Memory() and read_memory({}) == Memory()
    assert read_memory(render(Memory(), name=NAME, generation=1, previous={}, now=NOW)) == Memory()


def test_conditions_keep_their_transition_time_until_their_status_changes() -> None:
    first = render(RICH_MEMORY, name=NAME, generation=3, previous={}, now=NOW)
    later = render(RICH_MEMORY, name=NAME, generation=3, previous=first, now=NOW + 100)
    assert later["conditions"] == first["conditions"]
    degraded = RICH_MEMORY.conditions[:2] + (Condition("Degraded", "True", "NoRecentCommit", "late"),) + \
        RICH_MEMORY.conditions[3:]
    flipped = render(Memory(conditions=degraded), name=NAME, generation=3, previous=first, now=NOW + 100)
    times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert times["Degraded"] == format_time(NOW + 100, fraction=False)
    assert times["Ready"] == format_time(NOW, fraction=False)


def test_an_unchanged_memory_renders_an_identical_status() -> None:
    first = render(RICH_MEMORY, name=NAME, generation=3, previous={}, now=NOW)
    assert render(read_memory(first), name=NAME, generation=3, previous=first, now=NOW + 5) == first


def test_every_string_of_the_status_is_bounded_whatever_the_memory_holds() -> None:
    huge = "x" * 20_000
    memory = replace(RICH_MEMORY, message=huge, announced_problem=huge, next_launch_reason=huge, stopping=huge,
                     last_failure=Failure(huge, 1, huge, NOW, 2), recent_restarts=(Restart(NOW, huge, 3),),
                     conditions=(Condition("Degraded", "True", huge, huge),),
                     checkpoint=Checkpoint(time=NOW, epoch=4, queries={huge: QueryReport(offsets={huge: 1})}))
    status = render(memory, name=NAME, generation=3, previous={}, now=NOW)

    def strings(value: object) -> list[str]:
        if isinstance(value, dict):
            return [s for k, v in value.items() for s in [k, *strings(v)]]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert max(len(s) for s in strings(status)) <= MAX_MESSAGE_CHARS


def test_kafka_lag_is_shown_per_output_and_the_slowest_outputs_total_drives_the_lag_column() -> None:
    lag = {"clicks": {"raw": {"0": 5, "1": 7}}}
    slower = {"clicks": {"raw": {"0": 20, "1": 7}}}
    memory = replace(RICH_MEMORY, checkpoint=Checkpoint(time=NOW - 3, epoch=3, queries={
        "counts": QueryReport(batch=4, lag=lag), "even": QueryReport(batch=2, lag=slower)}))
    status = render(memory, name=NAME, generation=1, previous={}, now=NOW)
    assert status["checkpoint"]["lag"] == 27
    assert status["checkpoint"]["queries"]["counts"]["lag"] == lag
    again = read_memory(status)
    assert again.checkpoint is not None and again.checkpoint.queries["even"].lag == slower
    assert again.checkpoint.lag() == {("clicks", "raw", "0"): 20, ("clicks", "raw", "1"): 7}
