"""A class-data-sharing archive of a driver's JVM classes, so that a driver starts sooner.

Before its first batch a Spark driver loads and verifies tens of thousands of classes
(Spark, Delta Lake, Hadoop, the RocksDB bindings, and the classes Spark generates), and a
restarted driver is a new JVM that does it all again. The JDK can instead map classes
that an earlier JVM dumped (class data sharing: ``-XX:ArchiveClassesAtExit`` records,
``-XX:SharedArchiveFile`` maps). ``create`` records an archive by running a small
pipeline (``class_archive_workload``) that touches what drivers use; ``java_options``
gives a new driver the archive recorded for its JVM and class path, or nothing, in which
case the driver loads its classes as usual. An archive is only ever used by the exact JVM
and jars it was recorded with: its file name is a hash of both.

``make setup`` records the archive once per machine, into the user-level cache; run
``python -m spark_app.runtime.jvm.class_archive`` to record one elsewhere (the folder comes
from $SPARK_APP_CLASS_ARCHIVES). The same step unpacks RocksDB's native library beside it
(``native_library``), for the same JVM and jars.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_app import contract
from spark_app.runtime.jvm import native_library
from spark_app.runtime.jvm.jars import jars_dir, spark_home

log = logging.getLogger("spark_app")

ARCHIVES_ENV = contract.CLASS_ARCHIVES
_WORKLOAD = Path(__file__).resolve().parents[2] / "class_archive_workload.py"


def archives_folder() -> Path:
    """$SPARK_APP_CLASS_ARCHIVES, else the repository's .cache/class-archives."""
    configured = os.environ.get(ARCHIVES_ENV)
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / ".cache" / "class-archives"


def archive_path(jars: str, folder: Path | None = None) -> Path | None:
    """Where the archive for this JVM and these jars lives (None: no java to key it by)."""
    key = _key(jars)
    return None if key is None else (folder or archives_folder()) / f"{key}.jsa"


def java_options(archive: Path | None) -> str:
    """The JVM options that map ``archive`` (from ``archive_path``), or "" if it was not recorded."""
    if archive is None or not archive.is_file():
        return ""
    # auto: should the archive fail to map, the JVM loads its classes as usual.
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto"


def library_path(archive: Path | None) -> str | None:
    """The folder of native libraries unpacked beside ``archive`` (from ``archive_path``:
    the same JVM and jars), or None."""
    return None if archive is None else native_library.library_path(_native_folder(archive))


def _native_folder(archive: Path) -> Path:
    return archive.with_suffix(".native")


def create(target: Path) -> Path | None:
    """Records the archive at ``target`` (from ``archive_path``) unless it exists; returns
    its path, or None when this JVM cannot record one (the reason is logged)."""
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    conf = {"spark.master": "local[2]", "spark.ui.enabled": "false",
            "spark.driver.defaultJavaOptions": f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=error"}
    with tempfile.TemporaryDirectory(prefix="spark_app-class-archive-") as work:
        # Nothing of a surrounding driver's injected configuration: the workload has its own.
        env = {k: v for k, v in os.environ.items() if k not in contract.ALL} | {contract.SPARK_CONF: json.dumps(conf)}
        logfile = Path(work) / "workload.log"
        with open(logfile, "wb") as out:
            result = subprocess.run(
                [sys.executable, "-m", "spark_app.class_archive_workload", work],
                env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
            )
        if result.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            tail = logfile.read_text(errors="replace")[-2000:]
            log.warning("could not record a class archive (exit %d); drivers will start without one:\n%s",
                        result.returncode, tail)
            return None
    os.replace(partial, target)
    return target


def _key(jars: str) -> str | None:
    """A hash of the JVM spark-submit will start, of every jar on the driver's class path and of
    the workload the archive is recorded from."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    java = os.path.realpath(java)
    # Spark's version is in its jars' names, hashed below.
    parts = [java, _stat(java), _stat(os.path.join(os.path.dirname(os.path.dirname(java)), "lib", "server",
                                                  "libjvm.so"))]
    # What the archive holds follows the workload: a changed workload records a new one.
    parts.append(hashlib.sha256(_WORKLOAD.read_bytes()).hexdigest())
    home = spark_home()
    for folder in ([os.path.join(home, "jars")] if home else []) + [jars]:
        parts.append(os.path.realpath(folder))
        parts.extend(f"{entry.name}:{entry.stat().st_size}" for entry in sorted(os.scandir(folder), key=lambda e: e.name)
                     if entry.name.endswith(".jar"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _stat(path: str) -> str:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "-"
    return f"{info.st_size}:{int(info.st_mtime)}"


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    target = archive_path(jars_dir())
    if target is None:
        log.warning("no java found (JAVA_HOME or PATH): no class archive recorded")
        return 0
    # The driver's class path: the jars folder (extraClassPath) ahead of Spark's own.
    home = spark_home()
    library = native_library.unpack(_native_folder(target), [jars_dir()] + ([os.path.join(home, "jars")] if home else []))
    if library is not None:
        print(f">>> RocksDB's native library ready: {library}")
    if target.is_file():
        print(f">>> class archive ready: {target}")
        return 0
    print(">>> recording the driver JVM's class archive (first time only; about a minute)", flush=True)
    created = create(target)
    if created is not None:
        print(f">>> class archive ready: {created} ({created.stat().st_size // 2**20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
