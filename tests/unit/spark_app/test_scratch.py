"""A driver's scratch folders: those a killed driver leaves are removed by the next one,
those of a driver that still runs are kept (real processes, one of them killed with -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from spark_app.runtime import scratch
from spark_app.runtime.sinks.keyed_state import OutputState

HOLD = ("import sys, time; from spark_app.runtime import scratch; "
        "print(scratch.owned_folder(sys.argv[1], sys.argv[2])[0], flush=True); time.sleep(120)")


def test_the_folders_of_killed_drivers_are_removed_and_the_living_ones_kept(tmp_path: Path) -> None:
    drivers = [subprocess.Popen([sys.executable, "-c", HOLD, kind, str(tmp_path)], stdout=subprocess.PIPE, text=True)
               for kind in ("batch", "spark")]
    try:
        killed, living = (Path(d.stdout.readline().strip()) for d in drivers)  # type: ignore[union-attr]
        (killed / "blockmgr-1" / "shuffle_0_0_0.data").parent.mkdir()
        (killed / "blockmgr-1" / "shuffle_0_0_0.data").write_bytes(b"\0" * 100)
        drivers[0].send_signal(signal.SIGKILL)
        drivers[0].wait(10)
        unowned = tmp_path / f"{scratch.PREFIX}of-an-older-version"  # no owner's lock: not ours to judge
        unowned.mkdir()
        (tmp_path / "blockmgr-1234").mkdir()

        assert scratch.sweep_abandoned(str(tmp_path)) == 1

        assert not killed.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([living.name, unowned.name, "blockmgr-1234"])
        mine, lock = scratch.owned_folder("output", str(tmp_path))
        assert scratch.sweep_abandoned(str(tmp_path)) == 0  # this process's own is held too
        assert os.path.isdir(mine)
        os.close(lock)
    finally:
        for driver in drivers:
            driver.kill()
            driver.wait(10)


def test_a_keyed_output_keeps_its_state_in_a_scratch_folder_that_its_close_removes() -> None:
    state = OutputState(["k"])
    assert os.path.basename(state.folder).startswith(f"{scratch.PREFIX}output-")
    state.close()
    state.close()  # twice: a query restarted in the driver closes its sink again
    assert not os.path.exists(state.folder)
