"""What the parts of the Telegram channel share: who the bot is, its health, its tasks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from channels.parts import Health as ChannelHealth
from channels.parts import Tasks
from echo_bot.errors import CommitFailed

log = logging.getLogger("channels.telegram")


@dataclass
class Me:
    """The bot itself, once the Bot API said (getMe)."""

    bot_id: int | None = None
    username: str | None = None


@dataclass
class Health(ChannelHealth):
    """The channel's state as /healthz shows it."""

    channel: ClassVar[str] = "telegram"
    standby: bool | None = None  # another daemon polls this bot now (None: not asked)


__all__ = ["CommitFailed", "Health", "Me", "Tasks", "log"]
