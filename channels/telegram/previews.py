"""A reply shown as it is written: a draft in private chats, a message edited as it grows
in groups. (The typing indicator before it is the host's: ``show_typing``.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from aiogram import Bot
from aiogram.exceptions import (
    AiogramError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.methods import SendMessageDraft
from aiogram.types import MessageGenerationStopped

from echo_bot.bus import ChannelHost
from echo_bot.events import Address, OutboundKind, OutboundMessage
from echo_bot.pacing import Pacer
from echo_bot.preview_ledger import PreviewLedger
from echo_bot.richtext.model import Formatted

from .common import Tasks, log
from .text import entities, rendered_preview

PREVIEWS_MAX = 1000  # replies being written shown at once, at most
DRAFTS_KEPT = 100_000  # draft ids remembered for their stop buttons, at most
# A reply being written: a draft (private chats) at most once a second, an edit of one
# message (groups, where Telegram allows about 20 messages a minute) every 3 s.
DRAFT_INTERVAL = 1.0
EDIT_INTERVAL = 3.0
PREVIEW_MARK = " ✍️"  # ends a group's preview message while the reply is written
# A group's preview message left by a turn that sent no reply (it waits for an approval,
# or failed) is deleted after this long; a reply sent meanwhile takes its place.
PREVIEW_KEEP = 30.0


@dataclass
class _Preview:
    """A reply being written in one chat: its draft id (private chats) or the message
    edited as it grows (groups)."""

    chat_id: int
    thread: int | None
    draft_id: int
    key: str = ""  # the turn's inbound id
    message_id: int | None = None
    broken: bool = False  # Telegram refused it: no more previews for this reply
    shown: str = ""


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


class Previews:
    """Replies being written, shown as they grow (``PreviewSink``)."""

    def __init__(
        self,
        host: ChannelHost,
        bot: Bot,
        pacer: Pacer,
        tasks: Tasks,
    ) -> None:
        self.bot = bot
        self.pacer = pacer
        self.tasks = tasks
        self.stop_generation = host.stop_generation
        self.masker = host.masker  # what the renderer made is masked again before it leaves
        self.ledger = PreviewLedger(host, "telegram", tasks)  # group preview messages up
        self._previews: dict[str, _Preview] = {}  # by key (the turn's inbound id)
        self._drafts: dict[int, tuple[str, int]] = {}  # draft id -> key, chat: stop buttons
        # Group preview messages of finished previews, until a reply takes their place.
        self._left_previews: dict[str, tuple[_Preview, asyncio.TimerHandle]] = {}
        self._previewed_at: dict[int, float] = {}  # chat → when its last preview went
        self._paused_until = 0.0  # after a 429 to a preview, none goes anywhere until then

    async def show_preview(self, to: Address, key: str, text: str) -> None:
        try:
            chat_id = int(to.chat_id)
        except ValueError:
            return
        state = self._state(to, key, chat_id)
        if state is None or state.broken:
            return
        private = chat_id > 0  # users' ids are positive, groups' negative
        mark = PREVIEW_MARK if not private else ""
        part = await rendered_preview(text, mark, self.masker)
        if part is None:  # nothing to show yet: the next text shows more
            return
        interval = DRAFT_INTERVAL if private else EDIT_INTERVAL
        while True:  # only from spare budget: real messages never wait behind a preview
            wait = self._may_show(chat_id, interval)
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        try:
            await self._show(chat_id, state, part)
            state.shown = text
        except TelegramRetryAfter as exc:
            self._paused_until = max(self._paused_until, time.monotonic() + exc.retry_after)
            self.pacer.hold(str(chat_id), float(exc.retry_after))  # the reply waits too
            log.info("telegram: previews paused %s s (429)", exc.retry_after)
        except (TelegramNetworkError, TelegramServerError, OSError, TimeoutError):
            pass  # the next text tries again
        except AiogramError as exc:  # refused: this reply is not previewed any further
            state.broken = True
            log.info("telegram: preview in %s refused: %s", chat_id, exc)

    def _may_show(self, chat_id: int, interval: float) -> float:
        """0.0 when a preview may go to the chat now (then counted); else the seconds
        until it may: one per ``interval`` per chat, none while a 429 pauses previews,
        and only from spare budget (real messages never wait behind a preview)."""
        now = time.monotonic()
        wait = max(self._previewed_at.get(chat_id, -interval) + interval, self._paused_until)
        if wait > now:
            return wait - now
        if (wait := self.pacer.spare(str(chat_id))) > 0:
            return wait
        if len(self._previewed_at) >= PREVIEWS_MAX * 10:  # forget idle chats
            self._previewed_at.clear()
        self._previewed_at[chat_id] = now
        return 0.0

    def _state(self, to: Address, key: str, chat_id: int) -> _Preview | None:
        """The preview of ``key``: the one being shown, the message its turn's last step
        left, or a new one (None when too many are shown already)."""
        state = self._previews.get(key)
        if state is None and key in self._left_previews:
            # The turn's next step writes on: in the message its last step left.
            state, timer = self._left_previews.pop(key)
            timer.cancel()
            self._previews[key] = state
        if state is None:
            if len(self._previews) >= PREVIEWS_MAX:
                return None
            draft_id = int(key[-7:], 16) if _is_hex(key[-7:]) else hash(key) % 2**28
            state = self._previews[key] = _Preview(
                chat_id, int(to.thread_id) if to.thread_id else None, draft_id or 1, key
            )
            if len(self._drafts) >= DRAFTS_KEPT:
                self._drafts.clear()
            self._drafts[state.draft_id] = (key, chat_id)  # kept: a stop between steps counts
        return state

    async def _show(self, chat_id: int, state: _Preview, part: Formatted) -> None:
        if chat_id > 0:  # a private chat: a draft
            await self.bot(
                SendMessageDraft(
                    chat_id=chat_id,
                    draft_id=state.draft_id,
                    message_thread_id=state.thread,
                    text=part.text,
                    entities=entities(part) or None,
                    can_stop=True,
                )
            )
        elif state.message_id is None:
            sent = await self.bot.send_message(
                chat_id=chat_id, text=part.text, entities=entities(part) or None,
                message_thread_id=state.thread,
            )  # fmt: skip
            state.message_id = sent.message_id
            thread = str(state.thread) if state.thread else None
            where = Address(channel="telegram", chat_id=str(chat_id), thread_id=thread)
            self.ledger.up(state.key, where, str(sent.message_id))
        else:
            await self.bot.edit_message_text(
                text=part.text, chat_id=chat_id, message_id=state.message_id,
                entities=entities(part) or None,
            )  # fmt: skip

    async def end_preview(self, to: Address, key: str) -> None:
        state = self._previews.pop(key, None)
        if state is None:
            return
        if state.message_id is not None:  # a group's preview message: the reply replaces it
            earlier = self._left_previews.pop(key, None)
            if earlier is not None:
                earlier[1].cancel()
            loop = asyncio.get_running_loop()
            timer = loop.call_later(PREVIEW_KEEP, self._drop_left_preview, key)
            self._left_previews[key] = (state, timer)

    def _drop_left_preview(self, key: str) -> None:
        self.ledger.down(key)
        left = self._left_previews.pop(key, None)
        if left is not None and left[0].message_id is not None:
            self.tasks.spawn(self.delete(left[0].chat_id, left[0].message_id))

    async def delete(self, chat_id: int, message_id: int) -> None:
        try:
            await self.bot.delete_message(chat_id=chat_id, message_id=message_id)
        except (AiogramError, OSError, TimeoutError) as exc:
            log.info("telegram: a preview message in %s was not deleted: %s", chat_id, exc)

    def message_of(self, message: OutboundMessage) -> int | None:
        """The group preview message a reply takes the place of, if there is one."""
        if message.kind != OutboundKind.REPLY:
            return None
        key = str(message.metadata.get("inbound_id", ""))
        left = self._left_previews.get(key)
        if left is None:
            return None
        left[1].cancel()  # no deletion now: the reply edits it (kept until that worked)
        return left[0].message_id

    async def unnote(self, message: OutboundMessage) -> None:
        """Before the reply goes into its preview message: no more noted as a preview
        (``PreviewLedger.down_now``; raises ``ChannelError`` while the store is away)."""
        await self.ledger.down_now(str(message.metadata.get("inbound_id", "")))

    def replaced(self, message: OutboundMessage) -> None:
        """The reply took (or gave up taking) the place of its preview message."""
        key = str(message.metadata.get("inbound_id", ""))
        self._left_previews.pop(key, None)
        self.ledger.down(key)

    async def remove_left_over(self, left: list[tuple[Address, str]]) -> None:
        """The group preview messages a daemon killed mid-stream left (``PreviewLedger``):
        the turn, run again, answers in a message of its own."""
        for where, message_id in left:
            with contextlib.suppress(ValueError):
                await self.pacer.wait(where.chat_id)  # within the chat's budget, as a send
                await self.delete(int(where.chat_id), int(message_id))

    async def on_stop(self, stopped_message_generation: MessageGenerationStopped) -> None:
        event = stopped_message_generation
        known = self._drafts.get(event.draft_id)
        if known is None or known[1] != event.chat.id:
            return
        key = known[0]
        if self.stop_generation(key):
            log.info("telegram: the reply being written in %s was stopped", event.chat.id)
