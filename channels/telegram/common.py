"""What the parts of the Telegram channel share: who the bot is, its tasks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from channels.parts import Tasks
from echo_bot.errors import CommitFailed

log = logging.getLogger("channels.telegram")


@dataclass
class Me:
    """The bot itself, once the Bot API said (getMe)."""

    bot_id: int | None = None
    username: str | None = None


def unreadable(update_id: int, raw: dict[str, Any], exc: Exception) -> None:
    """Say an update aiogram cannot read is skipped: read again, it fails again (and
    Telegram holds the updates after it meanwhile), so it is never handled."""
    kind = next((k for k in raw if k != "update_id"), "?")
    log.warning(
        "telegram: update %s (%s) could not be read, skipped: %s",
        update_id, kind, str(exc).splitlines()[0],
    )  # fmt: skip


__all__ = ["CommitFailed", "Me", "Tasks", "log", "unreadable"]
