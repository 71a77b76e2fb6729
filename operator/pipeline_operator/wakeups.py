"""Lets watch events wake the daemon of the pipeline they concern, so that a driver's
death is acted on at once rather than at the next resync."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

Key = tuple[str, str]
"""(namespace, pipeline name)"""


class Wakeups:
    """One flag per pipeline; set by wake(), consumed by sleep(). A wake-up that arrives
    while the daemon is busy is kept, so the next sleep returns at once: none is lost."""

    def __init__(self) -> None:
        self._flags: dict[Key, asyncio.Event] = {}

    def wake(self, key: Key) -> None:
        self._flags.setdefault(key, asyncio.Event()).set()

    async def sleep(self, key: Key, timeout: float, stopped: Awaitable[object]) -> None:
        """Returns after ``timeout`` seconds, on a wake-up, or when ``stopped`` completes."""
        flag = self._flags.setdefault(key, asyncio.Event())
        waiters = [asyncio.ensure_future(flag.wait()), asyncio.ensure_future(_wait(stopped))]
        try:
            await asyncio.wait(waiters, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        flag.clear()

    def forget(self, key: Key) -> None:
        self._flags.pop(key, None)


async def _wait(awaitable: Awaitable[object]) -> None:
    await awaitable
