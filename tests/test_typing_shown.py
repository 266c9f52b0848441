"""The host's typing indicator: one per chat however many turns wait, renewed as the
channel asks, ended when the last turn's reply goes out, never after a refusal."""

from __future__ import annotations

import asyncio

from echo_bot.events import Address, OutboundMessage
from echo_bot.typing_shown import TypingShown
from tests.waiting import eventually

ROOM = Address(channel="net", chat_id="room")
OTHER = Address(channel="net", chat_id="other")


class Network:
    """A channel that records each typing notification; ``refuse`` makes it answer None."""

    name = "net"

    def __init__(self, every: float = 0.05, refuse: bool = False) -> None:
        self.every, self.refuse = every, refuse
        self.shown: list[tuple[str, bool]] = []

    async def show_typing(self, to: Address, on: bool) -> float | None:
        self.shown.append((to.chat_id, on))
        return None if self.refuse else self.every


def reply_to(inbound_id: str) -> OutboundMessage:
    return OutboundMessage(to=ROOM, text="done", metadata={"inbound_id": inbound_id})


async def test_one_indicator_per_chat_renewed_until_the_last_turns_reply_goes() -> None:
    typing, net = TypingShown(), Network()
    typing.add(net)
    typing.start(ROOM, "a")
    typing.start(ROOM, "b")  # queued behind a: the same indicator
    await eventually(lambda: net.shown.count(("room", True)) >= 3, what="renewals")
    typing.stop_for(reply_to("a"))
    await asyncio.sleep(0.12)
    assert ("room", False) not in net.shown  # b still waits
    typing.stop_for(reply_to("b"))
    await eventually(lambda: ("room", False) in net.shown, what="typing ended")
    ended = len(net.shown)
    await asyncio.sleep(0.12)
    assert len(net.shown) == ended  # nothing after the end


async def test_each_chat_its_own_and_a_channel_not_added_shows_nothing() -> None:
    typing, net = TypingShown(), Network(every=10)
    typing.add(net)
    typing.start(ROOM, "a")
    typing.start(OTHER, "b")
    typing.start(Address(channel="elsewhere", chat_id="x"), "c")
    await eventually(lambda: len(net.shown) == 2, what="both chats typing")
    assert sorted(net.shown) == [("other", True), ("room", True)]
    await typing.remove("net")
    assert ("room", False) not in net.shown  # a stopped channel is not called again


async def test_a_refusal_ends_that_chats_indicator_without_an_end_call() -> None:
    typing, net = TypingShown(), Network(refuse=True)
    typing.add(net)
    typing.start(ROOM, "a")
    await eventually(lambda: net.shown == [("room", True)], what="one try")
    await asyncio.sleep(0.1)
    assert net.shown == [("room", True)]
    typing.start(ROOM, "b")  # a new message tries again
    await eventually(lambda: len(net.shown) == 2, what="a fresh try")
