"""A reply shown while it is written, for a network without drafts (Matrix, Slack): one
message, sent with the first text and edited as it grows, which the reply then takes
the place of (``PreviewSink``). ``chat_sends.ChatSends`` says how to show a text and how
to remove a message, from what the channel's network does; this keeps the state.

Previews are paced hard and take only spare budget, since such a network counts an
edit as a message: one text per ``interval`` per reply, and ``show`` answers None when
the conversation's or the account's sends wait now (the texts in between are simply
skipped). A preview refused for good or rate limited (``ChannelError`` not retryable,
or with ``retry_after``) is not tried again for that reply; a network error only
skips that text.

The reply comes through the outbox as every message does: ``ChatSends.reply`` asks
``message_of`` for the preview it replaces and edits that into the final text, then
calls ``replaced``. A preview left by a turn that sent no reply (it waits for an
approval, or failed) is removed after ``keep`` seconds, unless the turn's next step
writes on in it. A crash mid-stream leaves the preview as it was (ending in the mark);
the reply is then sent as a new message after the restart, and the preview, noted in
the ``ledger``, is removed at the start (``ChatSends.remove_left_over``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .background import Tasks
from .errors import ChannelError
from .events import Address, OutboundKind, OutboundMessage
from .preview_ledger import PreviewLedger

log = logging.getLogger(__name__)

PREVIEWS_MAX = 1000  # previews at once, at most

# show(chat, key, message id or None for the first, text, how many were shown before):
# the message's id, or None when nothing was shown now (no spare budget).
Show = Callable[[Address, str, str | None, str, int], Awaitable[str | None]]
Remove = Callable[[Address, str], Awaitable[None]]  # the left preview message goes


@dataclass
class _Preview:
    chat: Address
    message_id: str | None = None  # the preview message, once sent
    shown: int = 0  # texts shown
    next_at: float = 0.0  # the loop's time before which no new text is shown
    broken: bool = False  # the network refused it: this reply is not previewed further
    removal: asyncio.Task[None] | None = None  # a left preview's, until a reply comes
    # In the keys its sends carry: a preview made after one was removed (its turn waited
    # for an approval) is never the removed one's repeat, which a network that dedupes
    # by key (Matrix's transaction ids) would answer with the removed message.
    tag: str = field(default_factory=lambda: secrets.token_hex(4))


class EditedPreviews:
    def __init__(
        self,
        show: Show,
        remove: Remove,
        tasks: Tasks,
        *,
        interval: float,
        mark: str,
        keep: float,
        ready: Callable[[], bool] = lambda: True,
        ledger: PreviewLedger | None = None,
    ) -> None:
        self.show, self.remove, self.tasks = show, remove, tasks
        self.ledger = ledger  # where the preview messages up are noted (a kill leaves them)
        self.interval, self.mark, self.keep = interval, mark, keep
        self.ready = ready  # False: nothing is shown (the channel cannot send yet)
        self._live: dict[str, _Preview] = {}  # by key (the turn's inbound id)
        self._left: dict[str, _Preview] = {}  # previews ended without a reply, by key

    async def show_preview(self, to: Address, key: str, text: str) -> None:
        if not self.ready():
            return
        state = self._state(to, key)
        if state is None or state.broken:
            return
        loop = asyncio.get_running_loop()
        wait = state.next_at - loop.time()
        if wait > 0:  # returns when ready for the next: the texts in between are skipped
            await asyncio.sleep(wait)
        state.next_at = loop.time() + self.interval
        try:
            message_id = await self.show(
                state.chat, f"{key}.{state.tag}", state.message_id, text + self.mark, state.shown
            )
        except ChannelError as exc:
            if not exc.retryable or exc.retry_after is not None:
                state.broken = True  # a preview is never worth a refused send
                log.info("preview in %s given up: %s", state.chat, exc)
            return
        if message_id is None:  # no spare budget now: the next text tries again
            return
        state.shown += 1
        if state.message_id is None:
            state.message_id = message_id
            if self.ledger is not None:
                self.ledger.up(key, state.chat, message_id)

    def _state(self, to: Address, key: str) -> _Preview | None:
        """The preview of ``key``: the live one, the one its turn's last step left (the
        next step writes on in it), or a new one (None when too many are live)."""
        state = self._live.get(key)
        if state is None and key in self._left:
            state = self._live[key] = self._left.pop(key)
            if state.removal is not None:
                state.removal.cancel()
                state.removal = None
        if state is None:
            if len(self._live) >= PREVIEWS_MAX:
                return None
            state = self._live[key] = _Preview(to)
        return state

    async def end_preview(self, to: Address, key: str) -> None:
        state = self._live.pop(key, None)
        if state is None or state.message_id is None:
            return
        if len(self._left) >= PREVIEWS_MAX:  # kept as it is rather than unbounded
            return
        self._left[key] = state
        state.removal = self.tasks.spawn(self._remove_later(key, state))

    async def _remove_later(self, key: str, state: _Preview) -> None:
        await asyncio.sleep(self.keep)
        if self._left.get(key) is not state or state.message_id is None:
            return
        del self._left[key]
        if self.ledger is not None:
            self.ledger.down(key)
        try:
            await self.remove(state.chat, state.message_id)
        except Exception as exc:  # a preview is never worth a failure
            log.info("a preview in %s was not removed: %s", state.chat, exc)

    def message_of(self, message: OutboundMessage) -> str | None:
        """The preview message a reply takes the place of, if its turn left one."""
        if message.kind != OutboundKind.REPLY or message.file is not None:
            return None
        state = self._left.get(str(message.metadata.get("inbound_id", "")))
        if state is None or state.chat != message.to:
            return None
        if state.removal is not None:  # the reply edits it: kept until that worked
            state.removal.cancel()
            state.removal = None
        return state.message_id

    async def unnote(self, message: OutboundMessage) -> None:
        """Before the reply goes into its preview message: no more noted as a preview
        (``PreviewLedger.down_now``; raises ``ChannelError`` while the store is away)."""
        if self.ledger is not None:
            await self.ledger.down_now(str(message.metadata.get("inbound_id", "")))

    def replaced(self, message: OutboundMessage) -> None:
        """The reply took (or gave up taking) the place of its preview message."""
        key = str(message.metadata.get("inbound_id", ""))
        self._left.pop(key, None)
        if self.ledger is not None:
            self.ledger.down(key)
