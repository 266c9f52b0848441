"""What the parts of the Matrix channel share: the log, health, background tasks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from channels.parts import Health as ChannelHealth
from channels.parts import Tasks
from echo_bot.errors import EchoBotError

log = logging.getLogger("channels.matrix")


class CommitFailed(EchoBotError):
    """The inbox did not take an event: the sync token must not move past it."""


@dataclass
class Health(ChannelHealth):
    channel: ClassVar[str] = "matrix"
    rate_limited: int = 0  # M_LIMIT_EXCEEDED answers seen (each waited out)
    standby: bool | None = None  # another daemon syncs this account now (None: not asked)


__all__ = ["CommitFailed", "Health", "Tasks", "log"]
