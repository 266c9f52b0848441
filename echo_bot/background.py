"""A part's background tasks, cancelled together when it stops (a channel's loops, a
preview's removal)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Tasks:
    """The channel's background tasks, cancelled together when it stops."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def running(self) -> list[asyncio.Task[Any]]:
        return list(self._tasks)

    async def cancel_all(self) -> None:
        running = self.running()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
