"""SIGTERM and SIGINT stop a driver whenever they arrive.

A signal handler runs on the main thread between two of its bytecodes, wherever it is. The
driver's main thread waits for a stop request in a loop; a handler that took a lock the
main thread held at that moment (the stop event's, which Event.wait and Event.set hold for
a moment) waited for its own thread for ever. GNU timeout, which signals the process and
then its group, hung three drivers so on 2026-12-06.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from spark_app.runtime.stop_requests import StopRequests

# The driver's supervision loop with no query. A SIGTERM is raised at each line the main
# thread runs in the threading module's waits and wake-ups (Event.wait, Condition.wait,
# Event.set, notify: the lines that run with a lock held) and at each line its handler runs
# there; a driver whose main thread runs none of them gets one plain SIGTERM after 2 s.
SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading
    from spark_app.runtime.driver import Driver, RunOptions

    driver = Driver(pipeline=None, config=None, options=RunOptions())
    driver._install_signal_handlers()
    raised = 0
    LOCKED = {"wait", "set", "notify", "notify_all", "_acquire_restore", "_release_save", "__enter__", "__exit__"}

    def trace(frame, event, arg):
        global raised
        if frame.f_code.co_filename != threading.__file__ or frame.f_code.co_name not in LOCKED:
            return None
        if event == "line" and raised < 200:
            raised += 1
            signal.raise_signal(signal.SIGTERM)
        return trace

    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    sys.settrace(trace)
    driver._supervise()
    sys.settrace(None)
    print("stopped:", driver._stops.reason, flush=True)
""")


def test_sigterm_at_any_moment_of_the_drivers_wait_stops_it_and_never_hangs_it() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"the driver hung in its signal handler: {hung.stdout!r}") from None
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stopped: received SIGTERM", done.stdout


def test_a_stop_requested_by_another_thread_ends_the_main_threads_wait_at_once() -> None:
    stops = StopRequests()
    began = time.monotonic()
    assert stops.wait(0.05) is False and time.monotonic() - began >= 0.05
    threading.Timer(0.1, stops.request, ("all available input is processed",)).start()
    began = time.monotonic()
    assert stops.wait(30) is True and time.monotonic() - began < 10
    stops.request("received SIGTERM")
    assert stops.reason == "all available input is processed"  # the first reason stands
