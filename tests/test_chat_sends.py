"""ChatSends' memory of the parts already sent: kept for a send tried again, bounded for
the sends that failed for good (never tried again) over a daemon's months."""

from __future__ import annotations

from typing import Any

import pytest

from channels.slack.formatting import SlackText
from echo_bot import chat_sends
from echo_bot.background import Tasks
from echo_bot.chat_sends import ChatSends
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundMessage
from echo_bot.secrets import Masker

TO = Address(channel="slack", chat_id="C1")


class SecondPartRefused:
    """A network that takes every message's first part and none of its second."""

    renderer = SlackText(limit=40, wire_limit=40)

    def __init__(self) -> None:
        self.posted: list[str] = []  # the keys of the messages it took

    async def post(self, to: Address, part: str, key: str, **_: object) -> str:
        if key.endswith(".1"):
            raise ChannelError("the network is away", retryable=True)
        self.posted.append(key)
        return f"m{len(self.posted)}"

    async def edit(self, to: Address, message_id: str, part: str, key: str, **_: object) -> None:
        raise AssertionError("no previews here")

    async def remove(self, to: Address, message_id: str) -> None:
        raise AssertionError("no previews here")

    def has_spare(self, to: Address, editing: bool) -> bool:
        return False


async def _send(sends: ChatSends[str], message: OutboundMessage) -> None:
    with pytest.raises(ChannelError):
        await sends.send(message, edit=_never, prompt=_never, upload=_never)


async def _never(*_: object) -> Any:
    raise AssertionError("not this kind")


async def test_the_parts_sent_of_failed_sends_are_remembered_newest_first_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chat_sends, "MAX_KEPT", 3)
    chat = SecondPartRefused()
    sends: ChatSends[str] = ChatSends(chat, Masker(), Tasks(), interval=1.0)
    long = "word " * 12  # two parts of at most 40 characters
    messages = [OutboundMessage(to=TO, text=long) for _ in range(5)]
    for message in messages:
        await _send(sends, message)
    assert chat.posted == [f"{m.id}.0" for m in messages]

    # The newest three are remembered: tried again, their first part is not posted twice.
    for message in messages[2:]:
        await _send(sends, message)
    assert len(chat.posted) == 5
    # The oldest were forgotten (a send that failed for good is not tried again): tried
    # again after all, its first part goes once more.
    await _send(sends, messages[0])
    assert chat.posted[-1] == f"{messages[0].id}.0"
    assert len(sends._sent) <= 3  # the memory stays bounded
