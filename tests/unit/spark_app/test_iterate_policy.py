"""Every branch of the iterate warm-start decision."""

from __future__ import annotations

import itertools

import pytest

from spark_app.runtime.iterate.policy import Change, Kind, Mode, Stored, decide

FP = "abc"
GOOD = Stored(fingerprint=FP, converged=True)
NONE, INSERTS, DELETES, BOTH = Change(0, 0), Change(3, 0), Change(0, 2), Change(3, 2)


@pytest.mark.parametrize(("stored", "change", "kind", "invalidate", "mode", "reason"), [
    (None, INSERTS, Kind.MONOTONE, True, Mode.COLD, "no stored fixed point"),
    (Stored("other", True), NONE, Kind.CONTRACTION, False, Mode.COLD, "the step changed"),
    (Stored(FP, False), NONE, Kind.MONOTONE, False, Mode.COLD, "stopped at the iteration limit"),
    (GOOD, NONE, Kind.GENERAL, False, Mode.REUSE, "unchanged"),
    (GOOD, NONE, Kind.MONOTONE, False, Mode.REUSE, "unchanged"),
    (GOOD, INSERTS, Kind.MONOTONE, False, Mode.WARM, "insertions only"),
    (GOOD, DELETES, Kind.MONOTONE, True, Mode.PARTIAL, "resetting what may depend"),
    (GOOD, BOTH, Kind.MONOTONE, True, Mode.PARTIAL, "resetting what may depend"),
    (GOOD, DELETES, Kind.MONOTONE, False, Mode.COLD, "no invalidate function"),
    (GOOD, BOTH, Kind.CONTRACTION, False, Mode.WARM, "converges from any start"),
    (GOOD, INSERTS, Kind.GENERAL, False, Mode.COLD, "neither monotone nor a contraction"),
    (GOOD, DELETES, Kind.GENERAL, False, Mode.COLD, "neither monotone nor a contraction"),
])
def test_decision(stored: Stored | None, change: Change, kind: Kind, invalidate: bool, mode: Mode, reason: str) -> None:
    decision = decide(stored, change, FP, kind, invalidate)
    assert decision.mode is mode
    assert reason in decision.reason


@pytest.mark.parametrize(("change", "kind", "invalidate"),
                         list(itertools.product([NONE, INSERTS, DELETES, BOTH], list(Kind), [False, True])))
def test_a_stored_result_is_never_trusted_after_deletions_without_a_reason(change: Change, kind: Kind,
                                                                           invalidate: bool) -> None:
    """The safety property: F is used as it is (reuse or warm) only when it is provably
    correct; deletions under a monotone step are never warm."""
    mode = decide(GOOD, change, FP, kind, invalidate).mode
    if mode is Mode.REUSE:
        assert change == NONE
    if mode is Mode.WARM:
        assert kind is Kind.CONTRACTION or (kind is Kind.MONOTONE and change.deleted == 0)
    if mode is Mode.PARTIAL:
        assert kind is Kind.MONOTONE and invalidate and change.deleted > 0
    for untrusted in (None, Stored("changed", True), Stored(FP, False)):
        assert decide(untrusted, change, FP, kind, invalidate).mode is Mode.COLD
