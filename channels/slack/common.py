"""What the parts of the Slack channel share: the log, background tasks, and how a Slack
conversation (and thread) is written as an echo-bot address."""

from __future__ import annotations

import logging

from channels.parts import Tasks
from echo_bot.errors import CommitFailed
from echo_bot.events import Address

log = logging.getLogger("channels.slack")


def address_of(channel: str, thread_ts: str | None = None) -> Address:
    """``slack:<conversation>[:<thread ts>]``: a thread is a conversation of its own."""
    return Address(channel="slack", chat_id=channel, thread_id=thread_ts or None)


__all__ = ["CommitFailed", "Tasks", "address_of", "log"]
