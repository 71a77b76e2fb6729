"""Requests to stop a driver, from its signal handlers and its own threads, to its main thread.

A signal handler runs on the main thread between two of its bytecodes, wherever it is,
inside a lock it holds included. The driver's main thread waited for a stop on a
threading.Event every 0.2 s, which holds the event's lock for a moment each time, and its
SIGTERM handler set that event: a signal that came in such a moment, or while an earlier
signal's handler was setting the event, waited for a lock its own thread held, for ever.
GNU timeout, which signals the process and then its group, hung three drivers so
(2026-12-06). A handler here takes no lock: it puts the request in a queue.SimpleQueue,
whose put Python documents as reentrant, and the main thread turns it into the stop as it
waits.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from types import FrameType


class StopRequests:
    def __init__(self) -> None:
        self.requested = threading.Event()
        """Set once a stop is requested: what the driver's other threads wait on."""
        self.reason = ""
        """Why the driver stops: the first request's reason."""
        self._wakeups: queue.SimpleQueue[str] = queue.SimpleQueue()

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """A signal handler (SIGTERM, SIGINT): the request waits for the main thread."""
        self._wakeups.put(f"received {signal.Signals(signum).name}")

    def request(self, reason: str) -> None:
        """A stop the driver's own code asks for, on any thread but in a signal handler."""
        self.reason = self.reason or reason
        self.requested.set()
        self._wakeups.put("")  # the main thread's wait returns at once

    def wait(self, seconds: float) -> bool:
        """The main thread's pause: up to ``seconds``, over as soon as a stop is requested,
        a signal's included. Whether one was."""
        deadline = time.monotonic() + seconds
        while not self.requested.is_set():
            try:
                reason = self._wakeups.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if reason:
                self.request(reason)
        return self.requested.is_set()
