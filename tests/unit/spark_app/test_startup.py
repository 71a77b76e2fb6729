"""The start-up line: built from a query's first progress report, and read back by the
resume benchmark."""

from spark_app.runtime import startup

PROGRESS = {
    "timestamp": "2026-11-27T10:00:10.000Z",
    "durationMs": {"triggerExecution": 2500},
    "stateOperators": [
        {"customMetrics": {"rocksdbLoadLatencyMs": 1200, "rocksdbReplayChangeLogLatencyMs": 300,
                           "rocksdbNumReplayChangelogFiles": 4, "rocksdbBytesCopied": 1000, "rocksdbGetCount": 9}},
        {"customMetrics": {"rocksdbLoadLatencyMs": 800, "rocksdbNumReplayChangelogFiles": 1}},
    ],
}


def at(seconds: float) -> float:
    return 1_795_773_600.0 + seconds  # 2026-11-27T10:00:00Z


def test_a_first_progress_gives_each_phase_and_the_state_stores_load_summed_over_its_operators() -> None:
    shown = startup.from_progress("counts", at(0), declared=at(6), state=at(6.5), recovery=(at(6.5), at(8)),
                                  progress=PROGRESS)
    assert (shown.total_s, shown.declared_s, shown.state_s, shown.recovered_s, shown.starting_s, shown.batch_s) == (
        12.5, 6.0, 0.5, 1.5, 2.0, 2.5)
    assert (shown.store_load_s, shown.store_replay_s, shown.store_replayed_files, shown.store_copied_bytes) == (
        2.0, 0.3, 5, 1000)


def test_the_line_reads_back_as_it_was_written() -> None:
    stateful = startup.from_progress("counts", at(0), at(6), at(6.5), (at(6.5), at(8)), PROGRESS)
    stateless = startup.from_progress("even", at(0), at(6), at(6.5), (at(9), at(9.25)),
                                      {"timestamp": "2026-11-27T10:00:10.000Z", "durationMs": {"triggerExecution": 500}})
    log = f"x INFO spark_app: {stateful.describe()}\nnoise\nx INFO spark_app: {stateless.describe()}\n"
    assert startup.parse(log) == [stateful, stateless]
    assert stateless.store_load_s is None


def test_the_process_started_before_now_and_not_long_ago() -> None:
    import time

    assert time.time() - 3600 < startup.process_started() <= time.time()
