"""What the parts of the Telegram channel share: who the bot is, its health, its tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from echo_bot.errors import EchoBotError

log = logging.getLogger("channels.telegram")


class CommitFailed(EchoBotError):
    """The inbox did not take an update: it must not be acknowledged."""


@dataclass
class Me:
    """The bot itself, once the Bot API said (getMe)."""

    bot_id: int | None = None
    username: str | None = None


@dataclass
class Health:
    """The channel's state as /healthz shows it."""

    status: str = "starting"
    last_error: str | None = None
    standby: bool | None = None  # another daemon polls this bot now (None: not asked)

    def degrade(self, error: str) -> None:
        if self.status != "degraded" or self.last_error != error:
            log.warning("telegram: %s (retrying)", error)
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
