"""What the parts of the Slack channel share: the log, health, background tasks, and
how a Slack conversation (and thread) is written as an echo-bot address."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

from channels.parts import Health as ChannelHealth
from channels.parts import Tasks
from echo_bot.errors import CommitFailed, EchoBotError
from echo_bot.events import Address

log = logging.getLogger("channels.slack")


class Unreachable(EchoBotError):
    """Slack did not answer, or failed on its side (a 5xx): tried again later, never a
    reason to stop."""


@dataclass
class Health(ChannelHealth):
    channel: ClassVar[str] = "slack"
    rate_limited: int = 0  # HTTP 429 answers seen (each waited out)
    transport: str = ""  # "socket" or "http"
    away: dict[str, str] = field(default_factory=dict)  # part ("web", "socket") → error

    def lost(self, part: str, error: str) -> None:
        """``part`` of the connection to Slack cannot reach it now."""
        self.away[part] = error
        self.degrade(error)

    def regained(self, part: str) -> None:
        """``part`` reached Slack again: healthy once no part is away."""
        if self.away.pop(part, None) is None:
            return
        if self.away:
            self.status, self.last_error = "degraded", next(iter(self.away.values()))
        elif self.status == "degraded":
            log.info("slack: connected again")
            self.status, self.last_error = "ok", None


def address_of(channel: str, thread_ts: str | None = None) -> Address:
    """``slack:<conversation>[:<thread ts>]``: a thread is a conversation of its own."""
    return Address(channel="slack", chat_id=channel, thread_id=thread_ts or None)


__all__ = ["CommitFailed", "Health", "Tasks", "Unreachable", "address_of", "log"]
