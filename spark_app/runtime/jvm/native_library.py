"""RocksDB's native library, unpacked once per machine rather than by every driver.

RocksDB's Java binding carries its native library inside its jar (13 platforms' builds, 15 MB
for Linux on x86-64) and, unless the JVM finds the library on its library path, copies it out
into the JVM's temporary folder the first time the JVM opens a state store: inside a stateful
driver's first batch, every start. Loaded from a folder instead, the load took 0.08 s against
0.20 to 0.25 s on the project's 2-core machine (bench/README.md). The folder is unpacked beside
the class archive, by the same step and for the same JVM and jars (``class_archive.main``: make
setup, the image build), and a new driver's JVM gets it on its library path
(``spark.driver.extraLibraryPath``, which spark-submit puts in LD_LIBRARY_PATH). Without the
folder, or if the library in it does not load, RocksDB copies its own out as before.

Linux only: elsewhere the JDK looks a library name up under another file name than the jar's.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import zipfile
from pathlib import Path

ROCKSDB_JAR = "rocksdbjni-*.jar"


def rocksdb_library_name(system: str, machine: str, musl: bool) -> str | None:
    """The file RocksDB's loader looks for on the library path (its ``rocksdbjni-<platform>``
    name, mapped by the JDK to ``lib….so``), as its jar names it; None off Linux."""
    if system != "Linux":
        return None
    arch = {"x86_64": "64", "amd64": "64", "aarch64": "-aarch64", "arm64": "-aarch64", "ppc64le": "-ppc64le",
            "s390x": "-s390x", "riscv64": "-riscv64"}.get(machine)
    if arch is None:
        return None
    return f"librocksdbjni-linux{arch}{'-musl' if musl else ''}.so"


def _this_platforms_name() -> str | None:
    # musl told from glibc by musl's dynamic loader; a wrong guess names a file RocksDB's
    # loader does not look for, and it copies its own out as before.
    musl = bool(glob.glob("/lib/ld-musl-*")) or bool(glob.glob("/usr/lib/ld-musl-*"))
    return rocksdb_library_name(platform.system(), platform.machine(), musl)


def library_path(folder: Path) -> str | None:
    """``folder`` if it holds this platform's library (unpacked by ``unpack``), else None."""
    name = _this_platforms_name()
    return str(folder) if name is not None and (folder / name).is_file() else None


def unpack(folder: Path, jar_folders: list[str]) -> Path | None:
    """Copies this platform's library out of RocksDB's jar into ``folder``, unless it is
    there; returns the file, or None when there is no jar or no library for this platform in
    it. The jar is the first in ``jar_folders``, given in the order of the driver's class
    path, so that the library matches the binding the JVM loads. A partial copy is never seen
    under the library's name (written aside, then renamed)."""
    name = _this_platforms_name()
    jars = [path for f in jar_folders for path in sorted(glob.glob(os.path.join(f, ROCKSDB_JAR)))]
    if name is None or not jars:
        return None
    target = folder / name
    if target.is_file():
        return target
    with zipfile.ZipFile(jars[0]) as jar:
        if name not in jar.namelist():
            return None
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{name}.{os.getpid()}"
        with jar.open(name) as source, open(partial, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    os.replace(partial, target)
    return target
