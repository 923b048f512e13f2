"""The sync/async bridge: a private event loop driven by whoever calls ``run``.

rstream is an asyncio library and the callers are synchronous (the daemon's threads,
Spark Python workers). Every adapter call and every range read owns one ``Loop``, so it
works from a thread without a loop and even from a thread that is running one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Loop:
    """A private event loop, driven by whoever calls ``run``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def run(self, coro: Awaitable[T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coro)
        # Called from a coroutine of some other loop: drive ours on a helper thread.
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rabbit-loop")
        return self._pool.submit(self._loop.run_until_complete, coro).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def _drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=2)

        try:
            self.run(_drain())
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
        self._loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
