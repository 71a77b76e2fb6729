"""Epochs, the lease and fencing: the single-writer guarantee, on both backends."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from typing import Any

import pytest

from spark_app import contract
from spark_app.state.identity import IncompatibleChange, SourceIdentity
from spark_app.state.inspect import inspect
from spark_app.state.log import PREFIX
from spark_app.state.session import (
    MANIFESTS,
    AlreadyRunning,
    Fenced,
    Holder,
    StaleEpoch,
    StateOwnedElsewhere,
    StateSession,
)
from spark_app.storage import Storage
from tests.integration.state.sessions import Clock, head, manifest, open_session


def test_first_driver_starts_at_epoch_one_with_no_heads(storage: Storage) -> None:
    session = open_session(storage, Clock())
    assert session.epoch == 1
    assert session.heads == {}


def test_commits_are_read_back_by_the_next_driver(storage: Storage) -> None:
    clock = Clock()
    first = open_session(storage, clock)
    first.commit("out", head(0))
    first.commit("out", head(1))
    first.close("done")
    second = open_session(storage, clock)
    assert second.epoch == 2
    assert second.heads["out"] == head(1)
    assert second.state_id == first.state_id


def test_a_live_lease_makes_a_second_local_driver_fail_fast(storage: Storage) -> None:
    clock = Clock()
    open_session(storage, clock)
    clock.now += 5
    with pytest.raises(AlreadyRunning, match=r"another driver holds the state .* renewed 5.0s ago"):
        open_session(storage, clock)


def test_an_expired_lease_is_taken_over_by_a_local_driver(storage: Storage) -> None:
    clock = Clock()
    open_session(storage, clock)  # never renews: it "died"
    clock.now += 31
    assert open_session(storage, clock).epoch == 2


def test_an_explicit_higher_epoch_takes_over_at_once_and_fences_the_old_driver(storage: Storage) -> None:
    clock = Clock()
    old = open_session(storage, clock, epoch=4)
    old.commit("out", head(0))
    new = open_session(storage, clock, epoch=5)
    assert new.heads["out"] == head(0)
    with pytest.raises(Fenced, match="epoch 4 was superseded"):
        old.check_not_fenced()
    with pytest.raises(Fenced):
        old.commit("out", head(1))
    new.commit("out", head(1))
    assert open_session(storage, clock, epoch=6).heads["out"] == head(1)


class PausingLogWrites:
    """Storage that, once armed, holds each new metadata log entry just after creating it,
    until ``resume`` is set: the window in which the entry exists but its writer has not
    yet taken note of it."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self.armed = False
        self.created = threading.Event()
        self.resume = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def create(self, key: str, data: bytes) -> bool:
        done = self._storage.create(key, data)
        if self.armed and key.startswith(PREFIX):
            self.created.set()
            assert self.resume.wait(10)
        return done


def test_queries_of_one_driver_never_fence_each_other(storage: Storage) -> None:
    """One query checks the fence while another query of the same driver is appending."""
    paused = PausingLogWrites(storage)
    session = open_session(paused, Clock())  # type: ignore[arg-type]
    paused.armed = True
    committer = threading.Thread(target=session.commit, args=("out", head(0)))
    committer.start()
    assert paused.created.wait(10)
    failures: list[BaseException] = []

    def check() -> None:
        try:
            session.check_not_fenced()
        except Fenced as fenced:
            failures.append(fenced)

    checker = threading.Thread(target=check)
    checker.start()
    checker.join(0.5)  # without turns, the check has seen the half-taken entry by now
    paused.resume.set()
    committer.join(10)
    checker.join(10)
    assert failures == []
    session.check_not_fenced()
    assert session.heads["out"] == head(0)


def test_a_lower_or_equal_epoch_is_refused_with_the_stored_epoch(storage: Storage) -> None:
    clock = Clock()
    open_session(storage, clock, epoch=7).close("done")
    with pytest.raises(StaleEpoch) as refused:
        open_session(storage, clock, epoch=7)
    assert str(refused.value).startswith(f"{contract.STALE_EPOCH_PREFIX}7")


def test_a_fenced_driver_cannot_renew_its_lease(storage: Storage) -> None:
    clock = Clock()
    old = open_session(storage, clock, epoch=1)
    open_session(storage, clock, epoch=2)
    with pytest.raises(Fenced):
        old.renew_lease()


def test_an_incompatible_change_is_refused_with_every_reason_and_how_to_reset(storage: Storage) -> None:
    clock = Clock()
    first = open_session(storage, clock)
    first.commit("out", head(0))
    first.close("done")
    with pytest.raises(IncompatibleChange) as refused:
        open_session(storage, clock, m=manifest(key=("w",), sources=("renamed",)))
    message = str(refused.value)
    assert "source 'words' has state but is no longer defined" in message
    assert "now reads sources ['renamed'] but its state was built from ['words']" in message
    assert "python -m spark_app reset" in message


def test_a_compatible_change_keeps_the_state(storage: Storage) -> None:
    clock = Clock()
    first = open_session(storage, clock)
    first.commit("out", head(3))
    first.close("done")
    moved = manifest()
    moved.sources["words"] = SourceIdentity("words", "jsonlines", "struct<word:string>", "/new/place")
    assert open_session(storage, clock, m=moved).heads["out"] == head(3)


def test_a_resume_of_unchanged_code_stores_its_manifest_only_once(storage: Storage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A manifest is stored under its digest: a driver whose code is unchanged reads it back
    and does not send it again (on S3, a create-if-absent answered 412 on every start);
    changed code stores its new one, which the next driver reads."""
    clock = Clock()
    open_session(storage, clock).close("done")
    created: list[str] = []
    create = storage.create

    def recording_create(key: str, data: bytes) -> bool:
        if key.startswith(MANIFESTS):
            created.append(key)
        return create(key, data)

    monkeypatch.setattr(storage, "create", recording_create)
    open_session(storage, clock).close("done")
    assert created == []
    moved = manifest()
    moved.sources["words"] = SourceIdentity("words", "jsonlines", "struct<word:string>", "/new/place")
    open_session(storage, clock, m=moved).close("done")
    assert created == [f"{MANIFESTS}{moved.digest()}.json"]
    assert open_session(storage, clock, m=moved).epoch == 4


def test_inspect_reports_the_latest_commit_and_the_lease(storage: Storage) -> None:
    clock = Clock()
    session = open_session(storage, clock, epoch=3)
    session.commit("out", head(2))
    report = inspect(storage, now_ms=int(clock.now * 1000) + 1500)
    assert report["epoch"] == 3
    assert report["queries"]["out"]["batch"] == 2
    assert report["queries"]["out"]["offsets"] == {"words": {"files": 3}}
    assert report["lease"]["live"] is True
    assert report["lease"]["age_s"] == 1.5


def test_the_log_is_compacted_but_keeps_the_newest_state(storage: Storage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("spark_app.state.session.LOG_RETAINED", 5)
    clock = Clock()
    session = open_session(storage, clock)
    for batch in range(12):
        session.commit("out", head(batch))
    assert len(storage.list("log/")) <= 10
    session.close("done")
    assert open_session(storage, clock).heads["out"] == head(11)


def test_a_stale_driver_stays_fenced_after_the_newer_driver_compacted_the_log(storage: Storage,
                                                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Compaction deletes old entries, which reopens the slot right after the stale driver's
    last entry: the fence must hold on the log's highest entry, not on that slot."""
    monkeypatch.setattr("spark_app.state.session.LOG_RETAINED", 5)
    clock = Clock()
    stale = open_session(storage, clock, epoch=1)
    stale.commit("out", head(0))
    newer = open_session(storage, clock, epoch=2)
    for batch in range(1, 13):
        newer.commit("out", head(batch))
    with pytest.raises(Fenced, match="epoch 1 was superseded"):
        stale.check_not_fenced()
    with pytest.raises(Fenced):
        stale.commit("out", head(1))
    with pytest.raises(Fenced):
        stale.record("snapshot", {})
    third = open_session(storage, clock, epoch=3)
    assert third.heads["out"] == head(12)


def test_a_local_driver_takes_over_at_once_from_a_dead_process_on_this_host(storage: Storage) -> None:
    """kill -9 leaves a live-looking lease behind; its holder's pid says it is gone."""
    clock = Clock()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ghost = replace(Holder.this_process("test"), pid=int(dead.stdout))
    StateSession.open(storage, manifest(), holder=ghost, clock=clock)
    clock.now += 1
    assert open_session(storage, clock).epoch == 2


def test_a_live_process_on_this_host_still_holds_the_lease(storage: Storage) -> None:
    clock = Clock()
    StateSession.open(storage, manifest(), holder=Holder.this_process("test"), clock=clock)
    clock.now += 1
    with pytest.raises(AlreadyRunning):
        open_session(storage, clock)


def test_a_reused_pid_does_not_hold_the_lease(storage: Storage) -> None:
    """The pid lives, but it is another process than the one that took the lease."""
    clock = Clock()
    holder = Holder.this_process("test")
    StateSession.open(storage, manifest(), holder=replace(holder, started="1"), clock=clock)
    clock.now += 1
    assert open_session(storage, clock).epoch == 2


def test_a_state_root_of_another_pipeline_is_refused(storage: Storage) -> None:
    clock = Clock()
    holder = Holder.this_process("test")
    first = StateSession.open(storage, manifest(), holder=holder, requested_epoch=1, owner="ns/first", clock=clock)
    first.close("done")
    with pytest.raises(StateOwnedElsewhere, match="belongs to PersistentPipeline ns/first, not ns/second"):
        StateSession.open(storage, manifest(), holder=holder, requested_epoch=2, owner="ns/second", clock=clock)
    # The same pipeline resumes it (recreated under the same name), and so may a local run.
    resumed = StateSession.open(storage, manifest(), holder=holder, requested_epoch=2, owner="ns/first", clock=clock)
    resumed.close("done")
    local = StateSession.open(storage, manifest(), holder=holder, clock=clock)
    assert local.epoch == 3 and local.owner == "ns/first"
