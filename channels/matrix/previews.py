"""A reply shown while it is written: one message, sent with the first text and edited
(``m.replace``) as it grows, then replaced by the reply itself (``PreviewSink``).

Matrix has no drafts, and a homeserver counts an edit as a message (Synapse's
``rc_message``), so previews are paced hard and take only spare budget: one edit per
EDIT_INTERVAL per reply, none while the room's or the account's sends wait (a send in
progress, a recent ``M_LIMIT_EXCEEDED``), and a refused preview is never tried again —
the texts in between are simply skipped. The reply itself comes through the outbox as
every message does and takes the place of its preview (outbound.py edits it into the
final text); a preview left by a turn that sent no reply (it waits for an approval, or
failed) is redacted after PREVIEW_KEEP unless the turn's next step writes on in it.

A crash mid-stream leaves the preview message as it was (ending in PREVIEW_MARK); the
reply is then sent as a new message after the restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nio import AsyncClient

from echo_bot.bus import ChannelHost
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundKind, OutboundMessage

from .common import Tasks, log
from .formatting import contents, replacement
from .typing import Typing

EDIT_INTERVAL = 3.0  # seconds between two texts of one preview
PREVIEW_MARK = " ✍️"  # ends the preview message while the reply is written
PREVIEW_KEEP = 30.0  # seconds a preview no reply took the place of is kept, then redacted
PREVIEWS_MAX = 1000  # previews at once, at most

# Outbound.send_preview: one event sent from spare budget (its ID), or None when the
# room's or the account's sends wait now.
SendPreview = Callable[[str, dict[str, Any], str], Awaitable[str | None]]


@dataclass
class _Preview:
    room_id: str
    event_id: str | None = None  # the preview message, once sent
    sent: int = 0  # texts sent (each with a transaction ID of its own)
    next_at: float = 0.0  # the loop's time before which no new text is sent
    broken: bool = False  # the homeserver refused it: this reply is not previewed further
    redaction: asyncio.Task[None] | None = None  # a left preview's, until a reply comes


class Previews:
    def __init__(
        self,
        host: ChannelHost,
        client: AsyncClient,
        send: SendPreview,
        typing: Typing,
        tasks: Tasks,
        synced: asyncio.Event,
    ) -> None:
        self.masker = host.masker
        self.client = client
        self.send = send
        self.typing = typing
        self.tasks = tasks
        self.synced = synced
        self._live: dict[str, _Preview] = {}  # by key (the turn's inbound id)
        self._left: dict[str, _Preview] = {}  # previews ended without a reply, by key

    async def show_preview(self, to: Address, key: str, text: str) -> None:
        if not self.synced.is_set():  # rooms unknown yet (or another daemon syncs)
            return
        state = self._state(to.chat_id, key)
        if state is None or state.broken:
            return
        loop = asyncio.get_running_loop()
        wait = state.next_at - loop.time()
        if wait > 0:  # returns when ready for the next: the texts in between are skipped
            await asyncio.sleep(wait)
        state.next_at = loop.time() + EDIT_INTERVAL
        content = contents(text + PREVIEW_MARK, True, self.masker)[0]
        if state.event_id is not None:
            content = replacement(state.event_id, content)
        self.typing.stop(key)
        try:
            event_id = await self.send(state.room_id, content, f"{key}.preview.{state.sent}")
        except ChannelError as exc:
            if not exc.retryable or exc.retry_after is not None:
                state.broken = True  # a preview is never worth a refused send
                log.info("matrix: preview in %s given up: %s", state.room_id, exc)
            return
        if event_id is None:  # no spare budget now: the next text tries again
            return
        state.sent += 1
        if state.event_id is None:
            state.event_id = event_id

    def _state(self, room_id: str, key: str) -> _Preview | None:
        """The preview of ``key``: the live one, the one its turn's last step left (the
        next step writes on in it), or a new one (None when too many are live)."""
        state = self._live.get(key)
        if state is None and key in self._left:
            state = self._live[key] = self._left.pop(key)
            if state.redaction is not None:
                state.redaction.cancel()
                state.redaction = None
        if state is None:
            if len(self._live) >= PREVIEWS_MAX:
                return None
            state = self._live[key] = _Preview(room_id)
        return state

    async def end_preview(self, to: Address, key: str) -> None:
        state = self._live.pop(key, None)
        if state is None or state.event_id is None:
            return
        if len(self._left) >= PREVIEWS_MAX:  # kept as it is rather than unbounded
            return
        self._left[key] = state
        state.redaction = self.tasks.spawn(self._redact_later(key, state))

    async def _redact_later(self, key: str, state: _Preview) -> None:
        await asyncio.sleep(PREVIEW_KEEP)
        if self._left.get(key) is not state or state.event_id is None:
            return
        del self._left[key]
        try:
            why = "a preview of a reply that was not sent"
            await self.client.room_redact(state.room_id, state.event_id, reason=why)
        except Exception as exc:  # a preview is never worth a failure
            log.info("matrix: a preview in %s was not redacted: %s", state.room_id, exc)

    def message_of(self, message: OutboundMessage) -> str | None:
        """The preview message a reply takes the place of, if its turn left one."""
        if message.kind != OutboundKind.REPLY or message.file is not None:
            return None
        state = self._left.get(str(message.metadata.get("inbound_id", "")))
        if state is None or state.room_id != message.to.chat_id:
            return None
        if state.redaction is not None:  # the reply edits it: kept until that worked
            state.redaction.cancel()
            state.redaction = None
        return state.event_id

    def replaced(self, message: OutboundMessage) -> None:
        """The reply took (or gave up taking) the place of its preview message."""
        self._left.pop(str(message.metadata.get("inbound_id", "")), None)
