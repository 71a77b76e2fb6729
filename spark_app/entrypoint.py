"""The container entrypoint of the spark-app image, for drivers and Spark executors.

    driver PIPELINE.py [ARGS...]    run a pipeline file (the operator's driver pods)
    driver -m MODULE [ARGS...]      run a pipeline module
    executor                        a Spark-on-Kubernetes executor (Spark's own contract)
    anything else                   executed as a command

The local cluster's node agent maps the image name to this same module, so the demo and
the tests run the real entrypoint.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys
import tempfile

from spark_app import contract
from spark_app.runtime import reporting
from spark_app.runtime.jvm import launch
from spark_app.runtime.jvm.jars import spark_home
from spark_app.runtime.jvm.worker_python import worker_python


def run_pipeline(target: str, args: list[str], module: bool = False) -> int:
    """Runs a pipeline file or module as __main__; returns the exit code it ends with. The
    session's JVM starts first, while the pipeline's imports run (``launch.start_early``)."""
    # A crash in native code (librdkafka, Arrow) then leaves every thread's Python stack on
    # stderr, in the driver's log, instead of a bare exit code -11.
    faulthandler.enable()
    os.environ[contract.PIPELINE_FILE] = target  # read back with the rest of the driver's environment
    sys.argv = [target, *args]
    try:
        if module:
            _start_early()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            if not os.path.exists(target):
                message = f"pipeline file {target} does not exist"
                print(message, file=sys.stderr)
                contract.write_termination_message(
                    message, os.environ.get(contract.TERMINATION_LOG_PATH) or contract.TERMINATION_LOG)
                return contract.EXIT_MISCONFIGURED
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            _start_early()
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return contract.EXIT_OK


def _start_early() -> None:
    """What a driver can start before its pipeline runs: the JVM, then (in a pod) the import of
    the Kubernetes client it reports with, which the JVM's start leaves time for."""
    launch.start_early()
    reporting.import_client_early()


def _exec_executor() -> None:
    """Starts a Spark executor the way Spark's Kubernetes entrypoint.sh does."""
    home = spark_home()
    if home is None:
        raise SystemExit("no Spark found: set SPARK_HOME, or install pyspark")
    jars = os.path.join(home, "jars", "*")
    extra = os.environ.get(contract.JARS_DIR)
    classpath = ":".join([jars] + ([os.path.join(extra, "*")] if extra else []) +
                         ([os.environ["SPARK_EXTRA_CLASSPATH"]] if os.environ.get("SPARK_EXTRA_CLASSPATH") else []))
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    java_opts = [v for k, v in sorted(os.environ.items()) if k.startswith("SPARK_JAVA_OPT_")]
    command = [
        java, *java_opts,
        f"-Xms{os.environ.get('SPARK_EXECUTOR_MEMORY', '1g')}", f"-Xmx{os.environ.get('SPARK_EXECUTOR_MEMORY', '1g')}",
        "-cp", classpath,
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", os.environ["SPARK_DRIVER_URL"],
        "--executor-id", os.environ["SPARK_EXECUTOR_ID"],
        "--cores", os.environ.get("SPARK_EXECUTOR_CORES", "1"),
        "--app-id", os.environ["SPARK_APPLICATION_ID"],
        "--hostname", os.environ.get("SPARK_EXECUTOR_POD_IP", "127.0.0.1"),
        "--resourceProfileId", os.environ.get("SPARK_RESOURCE_PROFILE_ID", "0"),
        "--podName", os.environ.get("SPARK_EXECUTOR_POD_NAME", ""),
    ]
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    # Executors download the application's files and jars into their working directory;
    # give them a scratch one, as Spark's own image does with /opt/spark/work-dir.
    work_dir = os.environ.get(contract.EXECUTOR_WORK_DIR) or tempfile.mkdtemp(prefix="spark-executor-")
    os.makedirs(work_dir, exist_ok=True)
    os.chdir(work_dir)
    os.execvp(command[0], command)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "driver":
        if rest[:1] == ["-m"]:
            return run_pipeline(rest[1], rest[2:], module=True)
        if not rest:
            print("driver needs a pipeline file", file=sys.stderr)
            return contract.EXIT_MISCONFIGURED
        return run_pipeline(rest[0], rest[1:])
    if command == "executor":
        _exec_executor()
    os.execvp(command, argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
