"""What the parts of the Telegram channel share: who the bot is, its tasks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from channels.parts import Tasks
from echo_bot.errors import CommitFailed

log = logging.getLogger("channels.telegram")


@dataclass
class Me:
    """The bot itself, once the Bot API said (getMe)."""

    bot_id: int | None = None
    username: str | None = None


__all__ = ["CommitFailed", "Me", "Tasks", "log"]
