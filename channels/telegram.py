"""The Telegram channel on aiogram 3: chat with the agent, approve from a phone.

Safety over aiogram's defaults: updates are fed one at a time and the polling offset
moves past an update only after it is committed to the inbox; in webhook mode the HTTP
answer is sent only after the commit. Replies go through the core's durable outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hmac
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from aiogram import Bot, Dispatcher, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    AiogramError,
    ClientDecodeError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramForbiddenError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
    TelegramUnauthorizedError,
)
from aiogram.methods import GetUpdates, SendMessageDraft
from aiogram.types import (
    BotCommand,
    CallbackQuery,
    FSInputFile,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageEntity,
    MessageGenerationStopped,
    ReplyParameters,
    Update,
)
from aiohttp import ClientError, ClientResponseError

from echo_bot.bus import Bus, ChannelSetup, Masking
from echo_bot.config import BOT_TOKEN_SHAPE, TelegramConfig, looks_like_bot_token
from echo_bot.errors import (
    ChannelError,
    ConfigError,
    EchoBotError,
    MediaTooLarge,
    MediaUnavailable,
    StoreError,
)
from echo_bot.events import (
    Address,
    ApprovalDecision,
    Attachment,
    DecisionInbound,
    InboundMessage,
    InboundStatus,
    MediaKind,
    MessageInbound,
    OutboundKind,
    OutboundMessage,
    Receipt,
    Sender,
    TextFormat,
    parse_approval_action,
)
from echo_bot.sizes import format_size

from .telegram_markdown import Formatted, render_markdown, split_formatted, utf16_offsets
from .telegram_masking import masked, masked_growing
from .telegram_render import MAX_TEXT, Pacer, keyboard_rows, split_text

log = logging.getLogger(__name__)
T = TypeVar("T")

ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "stopped_message_generation"]
REFUSAL_INTERVAL = 600.0  # one refusal per unknown user per 10 minutes
# Typing stops in a chat where nothing moved (no message in, no reply out) for this long:
# a turn waiting on something slow does not type forever.
TYPING_MAX = 120.0
TYPING_CHATS = 1000  # chats shown typing at once, at most
TYPING_TURNS = 100_000  # queued turns remembered for them, at most
STARTUP_TIMEOUT = 15.0
# A reply being written: a draft (private chats) at most once a second, an edit of one
# message (groups, where Telegram allows about 20 messages a minute) every 3 s.
DRAFT_INTERVAL = 1.0
EDIT_INTERVAL = 3.0
PREVIEW_MARK = " ✍️"  # ends a group's preview message while the reply is written
# A group's preview message left by a turn that sent no reply (it waits for an approval,
# or failed) is deleted after this long; a reply sent meanwhile takes its place.
PREVIEW_KEEP = 30.0
RENDER_ON_LOOP = 700  # characters of Markdown rendered on the loop (about 1 ms); more: a thread
MAX_CAPTION = 1024  # UTF-16 units of a photo's or document's caption
DOWNLOAD_TIMEOUT = 110.0  # one file, whole (the core gives a try 120 s)
DOWNLOAD_CHUNK = 256 * 1024
STANDBY_CHECK = 1.0  # seconds between looks at the poller lease while another daemon polls
# A stored offset older than this is not used: Telegram keeps unconfirmed updates for 24
# hours only, and after a week without updates it numbers the next ones afresh, maybe
# below an old offset (which would confirm them unseen).
OFFSET_MAX_AGE = 23 * 3600.0


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


@dataclass
class _Typing:
    """One chat's typing indicator: the turns it shows for, until when, its task."""

    turns: set[str] = field(default_factory=set)
    until: float = 0.0
    task: asyncio.Task[None] | None = None


class CommitFailed(EchoBotError):
    """The inbox did not take an update: it must not be acknowledged."""


def message_parts(
    text: str, markdown: bool, masker: Masking | None = None, *, limit: int = MAX_TEXT
) -> list[Formatted]:
    """The messages a text is sent as: Markdown rendered to entities (plain text if the
    renderer fails on it), split within ``limit``. What the renderer made is masked
    whole before it is cut: no part holds a secret, nor two parts its halves."""
    if markdown:
        try:
            return split_formatted(masked(render_markdown(text), masker), limit)
        except Exception:  # markdown-it never should; a reply must go out regardless
            log.exception("telegram: Markdown rendering failed; sending the text as written")
    return [Formatted(part) for part in split_text(masked(Formatted(text), masker).text, limit)]


def read_media(message: Message, config: TelegramConfig) -> tuple[list[Attachment], list[str]]:
    """A message's files (fetched later, during its turn) and short notes for what is
    not a file: stickers, locations, contacts, polls. Nothing is silently dropped."""
    found: list[Attachment] = []
    if message.photo:
        # The largest size that fits the download limit (or else the smallest: its
        # fetch then says why it cannot be had).
        sizes = sorted(message.photo, key=lambda p: p.width * p.height)
        fitting = [p for p in sizes if (p.file_size or 0) <= config.max_download]
        best = (fitting or sizes[:1])[-1]
        found.append(_attachment(MediaKind.PHOTO, best.file_id, size=best.file_size))
    for kind, item in (
        (MediaKind.VOICE, message.voice),
        (MediaKind.AUDIO, message.audio),
        (MediaKind.VIDEO, message.video),
        (MediaKind.VIDEO_NOTE, message.video_note),
        (MediaKind.ANIMATION, message.animation),
        (MediaKind.DOCUMENT, None if message.animation else message.document),
    ):
        if item is not None:
            found.append(
                _attachment(
                    kind,
                    item.file_id,
                    name=getattr(item, "file_name", None),
                    mime_type=getattr(item, "mime_type", None),
                    size=item.file_size,
                    duration=getattr(item, "duration", None),
                )
            )
    notes = _notes(message)
    if found and not config.media:
        notes += [f"[{a.kind.value.replace('_', ' ')} not downloaded: [telegram] media is off]"
                  for a in found]  # fmt: skip
        found = []
    return found, notes


def _attachment(
    kind: MediaKind,
    file_id: str,
    *,
    name: str | None = None,
    mime_type: str | None = None,
    size: int | None = None,
    duration: int | None = None,
) -> Attachment:
    return Attachment(
        kind=kind,
        file_ref=file_id[:512],
        name=_clean(name)[:256] if name else None,
        mime_type=_clean(mime_type)[:128] if mime_type else None,
        size=size if size is None or size >= 0 else None,
        duration=duration if duration is None or duration >= 0 else None,
    )


def _notes(message: Message) -> list[str]:
    notes: list[str] = []
    if message.sticker is not None:
        sticker = message.sticker
        label = f" {sticker.emoji}" if sticker.emoji else ""
        notes.append(
            f"[sticker{label}" + (f" from the set {sticker.set_name}]" if sticker.set_name else "]")
        )
    if message.venue is not None:
        venue = message.venue
        notes.append(
            f"[venue: {venue.title}, {venue.address} "
            f"({venue.location.latitude:.5f}, {venue.location.longitude:.5f})]"
        )
    elif message.location is not None:
        where = message.location
        live = " (live)" if where.live_period else ""
        notes.append(f"[location{live}: {where.latitude:.5f}, {where.longitude:.5f}]")
    if message.contact is not None:
        contact = message.contact
        name = " ".join(p for p in (contact.first_name, contact.last_name) if p)
        notes.append(f"[contact: {name}, {contact.phone_number}]")
    if message.poll is not None:
        poll = message.poll
        options = " / ".join(o.text for o in poll.options)
        notes.append(f"[poll: {poll.question} — {options}]")
    if message.dice is not None:
        notes.append(f"[dice {message.dice.emoji}: {message.dice.value}]")
    return [_clean(note)[:2000] for note in notes]


async def _rendered(text: str, markdown: bool, masker: Masking | None) -> list[Formatted]:
    """``message_parts``, off the event loop unless short (about 1 ms per 700 chars)."""
    if markdown and len(text) > RENDER_ON_LOOP:
        return await asyncio.to_thread(message_parts, text, markdown, masker)
    return message_parts(text, markdown, masker)


def preview_part(text: str, mark: str = "", masker: Masking | None = None) -> Formatted | None:
    """What a preview shows of a reply being written: its newest part that fits one
    message (a long reply is sent as several), formatted and masked, with ``mark`` after
    it; None while there is nothing to show (what there is could begin a secret)."""
    if len(text) > 3 * MAX_TEXT:  # only the end is shown: only the end is rendered
        tail = text[-2 * MAX_TEXT :]
        paragraph = tail.find("\n\n")
        text = tail[paragraph + 2 :] if 0 <= paragraph < MAX_TEXT else tail
    try:
        rendered = render_markdown(text)
    except Exception:  # as in message_parts: shown as written
        rendered = Formatted(text)
    rendered = masked_growing(rendered, masker)
    if not rendered.text.strip():
        return None
    last = split_formatted(rendered)[-1]
    if not mark:
        return last
    fits = utf16_offsets(last.text)[-1] + len(mark.encode("utf-16-le")) // 2 <= MAX_TEXT
    return Formatted(last.text + mark, last.spans) if fits else last


def _drop_partials(saved: Path) -> None:
    """The file is whole: partial downloads of it (a try a kill cut short) can go."""
    for stale in saved.parent.glob(f".{glob.escape(saved.name)}.*.part"):
        stale.unlink(missing_ok=True)


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


def _entities(part: Formatted) -> list[MessageEntity]:
    return [MessageEntity(**entity) for entity in part.entities()]


def _clean(text: str) -> str:
    """Valid Unicode only. JSON may carry a lone surrogate ("\\ud800"), which no store
    can encode: such an update would fail to commit on every try and stall the queue."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class TelegramChannel:
    name = "telegram"

    def __init__(self, setup: ChannelSetup[TelegramConfig]) -> None:
        config = setup.section
        self.config = config
        token = setup.environ.get(config.token_env, "")
        if not looks_like_bot_token(token):  # build_core said so already; the same rule
            raise ConfigError(
                f"telegram.token_env: ${config.token_env} does not look like a bot token "
                f"({BOT_TOKEN_SHAPE})"
            )
        session = AiohttpSession(api=TelegramAPIServer.from_base(config.api_base.rstrip("/")))
        self.bot = Bot(token, session=session)
        self.commands = list(setup.commands)
        self.access = setup.access
        self.http = setup.http
        self.poll_timeout = int(setup.options.get("poll_timeout", 25))
        self.hold = setup.hold
        self.recall, self.remember = setup.recall, setup.remember
        self.standby: bool | None = None  # another daemon polls this bot now (None: not asked)
        self.secret = setup.environ.get(config.webhook_secret_env, "")
        self.dp = Dispatcher()
        self.dp.include_router(self._router())
        self.bus: Bus | None = None
        self.pacer = Pacer()
        self.bot_id: int | None = None
        self.username: str | None = None
        self._status = "starting"
        self._last_error: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._typing: dict[Address, _Typing] = {}
        self._typing_turns: dict[str, Address] = {}  # inbound id → its chat
        self._refused_at: dict[int, float] = {}
        self._parts_sent: dict[str, list[int]] = {}
        self._unreadable: set[int] = set()  # update ids aiogram could not read
        self.stop_generation = setup.stop_generation
        self.masker = setup.masker  # what the renderer made is masked again before it leaves
        self._previews: dict[str, _Preview] = {}  # by key (the turn's inbound id)
        self._drafts: dict[int, tuple[str, int]] = {}  # draft id -> key, chat: stop buttons
        # Group preview messages of finished previews, until a reply takes their place.
        self._left_previews: dict[str, tuple[_Preview, asyncio.TimerHandle]] = {}
        if config.mode == "webhook" and self.http is not None:
            self._webhook_path = urlsplit(config.webhook_url or "").path or "/telegram"
            # The secret token is a header: checked before the body is read (bounded).
            self.http.add_route("POST", self._webhook_path, self._webhook, reads_body=True)
        if self.http is not None:
            self.http.add_health("telegram", self.health)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        self.bus = bus
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                me = await self.bot.get_me()
        except TelegramUnauthorizedError:
            await self.bot.session.close()
            raise ConfigError(
                f"telegram.token_env: the Bot API at {self.config.api_base} rejected the token "
                f"in ${self.config.token_env} (401 Unauthorized)"
            ) from None
        except (AiogramError, TimeoutError, OSError) as exc:
            self._degrade(f"cannot reach the Bot API: {exc}")
            self._spawn(self._connect_later())
            return
        await self._connected(me.id, me.username)

    async def _connect_later(self) -> None:
        delay = 1.0
        while True:
            await asyncio.sleep(delay)
            try:
                me = await self.bot.get_me()
            except TelegramUnauthorizedError:
                self._status = "down"
                self._last_error = "the Bot API rejected the token (401)"
                log.error("telegram: the Bot API rejected the token (401); fix it and restart")
                return
            except (AiogramError, TimeoutError, OSError) as exc:
                self._degrade(f"cannot reach the Bot API: {exc}")
                delay = min(delay * 2, 60.0)
                continue
            await self._connected(me.id, me.username)
            return

    async def _connected(self, bot_id: int, username: str | None) -> None:
        self.bot_id, self.username = bot_id, username
        log.info("telegram: connected as @%s", username)
        with contextlib.suppress(TelegramAPIError, OSError, TimeoutError):
            await self.bot.set_my_commands(
                [BotCommand(command=name, description=text[:256]) for name, text in self._menu()]
            )
        if self.config.mode == "webhook":
            await self.bot.set_webhook(
                url=self.config.webhook_url or "",
                secret_token=self.secret or None,
                allowed_updates=ALLOWED_UPDATES,
                drop_pending_updates=False,
            )
        else:
            await self.bot.delete_webhook(drop_pending_updates=False)
            self._spawn(self._poll_loop())
        self._status = "ok"
        self._last_error = None

    async def stop(self) -> None:
        typing = [state.task for state in self._typing.values() if state.task is not None]
        for task in list(self._tasks) + typing:
            task.cancel()
        await asyncio.gather(*self._tasks, *typing, return_exceptions=True)
        await self.bot.session.close()

    def health(self) -> dict[str, object]:
        state: dict[str, object] = {"status": self._status, "mode": self.config.mode}
        if self.standby:
            state["poller"] = "another daemon"
        if self.username:
            state["bot"] = f"@{self.username}"
        if self._last_error:
            state["error"] = self._last_error
        return state

    def _degrade(self, error: str) -> None:
        if self._status != "degraded" or self._last_error != error:
            log.warning("telegram: %s (retrying)", error)
        self._status, self._last_error = "degraded", error

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _menu(self) -> list[tuple[str, str]]:
        own = [("start", "say hello"), ("whoami", "show your Telegram user id"),
               ("pair", "pair with the code from `echo-bot pair`")]  # fmt: skip
        names = {n for n, _ in own}
        return own + [(n, h) for n, h in self.commands if n not in names]

    # -- receiving ------------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        offset: int | None = None
        resume = True  # go on from the offset the last poller stored
        delay = 1.0
        while True:
            if self.hold is not None and not await self._may_poll():
                resume = True  # another daemon polls: its offset will be in the store
                await asyncio.sleep(STANDBY_CHECK)
                continue
            if resume:
                offset, resume = await self._stored_offset(), False
            try:
                updates = await self.bot(
                    GetUpdates(
                        offset=offset, timeout=self.poll_timeout, allowed_updates=ALLOWED_UPDATES
                    ),
                    request_timeout=self.poll_timeout + 15,
                )
            except TelegramRetryAfter as exc:
                await asyncio.sleep(exc.retry_after)
                continue
            except TelegramUnauthorizedError:
                self._status, self._last_error = "down", "the Bot API rejected the token (401)"
                log.error("telegram: getUpdates answered 401; retrying in 60 s")
                await asyncio.sleep(60)
                continue
            except ClientDecodeError:
                # One update aiogram cannot read would fail every batch it is in, for
                # ever: read this batch one update at a time and skip what cannot be read.
                try:
                    updates = await self._updates_one_by_one(offset)
                except (AiogramError, TimeoutError, OSError, ValueError) as exc:
                    self._degrade(f"getUpdates failed: {exc}")
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 60.0)
                    continue
            except (AiogramError, TimeoutError, OSError) as exc:
                self._degrade(f"getUpdates failed: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            if self._status != "ok":
                log.info("telegram: connection restored")
            self._status, self._last_error, delay = "ok", None, 1.0
            for update in updates:
                if update.update_id in self._unreadable:  # logged when read: skipped
                    self._unreadable.discard(update.update_id)
                    offset = update.update_id + 1
                    continue
                try:
                    await self.dp.feed_update(self.bot, update)
                except CommitFailed:
                    log.error(
                        "telegram: update %s not stored; will fetch it again", update.update_id
                    )
                    await asyncio.sleep(1)
                    break
                except Exception:  # a bad update must not stall the queue forever
                    log.exception("telegram: update %s could not be handled", update.update_id)
                offset = update.update_id + 1
            if updates and offset is not None:
                await self._store_offset(offset)

    async def _updates_one_by_one(self, offset: int | None) -> list[Update]:
        """The batch at ``offset`` fetched as raw JSON and read update by update; one
        that cannot be read is logged and stands in as a bare update, so the offset
        moves past it (it is never handled)."""
        session = await cast(AiohttpSession, self.bot.session).create_session()
        url = self.bot.session.api.api_url(self.bot.token, "getUpdates")
        body = {"timeout": 0, "allowed_updates": ALLOWED_UPDATES}
        if offset is not None:
            body["offset"] = offset
        async with asyncio.timeout(30), session.post(url, json=body) as response:
            data = await response.json(content_type=None)
        if (
            not isinstance(data, dict)
            or not data.get("ok")
            or not isinstance(data.get("result"), list)
        ):
            raise ValueError("getUpdates gave no list of updates")
        updates = []
        for raw in data["result"]:
            update_id = raw.get("update_id") if isinstance(raw, dict) else None
            if not isinstance(update_id, int):
                continue  # without an id nothing can be skipped past it either
            try:
                updates.append(Update.model_validate(raw, context={"bot": self.bot}))
            except ValueError as exc:
                kind = next((k for k in raw if k != "update_id"), "?")
                log.warning(
                    "telegram: update %s (%s) could not be read, skipped: %s",
                    update_id, kind, str(exc).splitlines()[0],
                )  # fmt: skip
                updates.append(Update(update_id=update_id))
                self._unreadable.add(update_id)
        return updates

    async def _stored_offset(self) -> int | None:
        """Where the last poller of this bot stopped (this daemon before a restart, or
        another daemon), so that what it stored is not fetched again. None, and Telegram's
        own unconfirmed updates (deduplicated by update_id), when nothing is stored, the
        store cannot say, or the offset is older than OFFSET_MAX_AGE."""
        if self.recall is None:
            return None
        try:
            stored = await self.recall(self._offset_name)
        except Exception as exc:
            log.warning("telegram: the stored offset could not be read (%s); asking afresh", exc)
            return None
        if stored is None:
            return None
        offset, stored_at = stored
        if time.time() - stored_at > OFFSET_MAX_AGE:
            return None
        return offset

    async def _store_offset(self, offset: int) -> None:
        """Keep the offset past what is stored: it is a shortcut, not the record (the inbox
        is), so a failure to keep it costs a few updates fetched again, never one lost."""
        if self.remember is None:
            return
        try:
            await self.remember(self._offset_name, offset)
        except Exception as exc:
            log.debug("telegram: offset %s not stored: %s", offset, exc)

    @property
    def _offset_name(self) -> str:
        return f"telegram-offset:{self.bot.id}"

    async def _may_poll(self) -> bool:
        """With several daemons on one store, one polls this bot at a time; the others
        stand by and take over once its lease lapses (what it had not confirmed is
        fetched again and deduplicated by update_id)."""
        assert self.hold is not None
        try:
            # Its holder counts as gone after lease - STANDBY_CHECK unseen: with this
            # look every STANDBY_CHECK, the poll is taken over within [telegram] lease.
            within = self.config.lease.total_seconds() - STANDBY_CHECK
            polling = await self.hold(f"telegram-poller:{self.bot.id}", within)
        except Exception as exc:  # the store is away: nobody can store updates anyway
            self._degrade(f"cannot tell whether to poll: {exc}")
            return False
        if self.standby is None or polling == self.standby:  # the first answer, or a change
            log.info("telegram: %s", "polling now" if polling else "another daemon polls")
        self.standby = not polling
        return polling

    async def _webhook(self, request: Any) -> Any:
        from aiohttp import web
        from pydantic import ValidationError

        given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "")
        if not self.secret or not hmac.compare_digest(given.encode(), self.secret.encode()):
            return web.json_response({"error": "bad or missing secret token"}, status=401)
        assert self.http is not None
        body = await self.http.read_body(request, key=self._webhook_path)
        if isinstance(body, web.Response):
            return body
        try:
            data = json.loads(body)
            update = Update.model_validate(data, context={"bot": self.bot})
        except (ValueError, ValidationError):
            return web.json_response({"error": "not a Telegram update"}, status=400)
        try:
            await self.dp.feed_update(self.bot, update)
        except CommitFailed:
            return web.json_response({"error": "not stored; retry"}, status=503)
        except Exception:
            log.exception("telegram: update %s could not be handled", update.update_id)
        return web.json_response({"ok": True})

    def _router(self) -> Router:
        router = Router(name="echo-bot")
        router.message.register(self._on_message)
        router.edited_message.register(self._on_edited)
        router.callback_query.register(self._on_callback)
        router.stopped_message_generation.register(self._on_stop)
        return router

    async def _publish(self, message: InboundMessage) -> str:
        assert self.bus is not None
        try:
            published = await self.bus.publish(message)
        except StoreError as exc:  # the store could not take it now: fetch it again later
            raise CommitFailed(str(exc)) from exc
        # Anything else is a bad update: it propagates, is logged and skipped.
        return published.inbound_id

    async def _notice(self, chat: Address, text: str, reply_to: int | None = None) -> None:
        assert self.bus is not None
        await self.bus.send(
            OutboundMessage(
                to=chat,
                text=text,
                kind=OutboundKind.NOTICE,
                quote=str(reply_to) if reply_to else None,
            )
        )

    @staticmethod
    def _address(message: Message) -> Address:
        thread = message.message_thread_id if message.is_topic_message else None
        return Address(
            channel="telegram",
            chat_id=str(message.chat.id),
            thread_id=str(thread) if thread else None,
        )

    async def _on_message(self, message: Message, event_update: Update) -> None:
        user = message.from_user
        if user is None or user.is_bot:
            return
        chat = self._address(message)
        given = message.text if message.text is not None else message.caption
        text = _clean(given) if given is not None else None
        group = message.chat.type != "private"
        if group and not self._addressed_to_me(message):
            return
        if text is not None and group and self.username:
            text = text.replace(f"@{self.username}", "").strip()
        command = (text or "").split(maxsplit=1)[0].split("@", 1)[0].lower() if text else ""
        if command == "/whoami":
            await self._notice(chat, f"Your Telegram user id is {user.id}.", message.message_id)
            return
        if command == "/pair":
            await self._pair(message, chat, text or "")
            return
        assert self.access is not None
        if not await self.access.is_allowed("telegram", str(user.id)):
            await self._refuse(user.id, chat, message.message_id)
            return
        if command == "/start":
            await self._notice(chat, "Hello! Ask me anything, or send /help to see what I can do.")
            return
        attachments, notes = read_media(message, self.config)
        if not attachments and not notes and text is None:
            kind = str(getattr(message.content_type, "value", message.content_type))
            kind = kind.replace("_", " ")
            notes = [f"[a message of a kind I cannot read: {kind}]"]
        text = "\n".join(part for part in [text, *notes] if part) or None
        inbound = MessageInbound(
            address=chat,
            sender=Sender(id=str(user.id), name=_clean(user.username or user.full_name)),
            text=text,
            attachments=attachments,
            external_id=str(event_update.update_id),
            message_id=str(message.message_id),
        )
        inbound_id = await self._publish(inbound)
        self._start_typing(inbound_id, chat)

    def _addressed_to_me(self, message: Message) -> bool:
        text = message.text or message.caption or ""
        if text.startswith("/"):
            return True
        if self.username and f"@{self.username}".lower() in text.lower():
            return True
        replied = message.reply_to_message
        return bool(replied and replied.from_user and replied.from_user.id == self.bot_id)

    async def _on_edited(self, edited_message: Message) -> None:
        return None  # edits of earlier messages are not re-run

    async def _refuse(self, user_id: int, chat: Address, message_id: int) -> None:
        now = time.monotonic()
        last = self._refused_at.get(user_id)
        if last is not None and now - last < REFUSAL_INTERVAL:
            return
        if len(self._refused_at) > 10_000:
            self._refused_at.clear()
        self._refused_at[user_id] = now
        await self._notice(
            chat,
            f"Sorry, I only talk to people my owner has allowed. Your Telegram user id is "
            f"{user_id}: the owner can add it to [telegram] allowed_users, or give you a "
            "code from `echo-bot pair` to send as /pair CODE.",
            message_id,
        )

    async def _pair(self, message: Message, chat: Address, text: str) -> None:
        assert self.access is not None and message.from_user is not None
        parts = text.split(maxsplit=1)
        if len(parts) < 2 or len(parts[1]) > 32:
            await self._notice(chat, "Send /pair followed by the code from `echo-bot pair`.")
            return
        result = await self.access.pair("telegram", str(message.from_user.id), parts[1])
        answers = {
            "paired": "Paired. Welcome! Send /help to see what I can do.",
            "already": "You are already allowed to talk to me.",
            "wrong": "That code is not valid (codes expire after 10 minutes).",
            "locked": "Too many wrong codes. Try again in an hour.",
        }
        await self._notice(chat, answers.get(result, "Pairing failed."), message.message_id)

    async def _on_callback(self, callback_query: CallbackQuery, event_update: Update) -> None:
        query = callback_query
        parsed = parse_approval_action(query.data or "")
        message = query.message
        if parsed is None:
            self._spawn(self._answer(query.id, "Unknown or expired request."))
            return
        if message is None:
            self._spawn(self._answer(query.id, "This button is no longer attached to a message."))
            return
        verb, request_id, seconds = parsed
        chat = Address(channel="telegram", chat_id=str(message.chat.id))
        # An InaccessibleMessage (too old for Telegram to show) has neither.
        thread = getattr(message, "message_thread_id", None)
        if thread and getattr(message, "is_topic_message", False):
            chat = Address(channel="telegram", chat_id=chat.chat_id, thread_id=str(thread))
        presser = query.from_user
        decision = ApprovalDecision(
            request_id=request_id,
            verb=verb,
            decided_by=chat,
            sender_id=str(presser.id),
            via="telegram",
            allow_for_seconds=seconds,
            answered=True,  # the button's popup says the outcome (_answer_outcome)
        )
        inbound_id = await self._publish(
            DecisionInbound(
                address=chat,
                sender=Sender(
                    id=str(presser.id), name=_clean(presser.username or presser.full_name)
                ),
                decision=decision,
                external_id=str(event_update.update_id),
                metadata={"callback_query_id": query.id},
            )
        )
        self._spawn(self._answer_outcome(query.id, inbound_id))

    async def _answer_outcome(self, query_id: str, inbound_id: str) -> None:
        assert self.bus is not None
        state = await self.bus.at_rest(inbound_id, timeout=2.5)
        if state is None or not state[0].terminal:
            text = "Received."
        elif state[0] == InboundStatus.DONE:
            text = "Done."
        else:
            text = f"⚠️ {state[1] or 'Refused.'}"
        await self._answer(query_id, text)

    async def _answer(self, query_id: str, text: str) -> None:
        try:
            await self.bot.answer_callback_query(query_id, text=text[:200])
        except (TelegramAPIError, OSError, TimeoutError) as exc:
            log.info("telegram: could not answer a button press: %s", exc)

    # -- replies being written ---------------------------------------------------------------
    async def show_preview(self, to: Address, key: str, text: str) -> None:
        try:
            chat_id = int(to.chat_id)
        except ValueError:
            return
        state = self._previews.get(key)
        if state is None and key in self._left_previews:
            # The turn's next step writes on: in the message its last step left.
            state, timer = self._left_previews.pop(key)
            timer.cancel()
            self._previews[key] = state
        if state is None:
            if len(self._previews) >= TYPING_CHATS:
                return
            draft_id = int(key[-7:], 16) if _is_hex(key[-7:]) else hash(key) % 2**28
            state = self._previews[key] = _Preview(
                chat_id, int(to.thread_id) if to.thread_id else None, draft_id or 1
            )
            if len(self._drafts) >= TYPING_TURNS:
                self._drafts.clear()
            self._drafts[state.draft_id] = (key, chat_id)  # kept: a stop between steps counts
        if state.broken:
            return
        private = chat_id > 0  # users' ids are positive, groups' negative
        mark = PREVIEW_MARK if not private else ""
        part = (
            await asyncio.to_thread(preview_part, text, mark, self.masker)
            if len(text) > RENDER_ON_LOOP
            else preview_part(text, mark, self.masker)
        )
        if part is None:  # nothing to show yet: the next text shows more
            return
        interval = DRAFT_INTERVAL if private else EDIT_INTERVAL
        while True:  # only from spare budget: real messages never wait behind a preview
            wait = self.pacer.preview(str(chat_id), interval)
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        self._stop_typing_of(key)
        try:
            if private:
                await self.bot(
                    SendMessageDraft(
                        chat_id=chat_id,
                        draft_id=state.draft_id,
                        message_thread_id=state.thread,
                        text=part.text,
                        entities=_entities(part) or None,
                        can_stop=True,
                    )
                )
            elif state.message_id is None:
                sent = await self.bot.send_message(
                    chat_id=chat_id, text=part.text, entities=_entities(part) or None,
                    message_thread_id=state.thread,
                )  # fmt: skip
                state.message_id = sent.message_id
            else:
                await self.bot.edit_message_text(
                    text=part.text, chat_id=chat_id, message_id=state.message_id,
                    entities=_entities(part) or None,
                )  # fmt: skip
            state.shown = text
        except TelegramRetryAfter as exc:
            self.pacer.pause_previews(float(exc.retry_after))
            log.info("telegram: previews paused %s s (429)", exc.retry_after)
        except (TelegramNetworkError, TelegramServerError, OSError, TimeoutError):
            pass  # the next text tries again
        except AiogramError as exc:  # refused: this reply is not previewed any further
            state.broken = True
            log.info("telegram: preview in %s refused: %s", chat_id, exc)

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
            self._spawn(self._delete(left[0].chat_id, left[0].message_id))

    async def _delete(self, chat_id: int, message_id: int) -> None:
        try:
            await self.bot.delete_message(chat_id=chat_id, message_id=message_id)
        except (AiogramError, OSError, TimeoutError) as exc:
            log.info("telegram: a preview message in %s was not deleted: %s", chat_id, exc)

    def _preview_message_of(self, message: OutboundMessage) -> int | None:
        """The group preview message a reply takes the place of, if there is one."""
        if message.kind != OutboundKind.REPLY:
            return None
        key = str(message.metadata.get("inbound_id", ""))
        left = self._left_previews.get(key)
        if left is None:
            return None
        left[1].cancel()  # no deletion now: the reply edits it (kept until that worked)
        return left[0].message_id

    async def _on_stop(self, stopped_message_generation: MessageGenerationStopped) -> None:
        event = stopped_message_generation
        known = self._drafts.get(event.draft_id)
        if known is None or known[1] != event.chat.id:
            return
        key = known[0]
        if self.stop_generation is not None and self.stop_generation(key):
            log.info("telegram: the reply being written in %s was stopped", event.chat.id)

    # -- files ------------------------------------------------------------------------------
    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        """Download a message's file (the core calls this during the turn) to
        ``destination``, through a temporary name: there is a whole file or none.
        ``limit`` (what the core's media budgets leave) stops it sooner than
        ``max_download`` when it is smaller."""
        own = self.config.max_download
        budget = limit is not None and limit < own
        cap = min(own, limit) if limit is not None else own
        over = f"over the {format_size(own)} download limit ([telegram] max_download)"

        def too_big(size: int | None) -> MediaUnavailable:
            shown = f"it is {format_size(size)}" if size is not None else "it is larger"
            if budget:
                return MediaTooLarge(f"{shown}, over the {format_size(cap)} its budget leaves")
            return MediaUnavailable(f"{shown}, {over}" if size is not None else f"it is {over}")

        if attachment.size is not None and attachment.size > cap:
            raise too_big(attachment.size)
        try:
            file = await self.bot.get_file(attachment.file_ref)
        except TelegramBadRequest as exc:  # "file is too big", "wrong file_id"…
            raise MediaUnavailable(f"Telegram would not hand it over ({exc.message})") from None
        if file.file_size is not None and file.file_size > cap:
            raise too_big(file.file_size)
        if not file.file_path:
            raise MediaUnavailable("Telegram gave no path to download it from")
        url = self.bot.session.api.file_url(self.bot.token, file.file_path)
        # A name of its own: two tries at once (a turn taken over) never share a file.
        partial = destination.with_name(f".{destination.name}.{secrets.token_hex(4)}.part")
        handle = await asyncio.to_thread(partial.open, "wb")
        size = 0
        try:
            try:
                async for chunk in self.bot.session.stream_content(
                    url, timeout=int(DOWNLOAD_TIMEOUT), chunk_size=DOWNLOAD_CHUNK
                ):
                    size += len(chunk)
                    if size > cap:
                        raise too_big(None)
                    await asyncio.to_thread(handle.write, chunk)
            except ClientResponseError as exc:  # its text has the URL, and so the token
                if exc.status in (400, 403, 404):
                    raise MediaUnavailable(
                        f"Telegram has no such file any more (HTTP {exc.status})"
                    ) from None
                raise ChannelError(f"the download failed (HTTP {exc.status})") from None
            except ClientError as exc:
                raise ChannelError(f"the download failed ({type(exc).__name__})") from None
            await asyncio.to_thread(handle.close)
            await asyncio.to_thread(partial.replace, destination)
            await asyncio.to_thread(_drop_partials, destination)
        finally:
            if not handle.closed:
                await asyncio.to_thread(handle.close)
            await asyncio.to_thread(partial.unlink, missing_ok=True)
        return size

    # -- typing -----------------------------------------------------------------------------
    # One indicator per chat, however many of its turns are queued: it shows while any of
    # them waits for its reply, and the pacer lets at most one through per chat per 5 s.
    def _start_typing(self, inbound_id: str, chat: Address) -> None:
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
            self._forget_typing(chat, state)

    def _forget_typing(self, chat: Address, state: _Typing) -> None:
        if self._typing.get(chat) is state:
            del self._typing[chat]
        for inbound_id in state.turns:
            self._typing_turns.pop(inbound_id, None)
        state.turns.clear()

    def _stop_typing(self, message: OutboundMessage) -> None:
        self._stop_typing_of(str(message.metadata.get("inbound_id", "")))

    def _stop_typing_of(self, inbound_id: str) -> None:
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

    # -- sending ----------------------------------------------------------------------------
    async def send(self, message: OutboundMessage) -> Receipt:
        self._stop_typing(message)
        try:
            chat_id = int(message.to.chat_id)
        except ValueError:
            raise ChannelError(
                f"bad Telegram chat id {message.to.chat_id!r}", retryable=False
            ) from None
        thread = int(message.to.thread_id) if message.to.thread_id else None
        markup = self._markup(message)
        if message.edit_of is not None and message.edit_message_id:
            return await self._edit(chat_id, int(message.edit_message_id), message.text, markup)
        if message.file is not None:
            return await self._send_file(chat_id, thread, message, markup)
        parts = await _rendered(message.text, message.format == TextFormat.MARKDOWN, self.masker)
        sent = self._parts_sent.setdefault(message.id, [])
        preview = self._preview_message_of(message) if not sent else None
        if preview is not None:  # the reply takes the place of its preview message
            await self.pacer.wait(str(chat_id))
            first = parts[0]
            try:
                await self._formatted_call(
                    lambda entities: self.bot.edit_message_text(
                        text=first.text, chat_id=chat_id, message_id=preview,
                        entities=_entities(first) if entities else None,
                        reply_markup=markup if len(parts) == 1 else None,
                    ),
                    bool(first.spans),
                )  # fmt: skip
                sent.append(preview)
                self._left_previews.pop(str(message.metadata.get("inbound_id", "")), None)
            except ChannelError as exc:
                if exc.retryable:
                    raise
                self._left_previews.pop(str(message.metadata.get("inbound_id", "")), None)
                self._spawn(self._delete(chat_id, preview))
                log.info("telegram: the preview message was not edited (%s); sending anew", exc)
        reply_to = message.quote
        for index in range(len(sent), len(parts)):
            await self.pacer.wait(str(chat_id))
            last = index == len(parts) - 1
            part = parts[index]
            fields: dict[str, Any] = {
                "chat_id": chat_id,
                "text": part.text,
                "message_thread_id": thread,
                "reply_markup": markup if last else None,
                "reply_parameters": (
                    ReplyParameters(message_id=int(reply_to), allow_sending_without_reply=True)
                    if reply_to and reply_to.isdigit() and index == 0
                    else None
                ),
            }

            def request(entities: bool, f: dict[str, Any] = fields, p: Formatted = part) -> Any:
                return self.bot.send_message(**f, entities=_entities(p) if entities else None)

            result = await self._formatted_call(request, bool(part.spans))
            sent.append(result.message_id)
        self._parts_sent.pop(message.id, None)
        return Receipt(channel_message_id=str(sent[-1]))

    async def _send_file(
        self,
        chat_id: int,
        thread: int | None,
        message: OutboundMessage,
        markup: InlineKeyboardMarkup | None,
    ) -> Receipt:
        """A document or photo (``send_file``), its text as the caption."""
        assert message.file is not None
        path = Path(message.file.path)
        if not await asyncio.to_thread(path.is_file):
            raise ChannelError(f"the file to send is gone ({message.file.name})", retryable=False)
        caption = None
        if message.text.strip():
            markdown = message.format == TextFormat.MARKDOWN
            caption = message_parts(message.text, markdown, self.masker, limit=MAX_CAPTION)[0]
        fields: dict[str, Any] = {
            "chat_id": chat_id,
            "message_thread_id": thread,
            "caption": caption.text if caption else None,
            "caption_entities": _entities(caption) if caption and caption.spans else None,
            "reply_markup": markup,
        }
        upload = FSInputFile(path, filename=message.file.name)
        await self.pacer.wait(str(chat_id))
        if message.file.kind == MediaKind.PHOTO:
            try:
                result = await self._call(self.bot.send_photo(photo=upload, **fields))
                return Receipt(channel_message_id=str(result.message_id))
            except ChannelError as exc:
                if exc.retryable:
                    raise
                log.info("telegram: the photo was refused (%s); sending it as a document", exc)
        result = await self._call(self.bot.send_document(document=upload, **fields))
        return Receipt(channel_message_id=str(result.message_id))

    @staticmethod
    def _markup(message: OutboundMessage) -> InlineKeyboardMarkup | None:
        rows = keyboard_rows(message.buttons)
        if not rows:
            return None
        return InlineKeyboardMarkup(
            inline_keyboard=[
                [InlineKeyboardButton(text=label, callback_data=data) for label, data in row]
                for row in rows
            ]
        )

    async def _edit(
        self, chat_id: int, message_id: int, text: str, markup: InlineKeyboardMarkup | None
    ) -> Receipt:
        await self.pacer.wait(str(chat_id))
        try:
            await self._call(
                self.bot.edit_message_text(
                    text=message_parts(text, False, self.masker)[0].text,
                    chat_id=chat_id,
                    message_id=message_id,
                    reply_markup=markup,
                )
            )
        except ChannelError as exc:
            if exc.retryable:
                raise
            # Too old, not modified, deleted: the decision stands; the edit is cosmetic.
            log.info("telegram: edit of message %s in %s refused: %s", message_id, chat_id, exc)
        return Receipt(channel_message_id=str(message_id))

    async def _formatted_call(self, request: Callable[[bool], Awaitable[T]], formatted: bool) -> T:
        """Send with entities; if Telegram refuses them, the same text plain (the
        fallback for anything the renderer got wrong: a reply is never lost to it)."""
        try:
            return await self._call(request(formatted))
        except ChannelError as exc:
            if not formatted or exc.retryable or "entit" not in str(exc).lower():
                raise
            log.warning("telegram: formatting refused (%s); sending plain text", exc)
        return await self._call(request(False))

    async def _call(self, request: Awaitable[T]) -> T:
        """Await a Bot API call, mapping its errors onto the delivery worker's."""
        try:
            return await request
        except TelegramRetryAfter as exc:
            raise ChannelError("rate limited (429)", retry_after=float(exc.retry_after)) from None
        except TelegramForbiddenError as exc:
            raise ChannelError(f"forbidden: {exc.message}", retryable=False) from None
        except TelegramBadRequest as exc:
            raise ChannelError(f"bad request: {exc.message}", retryable=False) from None
        except (TelegramServerError, TelegramNetworkError, TimeoutError, OSError) as exc:
            raise ChannelError(f"network or server error: {exc}") from None
        except TelegramUnauthorizedError:
            raise ChannelError("the Bot API rejected the token (401)") from None
        except AiogramError as exc:  # e.g. an unreadable answer (ClientDecodeError)
            raise ChannelError(f"Bot API error: {exc}") from None
