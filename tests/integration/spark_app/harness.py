"""Running pipelines as real driver processes and checking their changelogs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PIPELINES = Path(__file__).parent / "pipelines"


DRIVER_SPARK_CONF = {"spark.ui.enabled": "false", "spark.master": "local[2]"}
"""A test driver's Spark configuration, unless its environment gives another."""


def spark_conf_env(**extra: str) -> dict[str, str]:
    """The environment that gives a driver DRIVER_SPARK_CONF with ``extra`` on top."""
    return {"SPARK_APP_SPARK_CONF": json.dumps({**DRIVER_SPARK_CONF, **extra})}


@dataclass
class Driver:
    """One ``python -m spark_app run`` process, its output captured to a log file."""

    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Driver:
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "SPARK_APP_TERMINATION_LOG": str(self.log_path) + ".end",
            **self.env,
        }
        env.setdefault("SPARK_APP_SPARK_CONF", json.dumps(DRIVER_SPARK_CONF))
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "spark_app", "run", *self.args],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        return self

    def wait(self, timeout: float = 240) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"driver did not stop within {timeout}s:\n{self.output()[-3000:]}") from None

    def kill(self) -> None:
        """kill -9 of the whole driver (Python and its JVM), as a lost node would."""
        assert self.process is not None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def freeze(self) -> None:
        """SIGSTOP to the whole driver (Python, its JVM, Spark's Python workers): a long GC
        pause, or a node cut off from the others."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def memory_bytes(self) -> dict[str, int]:
        """The memory of each process of the driver (its process group), by pid and kind:
        the driver's Python, its JVM, Spark's Python workers. Proportional (PSS): a page
        that forked workers share counts once in their sum, not once per process. A JVM's
        child that has not yet exec'd (the JDK spawns commands with vfork, so the child
        shares the JVM's very address space and reports all of it) is not counted: it
        has its parent's command line, and the name of the thread that forked it (so its
        name does not say java)."""
        assert self.process is not None
        group: dict[str, tuple[str, str, str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    head, _, rest = handle.read().rpartition(")")
                fields = rest.split()
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(fields[2]) == self.process.pid:  # field 5: the process group
                group[entry] = (head, fields[1], command)  # field 4: the parent
        found = {}
        for entry, (head, parent, command) in group.items():
            if parent in group and "java" in group[parent][0] and command == group[parent][2]:
                continue  # a vforked child of the JVM, about to exec a command
            words = command.split(" -m ")[-1].split() or ["(exiting)"]
            kind = "jvm" if "java" in head else ("driver" if int(entry) == self.process.pid else words[0][:40])
            found[f"{entry} {kind}"] = _pss(entry)
        return found

    def count_in_output(self, text: str) -> int:
        return self.output().count(text)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def termination_message(self) -> str:
        path = Path(str(self.log_path) + ".end")
        return path.read_text() if path.exists() else ""

    def wait_for_log(self, text: str, timeout: float = 180, pattern: bool = False) -> None:
        """Until the driver logs ``text`` (a regular expression with ``pattern``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (re.search(text, self.output(), re.MULTILINE) if pattern else text in self.output()):
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(
                    f"driver exited ({self.process.returncode}) before logging {text!r}:\n"
                    f"{self.output()[-3000:]}"
                )
            time.sleep(0.2)
        raise AssertionError(f"driver did not log {text!r} within {timeout}s:\n{self.output()[-3000:]}")


def _pss(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def write_csv(folder: Path, name: str, header: str, rows: list[str]) -> None:
    """Writes a file under a temporary name, then renames it into place (atomic arrival)."""
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / f".{name}.tmp"
    temp.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    temp.rename(folder / name)


def write_jsonlines(folder: Path, name: str, lines: list[str]) -> None:
    """Writes a JSON-lines file aside, then renames it into place (atomic arrival)."""
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / f".{name}.tmp"
    temp.write_text("".join(line + "\n" for line in lines))
    temp.rename(folder / name)


def read_changelog(path: Path) -> list[dict[str, Any]]:
    """The lines of an output; a NUL byte (a hole left by a write past the end) fails."""
    if not path.exists():
        return []
    data = path.read_bytes()
    hole = data.find(b"\0")
    assert hole < 0, f"{path} holds a NUL byte at {hole}: a write landed past its end"
    return [json.loads(line) for line in data.decode().splitlines() if line]


def fold(changelog: list[dict[str, Any]], key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Applies a changelog, asserting that it is consistent: a +1 never lands on a live key
    (that would be a duplicated row) and a -1 always retracts exactly the live row (a
    missing row would make it fail)."""
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for number, line in enumerate(changelog, start=1):
        row = {k: v for k, v in line.items() if k not in ("time", "diff")}
        k = tuple(row[c] for c in key)
        if line["diff"] == 1:
            assert k not in table, f"changelog line {number} adds {row} while {table[k]} is live"
            table[k] = row
        else:
            assert table.get(k) == row, (
                f"changelog line {number} retracts {row}, but the live row is {table.get(k)}"
            )
            del table[k]
    return table


def passes(check: Callable[[], object]) -> bool:
    """Whether ``check`` passes now: for waiting until a running driver's output is right
    (an output being written may not be whole yet)."""
    try:
        check()
    except (AssertionError, OSError, ValueError):
        return False
    return True


def wait_until(what: str, probe, timeout: float = 180):  # type: ignore[no-untyped-def]
    """``probe()``'s first truthy answer, asked every 0.5 s; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def wait_until_passes(what: str, check: Callable[[], object], timeout: float = 180,
                      drivers: tuple[Driver, ...] = (), cap: float = 900) -> None:
    """Until ``check`` passes (asked every 0.5 s), for as long as ``drivers`` make progress:
    the AssertionError comes once none of them has committed a batch for ``timeout``
    seconds (or after ``cap`` in all), with the check's last failure and the tails of their
    logs. A reader that is slow on a busy machine keeps committing; one whose output is
    wrong for good, or that is stuck, does not, and each fails saying which."""
    started = last_progress = time.monotonic()
    commits = -1
    last: BaseException | None = None
    while time.monotonic() - last_progress < timeout and time.monotonic() - started < cap:
        try:
            check()
            return
        except (AssertionError, OSError, ValueError) as failure:
            last = failure
        now_commits = sum(d.count_in_output(": committed batch") for d in drivers)
        if now_commits != commits:
            commits, last_progress = now_commits, time.monotonic()
        time.sleep(0.5)
    tails = "".join(f"\n--- {d.log_path.name}:\n{d.output()[-2000:]}" for d in drivers)
    raise AssertionError(f"timed out waiting for {what} after {time.monotonic() - started:.0f} s "
                         f"({commits} batches committed in all); last: {str(last)[:3000]}{tails}")


def multiset(changelog: list[dict[str, Any]]) -> Counter[str]:
    """The rows of an append-only changelog, as a multiset."""
    assert all(line["diff"] == 1 for line in changelog)
    return Counter(
        json.dumps({k: v for k, v in line.items() if k not in ("time", "diff")}, sort_keys=True)
        for line in changelog
    )


@dataclass
class Workspace:
    """Folders for one pipeline under test, and a way to start its drivers."""

    root: Path
    state: str
    endpoint_url: str | None = None
    started: list[Driver] = field(default_factory=list)

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def driver(
        self, *extra: str, pipeline: str = "two_outputs.py", env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> Driver:
        args = [
            str(PIPELINES / pipeline),
            "--input",
            input or str(self.inputs),
            "--out-dir",
            str(self.out),
            "--state",
            self.state,
            *extra,
        ]
        if self.endpoint_url:
            args += ["--endpoint-url", self.endpoint_url]
        runs = len(list(self.root.glob("driver-*.log")))
        driver = Driver(args, self.root / f"driver-{runs}.log", env or {})
        self.started.append(driver)
        return driver

    def kafka_driver(self, bootstrap_servers: str | None, topic: str, *extra: str,
                     env: dict[str, str] | None = None, pipeline: str = "kafka_words.py") -> Driver:
        """A driver of a pipeline that reads ``topic`` (pipelines/kafka_words.py by default),
        from ``bootstrap_servers`` or else the connection ``env`` gives (SPARK_APP_KAFKA_*)."""
        servers = ["--bootstrap-servers", bootstrap_servers] if bootstrap_servers else []
        args = [str(PIPELINES / pipeline), *servers, "--topic", topic,
                "--out-dir", str(self.out), "--state", self.state, *extra]
        runs = len(list(self.root.glob("driver-*.log")))
        driver = Driver(args, self.root / f"driver-{runs}.log", env or {})
        self.started.append(driver)
        return driver

    def kill_all(self) -> None:
        """No driver outlives its test, whatever the test's outcome."""
        for driver in self.started:
            if driver.process is not None:
                driver.kill()


def open_backend_workspace(request: Any, tmp_path: Path, backend: str) -> Workspace:
    """A workspace whose state is on ``backend`` (a folder, or a new bucket of the test S3
    server), its drivers killed when the test ends. ``request`` is the fixture's."""
    if backend == "filesystem":
        workspace = Workspace(tmp_path, str(tmp_path / "state"))
    else:
        server = request.getfixturevalue("s3_server")
        workspace = Workspace(tmp_path, f"s3://{server.new_bucket()}/pipelines/two", server.endpoint_url)
    request.addfinalizer(workspace.kill_all)
    return workspace
