"""Code a driver runs only while it starts, kept from the JVM's optimizing compiler (C2).

A new driver JVM spends its first seconds loading classes, spinning lambdas and method
handles, reading jar manifests and parsing configuration, and HotSpot compiles the hottest
of that code with C2 as it would any other: in a resumed driver's first 7 s on the
project's 2-core machine, C2 spent 4.5 s of a core, 2.9 s of it on 185 such methods (a
JFR recording of compilations, bench/README.md, 2026-12-06). Both cores are busy from the
process's start to its first output, so that work delays the first batch; and the code it
compiles is rarely run again once the driver is up.

``start_up_methods.json`` is a list of compiler directives naming that code, by method or
by package, with C2 excluded. HotSpot then compiles an excluded method with C1 at its full
optimization (tier 1, no profiling) for the rest of the JVM's life, which is what code run
a few thousand times needs. Every other method keeps C2, so a pipeline that runs for days
keeps its fast code (unlike ``-XX:TieredStopAtLevel=1``, which would take C2 away from it
all). Only code of the JVM's and the driver's start belongs in the list: class loading and
spinning, configuration and manifest parsing, Scala signatures, Spark's closure cleaner
and SQL parser.

The JVM refuses to start with a directives file it cannot read, so the options are given
only if the file is there; a user's own ``-XX:CompilerDirectivesFile`` in
``extraJavaOptions`` comes later on the command line and replaces it.
"""

from __future__ import annotations

from pathlib import Path

DIRECTIVES = Path(__file__).with_name("start_up_methods.json")


def java_options(directives: Path = DIRECTIVES) -> str:
    """The JVM options that apply ``directives`` (diagnostic options: HotSpot reads a
    directives file only with them unlocked), or "" if the file is missing."""
    if not directives.is_file():
        return ""
    return f"-XX:+UnlockDiagnosticVMOptions -XX:CompilerDirectivesFile={directives}"
