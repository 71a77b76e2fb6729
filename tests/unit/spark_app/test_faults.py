"""spark_app.faults: a stop point freezes the thread that reached it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from spark_app.faults import FAULT, FAULT_ACTION, IN_KAFKA_TRANSACTION

# A foreachBatch thread reaches the point while the main thread waits, as in a driver.
REACHES_A_STOP_POINT = """
import sys, threading
from spark_app.faults import crash_point

def batch():
    crash_point(sys.argv[2], 1)
    open(sys.argv[1], "w").close()  # what the batch does next (a Kafka commit, say)

thread = threading.Thread(target=batch)
thread.start()
thread.join()
"""


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_stop_point_freezes_the_thread_that_reached_it_before_its_next_step(tmp_path: Path) -> None:
    """SIGSTOP sent to the process group is taken by one thread of each process, and the
    others stop when it wakes them: the thread that reached the point ran on meanwhile
    (the Kafka sink's stale-driver test saw its 'frozen' transaction committed)."""
    after = tmp_path / "after-the-point"
    for _ in range(10):  # the race it closes was lost about once in two
        process = subprocess.Popen(
            [sys.executable, "-c", REACHES_A_STOP_POINT, str(after), IN_KAFKA_TRANSACTION],
            env={**os.environ, FAULT: f"{IN_KAFKA_TRANSACTION}:1", FAULT_ACTION: "stop"},
            start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while state(process.pid) != "T":
                assert time.monotonic() < deadline and process.poll() is None, "never stopped"
                time.sleep(0.01)
            time.sleep(0.2)
            assert not after.exists(), "the thread ran past its stop point"
            os.killpg(process.pid, signal.SIGCONT)
            assert process.wait(30) == 0
            assert after.exists()
            after.unlink()
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
