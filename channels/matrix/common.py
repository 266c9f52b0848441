"""What the parts of the Matrix channel share: the log, health, background tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from echo_bot.errors import EchoBotError

log = logging.getLogger("channels.matrix")


class CommitFailed(EchoBotError):
    """The inbox did not take an event: the sync token must not move past it."""


@dataclass
class Health:
    status: str = "starting"
    last_error: str | None = None
    rate_limited: int = 0  # M_LIMIT_EXCEEDED answers seen (each waited out)

    def degrade(self, error: str) -> None:
        if self.status != "degraded" or self.last_error != error:
            log.warning("matrix: %s (retrying)", error)
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

    async def cancel_all(self) -> None:
        running = list(self._tasks)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
