"""What the parts of the Discord channel share: the log, and how a Discord channel (a
DM, a guild channel, a thread) is written as an echo-bot address."""

from __future__ import annotations

import logging

from echo_bot.events import Address

log = logging.getLogger("channels.discord")


def address_of(channel_id: int | str) -> Address:
    """``discord:<channel>``: a thread has a channel ID of its own, so it is a
    conversation of its own."""
    return Address(channel="discord", chat_id=str(channel_id))
