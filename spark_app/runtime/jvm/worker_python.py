"""The Python that Spark starts for its workers: this interpreter, importing the installed pyspark.

Spark starts each Python process of its own (the task daemon, the data-source planners,
the streaming-source runner) with a PYTHONPATH that begins with
``$SPARK_HOME/python/lib/pyspark.zip``, py4j's zip and the spark-core jar. When pyspark
is installed with pip, ``$SPARK_HOME`` is the installed package, so these are copies of
what the interpreter already has. Imported from a zip, pyspark is compiled from source in
every process (0.7 s of CPU each on our 2-core machine, and a driver starts five such
processes), and every task re-reads the zips' directories when it refreshes the import
caches (about 0.1 s a task). Run as ``spark-app-python``, this module drops those copies
from PYTHONPATH and then executes the interpreter with the arguments Spark gave, so that
workers import the installed, compiled pyspark. Entries that are not copies (the user's
own, a separate Spark distribution's) are kept, in order.

This module imports only the standard library, since it runs before every Python worker
(with the package's own ``__init__``, the launcher costs about 0.08 s a process).
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable
from pathlib import Path

LAUNCHER_NAME = "spark-app-python"


def without_bundled_copies(pythonpath: str, pyspark_dirs: Iterable[str]) -> str:
    """``pythonpath`` without the entries that lie inside an installed pyspark package."""
    inside = tuple(os.path.join(os.path.realpath(d), "") for d in pyspark_dirs)
    if not inside:
        return pythonpath
    kept = [entry for entry in pythonpath.split(os.pathsep)
            if not os.path.realpath(entry).startswith(inside)]
    return os.pathsep.join(kept)


def installed_pyspark_dirs() -> list[str]:
    """The pyspark packages this interpreter imports without PYTHONPATH (normally one)."""
    folders = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    return [str(Path(f) / "pyspark") for f in folders if (Path(f) / "pyspark" / "__init__.py").is_file()]


def worker_python() -> str:
    """What PYSPARK_PYTHON should name: the launcher beside this interpreter if it was
    installed with the package, else the interpreter itself."""
    launcher = Path(sys.executable).with_name(LAUNCHER_NAME)
    return str(launcher) if os.access(launcher, os.X_OK) else sys.executable


def main() -> None:
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        os.environ["PYTHONPATH"] = without_bundled_copies(pythonpath, installed_pyspark_dirs())
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
