"""The typing indicator, for every channel that has one: it shows in a chat from the
moment a message there is committed until its reply is on its way (the reply sent, or a
preview of it shown), however many of the chat's turns are queued.

The channel says only how its network shows typing once (``ShowsTyping.show_typing``:
one notification, and how long until the next may go); this keeps the state every such
channel needs: one indicator per chat, the turns it shows for, renewed for as long as
one of them waits, and never longer than TYPING_MAX after anything moved in the chat (a
turn waiting on something slow does not type for ever). A typing indicator is never
worth a failure: a channel's error ends that chat's indicator quietly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from .bus import ShowsTyping
from .events import Address, OutboundMessage

log = logging.getLogger(__name__)

TYPING_MAX = 120.0  # seconds after the chat last moved (a message in, a reply out)
CHATS_MAX = 1000  # chats shown typing at once, at most
TURNS_MAX = 100_000  # queued turns remembered for them, at most


@dataclass
class _Chat:
    """One chat's indicator: the turns it shows for, until when, its task."""

    turns: set[str] = field(default_factory=set)
    until: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class TypingShown:
    """The channels that show typing, and the chats shown typing now."""

    def __init__(self) -> None:
        self._channels: dict[str, ShowsTyping] = {}
        self._chats: dict[Address, _Chat] = {}
        self._turns: dict[str, Address] = {}  # inbound id → its chat

    def add(self, channel: ShowsTyping) -> None:
        self._channels[channel.name] = channel

    async def remove(self, name: str) -> None:
        """The channel stops: its indicators end (their last notification is not sent)."""
        self._channels.pop(name, None)
        tasks = [c.task for a, c in self._chats.items() if a.channel == name and c.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def start(self, chat: Address, inbound_id: str) -> None:
        """A message of ``chat`` was committed: its turn waits for its reply."""
        channel = self._channels.get(chat.channel)
        if channel is None:
            return
        state = self._chats.get(chat)
        if state is None:
            if len(self._chats) >= CHATS_MAX:
                return
            state = self._chats[chat] = _Chat()
        state.until = time.monotonic() + TYPING_MAX
        if len(self._turns) < TURNS_MAX:
            state.turns.add(inbound_id)
            self._turns[inbound_id] = chat
        if state.task is None and state.turns:
            state.task = asyncio.create_task(self._keep(channel, chat, state))

    def stop_for(self, message: OutboundMessage) -> None:
        """``message`` goes out: the turn it answers shows something now."""
        self.stop(str(message.metadata.get("inbound_id", "")))

    def stop(self, inbound_id: str) -> None:
        """The turn of ``inbound_id`` shows something now (its reply, or a preview)."""
        chat = self._turns.pop(inbound_id, None)
        state = self._chats.get(chat) if chat is not None else None
        if chat is None or state is None:
            return
        state.turns.discard(inbound_id)
        state.until = time.monotonic() + TYPING_MAX  # the chat moves on: keep showing it
        if not state.turns:
            del self._chats[chat]  # at once: a message arriving now starts a fresh one
            state.done.set()

    async def _keep(self, channel: ShowsTyping, chat: Address, state: _Chat) -> None:
        shown = False
        try:
            while state.turns and time.monotonic() < state.until:
                wait = await channel.show_typing(chat, True)
                if wait is None:
                    return  # refused there: this chat shows no typing
                shown = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(wait, state.until - time.monotonic())):
                        await state.done.wait()
        except Exception as exc:  # never worth a failure
            log.debug("typing in %s failed: %s", chat, exc)
        finally:
            self._forget(chat, state)
        if shown:
            with contextlib.suppress(Exception):
                await channel.show_typing(chat, False)

    def _forget(self, chat: Address, state: _Chat) -> None:
        if self._chats.get(chat) is state:
            del self._chats[chat]
        for inbound_id in state.turns:
            self._turns.pop(inbound_id, None)
        state.turns.clear()
