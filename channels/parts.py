"""What every channel's parts share: the channel's health as /healthz shows it, and its
background tasks, cancelled together when it stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class Health:
    """A channel's state as /healthz shows it; a channel subclasses it with its name
    (and any facts of its own)."""

    channel: ClassVar[str] = "channel"
    status: str = "starting"
    last_error: str | None = None

    def degrade(self, error: str) -> None:
        """Degraded by ``error``; logged once until the error changes."""
        if self.status != "degraded" or self.last_error != error:
            logging.getLogger(f"channels.{self.channel}").warning(
                "%s: %s (retrying)", self.channel, error
            )
        self.status, self.last_error = "degraded", error


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
