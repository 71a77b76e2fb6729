"""Starting a driver's JVM: what it starts with, and starting it before Python's imports.

A driver's first second went to Python importing spark_app, pyspark and pyarrow before
pyspark started the JVM on the session's first use (0.6 to 1.1 s from the process's start
to ``spark-submit`` on the project's 2-core machine, bench/README.md). Nothing the JVM
starts with depends on those imports: the session's first configuration follows from the
driver's environment alone (``conf.initial_conf``). So a driver starts its JVM first
(``start_early``, before the pipeline file runs), and the session takes it over through
pyspark's own handover, the gateway's port and secret (``session.build_session``): the
JVM starts while Python imports.

Nothing here imports pyspark (a lint contract checks it): that would cost the very imports
the early start overlaps.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_app import contract
from spark_app.runtime import scratch
from spark_app.runtime.jvm import class_archive, start_up_methods
from spark_app.runtime.jvm.conf import initial_conf
from spark_app.runtime.jvm.jars import jars_dir, spark_home
from spark_app.runtime.jvm.worker_python import worker_python

log = logging.getLogger("spark_app")

CONNECTION_INFO_ENV = "_PYSPARK_DRIVER_CONN_INFO_PATH"
"""Where Spark's PythonGatewayServer writes its port and secret (pyspark's launch_gateway)."""

DRIVER_CLASS_PATH = "spark.driver.extraClassPath"
EXECUTOR_CLASS_PATH = "spark.executor.extraClassPath"
JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
LIBRARY_PATH = "spark.driver.extraLibraryPath"
AHEAD_OF_THE_USERS = frozenset({DRIVER_CLASS_PATH, EXECUTOR_CLASS_PATH, JAVA_OPTIONS, LIBRARY_PATH})
"""Settings a new JVM starts with spark_app's own value ahead of the user's: the user's took
effect if the started value ends with it."""


@dataclass(frozen=True)
class JvmLaunch:
    """What a driver's JVM starts with."""

    settings: Mapping[str, str]
    """Every Spark setting: spark-submit's ``--conf`` pairs, and the session builder's."""
    environment: Mapping[str, str]
    """Variables for the JVM alone (its local folder), not for this process's other children."""


def prepare(conf: Mapping[str, str], new_jvm: bool) -> JvmLaunch:
    """The launch of a session with ``conf``; ``new_jvm`` says whether a JVM is still to start
    (only then do its options and its own folders apply). Makes the scratch folders it names."""
    # Spark starts its Python workers with PYSPARK_PYTHON, and looks Python data sources up
    # with PYSPARK_DRIVER_PYTHON; see spark_app.runtime.jvm.worker_python.
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", worker_python())
    # On the class path rather than in spark.jars: spark.jars copies every jar (the AWS SDK
    # bundle alone is 600 MB) into a temporary folder per driver, which a killed driver
    # leaves behind.
    jars = jars_dir()
    classpath = os.path.join(jars, "*")
    settings = {**conf,
                # In Kubernetes execution, executors are built from the operator's pod template.
                **contract.executor_pod_template_conf(os.environ, tempfile.gettempdir())}
    # A pipeline's own jars (a JDBC driver, a UDF library) come after spark_app's, which
    # its driver cannot start without.
    _put_ahead(settings, DRIVER_CLASS_PATH, classpath, os.pathsep)
    _put_ahead(settings, EXECUTOR_CLASS_PATH, classpath, os.pathsep)
    environment: dict[str, str] = {}
    if not new_jvm:
        return JvmLaunch(settings, environment)
    if "spark.local.dir" not in settings and not os.environ.get("SPARK_LOCAL_DIRS"):
        # Spark's local folder (shuffle blocks, the state stores' working copies) is a
        # scratch folder, which the next driver on this disk removes if this one is killed.
        # Its lock stays held for the process's life; a clean exit removes it. Given to the
        # JVM alone (Spark warns of spark.local.dir whenever it is set; processes this one
        # starts later make their own).
        environment["SPARK_LOCAL_DIRS"] = scratch.process_folder("spark")
    # The JVM's temporary folder is a scratch folder too: each start writes the native
    # libraries of LZ4, Snappy and (unless it was unpacked once: native_library) RocksDB's
    # 15 MB there, and Spark its artifact folders; a killed driver left them all behind
    # (1.1 GB of RocksDB's alone in /tmp on this project's test machine after a day). A
    # user's own java.io.tmpdir, in extraJavaOptions, comes later on the command line and wins.
    jvm_tmp = scratch.process_folder("jvm")
    # Ahead of the user's own options (defaultJavaOptions precede extraJavaOptions).
    archive = class_archive.archive_path(jars)  # a hash of the JVM and the jars: once
    ours = " ".join(filter(None, (start_up_aids(archive), f"-Djava.io.tmpdir={jvm_tmp}")))
    _put_ahead(settings, JAVA_OPTIONS, ours, " ")
    # RocksDB's library from the folder unpacked once (native_library), ahead of the user's.
    libraries = class_archive.library_path(archive)
    if libraries is not None:
        _put_ahead(settings, LIBRARY_PATH, libraries, os.pathsep)
    return JvmLaunch(settings, environment)


def start_up_aids(archive: Path | None) -> str:
    """The Java options that make a new driver JVM start sooner: the class archive recorded
    for it (``class_archive``) and the compiler directives for its start-up-only code
    (``start_up_methods``). The benchmarks' baselines start with the same."""
    return " ".join(filter(None, (class_archive.java_options(archive), start_up_methods.java_options())))


def _put_ahead(settings: dict[str, str], key: str, ours: str, separator: str) -> None:
    """Sets ``key`` (one of AHEAD_OF_THE_USERS) to spark_app's value followed by the user's."""
    settings[key] = separator.join(filter(None, (ours, settings.get(key))))


def submit_command(home: str, settings: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """The command pyspark's launch_gateway runs for a session with ``settings``."""
    command = [os.path.join(home, "bin", "spark-submit")]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    submit_args = environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    if environ.get("SPARK_TESTING"):
        submit_args = "--conf spark.ui.enabled=false " + submit_args
    return command + shlex.split(submit_args)


def read_connection_info(data: bytes) -> tuple[int, str]:
    """The gateway's port and secret as PythonGatewayServer writes them: two big-endian
    ints (the port, the secret's length) and the secret in UTF-8."""
    port, length = struct.unpack(">ii", data[:8])
    secret = data[8:8 + length]
    if len(secret) != length:
        raise ValueError(f"a gateway's connection info of {len(data)} bytes is cut short")
    return port, secret.decode()


class EarlyJvm:
    """A driver JVM started before the session that is to run on it."""

    def __init__(self, conf: Mapping[str, str], launch: JvmLaunch, process: subprocess.Popen[bytes],
                 info_path: str) -> None:
        self.conf = dict(conf)
        """The configuration it was started for; a session with any other does not take it."""
        self.launch = launch
        self.process = process
        self._info_path = info_path
        """Where the JVM writes its gateway's port and secret, alone in a scratch folder."""

    @classmethod
    def start(cls, conf: Mapping[str, str], launch: JvmLaunch, home: str) -> EarlyJvm:
        info_path = os.path.join(scratch.process_folder("gateway"), "connection.info")
        env = {**os.environ, **launch.environment, "SPARK_CONNECT_MODE": "0", CONNECTION_INFO_ENV: info_path}
        # As pyspark starts it: its stdin is a pipe from this process, and the JVM exits when
        # the pipe closes, that is when this process ends, however it ends. A stop is this
        # process's to carry out, not the JVM's: a Ctrl-C at a terminal signals the whole
        # process group (pyspark ignores SIGINT in its JVM too), and so do GNU timeout,
        # systemd's default kill mode and `kill -- -PGID` with SIGTERM, on which the JVM ran
        # Spark's shutdown under the driver's stop, which then failed.
        process = subprocess.Popen(submit_command(home, launch.settings, os.environ), stdin=subprocess.PIPE,
                                   env=env, preexec_fn=_leave_stops_to_the_driver)  # noqa: PLW1509 - before any thread
        return cls(conf, launch, process, info_path)

    def connection(self) -> tuple[int, str] | None:
        """Waits until the JVM's gateway listens: its port and secret; None if the JVM ended."""
        # The JVM renames the file into place once written, so a file found is complete.
        while not os.path.isfile(self._info_path):
            if self.process.poll() is not None:
                return None
            time.sleep(0.01)
        with open(self._info_path, "rb") as handle:
            info = read_connection_info(handle.read())
        shutil.rmtree(os.path.dirname(self._info_path), ignore_errors=True)
        return info

    def stop(self) -> None:
        """Ends the JVM (a session that does not run on it must not leave it running): it
        exits once its stdin closes (it ignores SIGTERM, above)."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(os.path.dirname(self._info_path), ignore_errors=True)


def _leave_stops_to_the_driver() -> None:
    # The JVM keeps a shutdown signal ignored when it starts with it ignored (HotSpot installs
    # no handler for it), so only the driver's handlers see SIGINT and SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


_early: EarlyJvm | None = None


def start_early() -> EarlyJvm | None:
    """Starts the driver's JVM for the session its environment describes, unless pyspark is
    already imported (that process has its own rules: a test's, a session of its own).
    Whatever stops it (a malformed environment, no jars) is left for the session to report."""
    global _early
    if _early is not None or "pyspark" in sys.modules:
        return _early
    try:
        home = spark_home()
        if home is None:
            return None
        conf = initial_conf(contract.DriverEnvironment.from_env(os.environ))
        _early = EarlyJvm.start(conf, prepare(conf, new_jvm=True), home)
    except Exception as error:  # noqa: BLE001 - the session starts its JVM itself, and reports the error
        log.info("the JVM starts with the session instead: %s", error)
    return _early


def take(conf: Mapping[str, str]) -> EarlyJvm | None:
    """The JVM started early, if it was started for ``conf``; one started for any other is
    stopped, since its options (class path, memory, Java options) are fixed at its start."""
    global _early
    early, _early = _early, None
    if early is not None and early.conf != dict(conf):
        log.info("the session's configuration differs from the driver environment's: the JVM started "
                 "for it is stopped, another starts")
        early.stop()
        return None
    return early


def discard() -> None:
    """Stops a JVM started early that no session will take (one already runs)."""
    global _early
    early, _early = _early, None
    if early is not None:
        early.stop()
