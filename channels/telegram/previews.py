"""What shows while a reply is on its way: the typing indicator, and the reply itself as
it is written (a draft in private chats, a message edited as it grows in groups)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

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
from echo_bot.richtext.model import Formatted

from .common import Tasks, log
from .render import Pacer
from .text import entities, rendered_preview

# Typing stops in a chat where nothing moved (no message in, no reply out) for this long:
# a turn waiting on something slow does not type forever.
TYPING_MAX = 120.0
TYPING_CHATS = 1000  # chats shown typing at once, at most
TYPING_TURNS = 100_000  # queued turns remembered for them, at most
# A reply being written: a draft (private chats) at most once a second, an edit of one
# message (groups, where Telegram allows about 20 messages a minute) every 3 s.
DRAFT_INTERVAL = 1.0
EDIT_INTERVAL = 3.0
PREVIEW_MARK = " ✍️"  # ends a group's preview message while the reply is written
# A group's preview message left by a turn that sent no reply (it waits for an approval,
# or failed) is deleted after this long; a reply sent meanwhile takes its place.
PREVIEW_KEEP = 30.0


@dataclass
class _Typing:
    """One chat's typing indicator: the turns it shows for, until when, its task."""

    turns: set[str] = field(default_factory=set)
    until: float = 0.0
    task: asyncio.Task[None] | None = None


class Typing:
    """One indicator per chat, however many of its turns are queued: it shows while any
    of them waits for its reply, and the pacer lets at most one through per chat per 5 s."""

    def __init__(self, bot: Bot, pacer: Pacer) -> None:
        self.bot = bot
        self.pacer = pacer
        self._typing: dict[Address, _Typing] = {}
        self._typing_turns: dict[str, Address] = {}  # inbound id → its chat

    def start(self, inbound_id: str, chat: Address) -> None:
        state = self._typing.get(chat)
        if state is None:
            if len(self._typing) >= TYPING_CHATS:
                return
            state = self._typing[chat] = _Typing()
        state.until = time.monotonic() + TYPING_MAX
        if len(self._typing_turns) < TYPING_TURNS:
            state.turns.add(inbound_id)
            self._typing_turns[inbound_id] = chat
        if state.task is None and state.turns:
            state.task = asyncio.create_task(self._keep_typing(chat, state))

    async def _keep_typing(self, chat: Address, state: _Typing) -> None:
        key = f"{chat.chat_id}/{chat.thread_id or ''}"
        try:
            while state.turns and time.monotonic() < state.until:
                wait = self.pacer.typing(key)
                if wait > 0:
                    await asyncio.sleep(min(wait, state.until - time.monotonic()))
                    continue
                try:
                    await self.bot.send_chat_action(
                        chat_id=int(chat.chat_id),
                        action="typing",
                        message_thread_id=int(chat.thread_id) if chat.thread_id else None,
                    )
                except TelegramRetryAfter as exc:
                    await asyncio.sleep(exc.retry_after)
                except (TelegramNetworkError, TelegramServerError, OSError, TimeoutError):
                    pass  # the next beat tries again
                except (AiogramError, ValueError):
                    return  # blocked, gone, refused: this chat shows no typing
                except Exception:  # a typing indicator is never worth a failed task
                    log.debug("telegram: typing in %s failed", chat, exc_info=True)
                    return
        finally:
            self._forget(chat, state)

    def _forget(self, chat: Address, state: _Typing) -> None:
        if self._typing.get(chat) is state:
            del self._typing[chat]
        for inbound_id in state.turns:
            self._typing_turns.pop(inbound_id, None)
        state.turns.clear()

    def stop_for(self, message: OutboundMessage) -> None:
        self.stop(str(message.metadata.get("inbound_id", "")))

    def stop(self, inbound_id: str) -> None:
        chat = self._typing_turns.pop(inbound_id, None)
        state = self._typing.get(chat) if chat is not None else None
        if chat is None or state is None:
            return
        state.turns.discard(inbound_id)
        state.until = time.monotonic() + TYPING_MAX  # the chat moves on: keep showing it
        if not state.turns:
            # Out of the map at once: a message arriving now starts a fresh indicator.
            del self._typing[chat]
            if state.task is not None:
                state.task.cancel()

    def tasks(self) -> list[asyncio.Task[None]]:
        return [state.task for state in self._typing.values() if state.task is not None]


@dataclass
class _Preview:
    """A reply being written in one chat: its draft id (private chats) or the message
    edited as it grows (groups)."""

    chat_id: int
    thread: int | None
    draft_id: int
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
        typing: Typing,
        tasks: Tasks,
    ) -> None:
        self.bot = bot
        self.pacer = pacer
        self.typing = typing
        self.tasks = tasks
        self.stop_generation = host.stop_generation
        self.masker = host.masker  # what the renderer made is masked again before it leaves
        self._previews: dict[str, _Preview] = {}  # by key (the turn's inbound id)
        self._drafts: dict[int, tuple[str, int]] = {}  # draft id -> key, chat: stop buttons
        # Group preview messages of finished previews, until a reply takes their place.
        self._left_previews: dict[str, tuple[_Preview, asyncio.TimerHandle]] = {}

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
            wait = self.pacer.preview(str(chat_id), interval)
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        self.typing.stop(key)
        try:
            await self._show(chat_id, state, part)
            state.shown = text
        except TelegramRetryAfter as exc:
            self.pacer.pause_previews(float(exc.retry_after))
            log.info("telegram: previews paused %s s (429)", exc.retry_after)
        except (TelegramNetworkError, TelegramServerError, OSError, TimeoutError):
            pass  # the next text tries again
        except AiogramError as exc:  # refused: this reply is not previewed any further
            state.broken = True
            log.info("telegram: preview in %s refused: %s", chat_id, exc)

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
            if len(self._previews) >= TYPING_CHATS:
                return None
            draft_id = int(key[-7:], 16) if _is_hex(key[-7:]) else hash(key) % 2**28
            state = self._previews[key] = _Preview(
                chat_id, int(to.thread_id) if to.thread_id else None, draft_id or 1
            )
            if len(self._drafts) >= TYPING_TURNS:
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

    def replaced(self, message: OutboundMessage) -> None:
        """The reply took (or gave up taking) the place of its preview message."""
        self._left_previews.pop(str(message.metadata.get("inbound_id", "")), None)

    async def on_stop(self, stopped_message_generation: MessageGenerationStopped) -> None:
        event = stopped_message_generation
        known = self._drafts.get(event.draft_id)
        if known is None or known[1] != event.chat.id:
            return
        key = known[0]
        if self.stop_generation(key):
            log.info("telegram: the reply being written in %s was stopped", event.chat.id)
