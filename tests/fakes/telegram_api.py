"""A fake Telegram Bot API server for tests.

The real aiogram client talks HTTP to it on 127.0.0.1::

    async with FakeTelegramAPI(token="123:ABC") as api:
        async with api.make_bot() as bot:  # aiogram.Bot pointed at the fake
            api.push_message("hi")
            updates = await bot.get_updates(timeout=1)

URLs are ``{base_url}/bot{token}/{method}``. aiogram POSTs every method as a form
(``application/x-www-form-urlencoded``, or ``multipart/form-data`` when a file is attached)
where string values are sent raw and everything else (ints, bools, dicts, lists) as JSON
text; the fake decodes them back into ``Call.params``. Answers are ``{"ok": true, "result":
...}`` or ``{"ok": false, "error_code": N, "description": "...", "parameters": {...}}`` with
the matching HTTP status, which aiogram turns into its ``Telegram*Error`` exceptions.

State is plain Python: ``calls``, ``offsets``, ``messages_by_id``, ``callback_answers``,
``webhook``, ``commands``… Handlers never await before mutating state, so a test woken by
``wait_for_call`` sees the effect of that call already applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiohttp import web

from tests.fakes.limits import TokenBucket
from tests.waiting import eventually

JSON = dict[str, Any]
ChatId = int | str

BOT_ID = 999
BOT_USERNAME = "echo_test_bot"
BOT_FIRST_NAME = "Echo"

MAX_TEXT_LENGTH = 4096  # UTF-16 code units
MAX_CAPTION_LENGTH = 1024
MAX_CALLBACK_DATA_BYTES = 64
MAX_UPLOAD_PHOTO = 10 * 1024 * 1024  # what bots may upload: a photo, any other file
MAX_UPLOAD_FILE = 50 * 1024 * 1024
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # getFile refuses bigger files ("file is too big")

UNAUTHORIZED = "Unauthorized"
TEXT_EMPTY = "Bad Request: message text is empty"
TEXT_TOO_LONG = "Bad Request: message is too long"
CAPTION_TOO_LONG = "Bad Request: message caption is too long"
PARSE_MODE_UNSUPPORTED = "Bad Request: parse_mode is not supported by this fake"
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
EDIT_NOT_FOUND = "Bad Request: message to edit not found"
CANT_EDIT = "Bad Request: message can't be edited"
DELETE_NOT_FOUND = "Bad Request: message to delete not found"
REPLY_NOT_FOUND = "Bad Request: message to be replied not found"
CHAT_NOT_FOUND = "Bad Request: chat not found"
QUERY_TOO_OLD = "Bad Request: query is too old and response timeout expired or query ID is invalid"
BLOCKED = "Forbidden: bot was blocked by the user"
BUTTON_DATA_INVALID = "Bad Request: BUTTON_DATA_INVALID"
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; "
    "make sure that only one bot instance is running"
)

# Update types Telegram leaves out unless allowed_updates asks for them explicitly.
DEFAULT_EXCLUDED_UPDATES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})

_DEFAULT_DESCRIPTIONS = {
    400: "Bad Request",
    401: UNAUTHORIZED,
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
}

# Form fields of the methods handled below that are strings in the Bot API: never
# JSON-decode them ("123" stays "123").
# fmt: off
_STRING_FIELDS = frozenset({
    "text", "caption", "parse_mode", "callback_query_id", "url", "secret_token", "action",
    "language_code", "file_id", "photo", "document",
})
# fmt: on

# fmt: off
_CHAT_ACTIONS = frozenset({
    "typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
    "upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note",
})
# fmt: on

# fmt: off
_INLINE_BUTTON_ACTIONS = frozenset({
    "url", "callback_data", "web_app", "login_url", "switch_inline_query",
    "switch_inline_query_current_chat", "switch_inline_query_chosen_chat", "copy_text",
    "callback_game", "pay",
})
# fmt: on


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass
class Call:
    """One HTTP request the bot made. ``status``/``response`` are set once it was answered."""

    method: str
    params: dict[str, Any]
    at: float
    token: str = ""
    status: int | None = None
    response: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class UploadedFile:
    """A file part of a multipart request (``params[field]`` is ``"attach://<field>"``)."""

    field: str
    filename: str
    content_type: str
    data: bytes


@dataclass
class Webhook:
    url: str
    secret_token: str | None = None


@dataclass
class RateLimits:
    """Telegram's documented flood limits, as token buckets (rate per second, burst)."""

    per_chat_rate: float = 1.0
    per_chat_burst: int = 3
    global_rate: float = 30.0
    global_burst: int = 30
    group_per_minute: int = 20  # extra limit for chats with a negative id (groups/channels)
    # Edits and drafts count like messages: Telegram does not document their limits, and
    # counting them is the strict assumption.


@dataclass
class _Fault:
    status: int
    description: str
    retry_after: int | None
    remaining: int
    body: str | None = None
    disconnect: bool = False
    redirect: bool = False


class ApiError(Exception):
    """Raised inside handlers; becomes a Telegram-style error response."""

    def __init__(self, status: int, description: str, *, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after

    def payload(self) -> JSON:
        body: JSON = {"ok": False, "error_code": self.status, "description": self.description}
        if self.retry_after is not None:
            body["parameters"] = {"retry_after": self.retry_after}
        return body


# ---------------------------------------------------------------------------------------------
# Explicit entities — enough of Telegram's rules to reject what Telegram rejects
# ---------------------------------------------------------------------------------------------


class EntityParseError(ValueError):
    """Text Telegram would refuse with "Bad Request: can't parse entities: ..."."""


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


ENTITY_TYPES = frozenset(
    {"mention", "hashtag", "cashtag", "bot_command", "url", "email", "phone_number", "bold",
     "italic", "underline", "strikethrough", "spoiler", "blockquote", "expandable_blockquote",
     "code", "pre", "text_link", "text_mention", "custom_emoji"}
)  # fmt: skip
_STYLE_ENTITIES = frozenset({"bold", "italic", "underline", "strikethrough", "spoiler"})
_QUOTES = frozenset({"blockquote", "expandable_blockquote"})
_LINK_URL = re.compile(r"(https?|tg)://[^\s]+|mailto:[^\s]+", re.IGNORECASE)


def check_entities(text: str, entities: list[JSON]) -> None:
    """Telegram's rules for explicit entities (Bot API, "MessageEntity" and "Formatting
    options"): inside the text in UTF-16 units, not cutting a surrogate pair; either nested
    or apart; nothing inside code or pre; styles never around code or pre; no quote in a
    quote; text_link with a URL. Raises EntityParseError as Telegram refuses them."""
    size = utf16_len(text)
    units = text.encode("utf-16-le")
    spans: list[tuple[int, int, str]] = []
    for index, entity in enumerate(entities):
        if not isinstance(entity, dict):
            raise EntityParseError(f"entity {index} is not an object")
        kind, offset, length = entity.get("type"), entity.get("offset"), entity.get("length")
        if kind not in ENTITY_TYPES:
            raise EntityParseError(f"unsupported entity type {kind!r}")
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0:
            raise EntityParseError(f"entity {index} has a bad offset or length")
        if length <= 0 or offset + length > size:
            raise EntityParseError(f"entity {index} ({kind}) is outside the text")
        for edge in (offset, offset + length):
            if 0 < edge < size:
                unit = int.from_bytes(units[2 * edge : 2 * edge + 2], "little")
                if 0xDC00 <= unit <= 0xDFFF:
                    raise EntityParseError(f"entity {index} cuts a character in two")
        if kind == "text_link" and not _LINK_URL.fullmatch(str(entity.get("url") or "")):
            raise EntityParseError(f"wrong URL in entity {index}")
        spans.append((offset, offset + length, kind))
    for i, (a_start, a_end, a_kind) in enumerate(spans):
        for b_start, b_end, b_kind in spans[i + 1 :]:
            if a_end <= b_start or b_end <= a_start:
                continue
            if a_start <= b_start and b_end <= a_end:
                outer, inner = a_kind, b_kind
            elif b_start <= a_start and a_end <= b_end:
                outer, inner = b_kind, a_kind
            else:
                raise EntityParseError(f"entities {a_kind} and {b_kind} overlap")
            if outer in ("code", "pre"):
                raise EntityParseError(f"{inner} inside {outer}")
            if outer in _STYLE_ENTITIES and inner in ("code", "pre"):
                raise EntityParseError(f"{inner} inside {outer}")
            if outer in _QUOTES and inner in _QUOTES:
                raise EntityParseError("a quote inside a quote")


def checked_entities(text: str, parse_mode: Any, entities: Any) -> list[JSON]:
    """The entities Telegram stores for a text sent with explicit ``entities``.

    The channel never sends ``parse_mode`` (it computes the entities itself), so one
    arriving is a regression: refused with a 400 rather than parsed.
    """
    if parse_mode is not None:
        raise ApiError(400, PARSE_MODE_UNSUPPORTED)
    if not entities:
        return []
    try:
        check_entities(text, entities)
    except EntityParseError as exc:
        raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
    return list(entities)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _decode_field(key: str, value: str) -> Any:
    """Undo aiogram's form encoding: non-string values arrive as JSON text."""
    if key in _STRING_FIELDS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _update_type(update: JSON) -> str | None:
    return next((key for key in update if key != "update_id"), None)


def _inline_markup(markup: Any) -> JSON | None:
    """The part of reply_markup Telegram keeps on a message (inline keyboards only)."""
    if isinstance(markup, dict) and "inline_keyboard" in markup:
        return markup
    return None


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ApiError(400, f"Bad Request: {name} is invalid")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    if value is None or value == "":
        raise ApiError(400, f"Bad Request: {name} is empty")
    raise ApiError(400, f"Bad Request: {name} is invalid")


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in {"true", "1"}
    return bool(value)


class _Registered:
    def __repr__(self) -> str:
        return "REGISTERED"


REGISTERED: Any = _Registered()
"""Default for ``deliver_webhook(secret_token=...)``: use the secret from setWebhook."""


_MEDIA: dict[str, tuple[str, Callable[[str], Any]]] = {
    "sendPhoto": (
        "photo",
        lambda fid: [{"file_id": fid, "file_unique_id": f"u{fid}", "width": 90, "height": 90}],
    ),
    "sendDocument": ("document", lambda fid: {"file_id": fid, "file_unique_id": f"u{fid}"}),
}


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


class FakeTelegramAPI:
    """A Bot API peer for the real aiogram client. See the module docstring."""

    def __init__(
        self,
        token: str = "123:ABC",
        *,
        enforce_limits: bool = False,
        limits: RateLimits | None = None,
    ) -> None:
        self.token = token
        self.bot_user: JSON = {
            "id": BOT_ID,
            "is_bot": True,
            "first_name": BOT_FIRST_NAME,
            "username": BOT_USERNAME,
        }
        self.enforce_limits = enforce_limits
        self.limits = limits or RateLimits()

        # What the bot did.
        self.calls: list[Call] = []
        self.offsets: list[int | None] = []  # offset of every getUpdates (None when absent)
        # current state (after edits/deletes)
        self.messages_by_id: dict[tuple[ChatId, int], JSON] = {}
        self.callback_answers: dict[str, JSON] = {}
        self.commands: dict[tuple[str, str], list[JSON]] = {}  # (scope json, lang) -> cmds
        self.webhook: Webhook | None = None
        self.webhook_error: tuple[int, str] | None = None  # getWebhookInfo's last error
        self.allowed_updates: list[str] | None = None
        self.rate_limited = 0
        self.drafts: list[JSON] = []  # sendMessageDraft calls that were accepted
        self.downloads: list[str] = []  # file paths asked for at /file/bot<token>/<path>
        self.files: dict[str, JSON] = {}  # file_id -> data, path, size
        self._file_count = 0
        self._download_faults: list[int] = []
        self._download_gate = asyncio.Event()
        self._download_gate.set()

        # What the test injected.
        self.pushed_updates: list[JSON] = []
        self.filtered_updates: list[JSON] = []  # pushed but excluded by allowed_updates
        self.chats: dict[ChatId, JSON] = {}
        self.blocked_chats: set[ChatId] = set()

        self._sent: list[JSON] = []
        self._pending: list[JSON] = []
        self._next_update_id = 1
        self._next_message_ids: dict[ChatId, int] = {}
        self._next_callback = 1
        self._open_callbacks: set[str] = set()
        self._faults: dict[str, list[_Fault]] = {}
        self._delays: dict[str, list[float]] = {}
        self._poll_generation = 0
        self._closing = False
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._global_bucket: TokenBucket | None = None
        self._chat_buckets: dict[ChatId, TokenBucket] = {}
        self._group_buckets: dict[ChatId, TokenBucket] = {}

        self._handlers: dict[str, Callable[[JSON], Awaitable[Any]]] = {
            "getMe": self._get_me,
            "getUpdates": self._get_updates,
            "setWebhook": self._set_webhook,
            "deleteWebhook": self._delete_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "setMyCommands": self._set_my_commands,
            "getMyCommands": self._get_my_commands,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "editMessageReplyMarkup": self._edit_message_reply_markup,
            "deleteMessage": self._delete_message,
            "answerCallbackQuery": self._answer_callback_query,
            "sendChatAction": self._send_chat_action,
            "getFile": self._get_file,
            "sendMessageDraft": self._send_message_draft,
        }
        for media_method in _MEDIA:
            self._handlers[media_method] = self._media_handler(media_method)
        self._canonical = {name.lower(): name for name in self._handlers}

        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_route("GET", "/file/bot{token}/{path:.+}", self._download)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self._closing = True  # pending long polls answer [] right away
        self._download_gate.set()
        self._stopping.set()
        self._pulse()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def server(self) -> TelegramAPIServer:
        return TelegramAPIServer.from_base(self.base_url)

    def make_bot(self, token: str | None = None) -> Bot:
        """A real aiogram Bot pointed at this server (use ``async with`` to close it)."""
        return Bot(token or self.token, session=AiohttpSession(api=self.server))

    # -- inspection -----------------------------------------------------------------------------

    def calls_of(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    async def wait_for_call(
        self,
        method: str,
        predicate: Callable[[Call], bool] | None = None,
        timeout: float = 10.0,
        *,
        after: int = 0,
    ) -> Call:
        """The first call of ``method`` (among ``calls[after:]``) matching ``predicate``.

        Returns an existing call at once; otherwise waits for one. Pass
        ``after=len(api.calls)`` to only accept calls made from now on.
        """
        return (await self.wait_for_calls(method, 1, predicate, timeout, after=after))[0]

    async def wait_for_calls(
        self,
        method: str,
        count: int,
        predicate: Callable[[Call], bool] | None = None,
        timeout: float = 10.0,
        *,
        after: int = 0,
    ) -> list[Call]:
        def matching() -> list[Call]:
            return [
                call
                for call in self.calls[after:]
                if call.method == method and (predicate is None or predicate(call))
            ]

        def seen() -> str:
            calls = ", ".join(call.method for call in self.calls[after:]) or "none"
            return f"expected {count} {method} call(s), got {len(matching())}; calls seen: {calls}"

        def enough() -> list[list[Call]] | None:  # boxed: a (wanted) empty list is found
            found = matching()
            return [found] if len(found) >= count else None

        [found] = await eventually(
            enough,
            timeout,
            seen,
            woken_by=lambda: self._changed.wait(),
        )
        return found[:count]

    def sent_messages(self, chat_id: ChatId | None = None) -> list[JSON]:
        """Messages the bot sent, as they were when sent (see ``messages_by_id`` for edits).

        Keys: method, message_id, chat_id, date, text, caption, plain_text (the text or
        caption), entities, reply_markup, reply_to_message_id, message_thread_id, media.
        """
        return [copy.deepcopy(m) for m in self._sent if chat_id is None or m["chat_id"] == chat_id]

    def sent_texts(self, chat_id: ChatId | None = None) -> list[str]:
        return [m["plain_text"] for m in self.sent_messages(chat_id)]

    def message(self, chat_id: ChatId, message_id: int) -> JSON | None:
        """Current state of a stored message (bot's or user's), or None if unknown/deleted."""
        return self.messages_by_id.get((chat_id, message_id))

    def my_commands(self, scope: JSON | None = None, language_code: str = "") -> list[JSON]:
        return list(self.commands.get((self._scope_key(scope), language_code), []))

    @property
    def pending_updates(self) -> list[JSON]:
        """Updates not yet confirmed by an offset (what getUpdates would return)."""
        return copy.deepcopy(self._pending)

    # -- injection ------------------------------------------------------------------------------

    def push_update(self, raw: JSON) -> int:
        """Queue an arbitrary update; assigns ``update_id`` unless present. Returns the id."""
        update = copy.deepcopy(raw)
        update_id = update.get("update_id")
        if update_id is None:
            update_id = self._next_update_id
        update_id = int(update_id)
        update["update_id"] = update_id
        self._next_update_id = max(self._next_update_id, update_id + 1)
        for key in ("message", "edited_message", "channel_post", "edited_channel_post"):
            message = update.get(key)
            if isinstance(message, dict):
                self._remember_user_message(message)
        self.pushed_updates.append(update)
        if self._is_allowed(update):
            self._pending.append(update)
            self._pending.sort(key=lambda u: u["update_id"])
        else:
            self.filtered_updates.append(update)
        self._pulse()
        return update_id

    def push_message(
        self,
        text: str,
        *,
        user_id: int = 42,
        chat_id: int | None = None,
        chat_type: str = "private",
        username: str | None = None,
        first_name: str = "User",
        message_thread_id: int | None = None,
        reply_to_message: int | None = None,
        entities: list[JSON] | None = None,
        content: JSON | None = None,
    ) -> int:
        """A user writes ``text``. ``reply_to_message`` is the id of a stored message.

        Group/supergroup chats default to ``chat_id = -(10**12 + user_id)``. Commands get a
        bot_command entity. Returns the update_id (the message is
        ``api.pushed_updates[-1]``). ``content`` replaces the text: e.g.
        ``{"photo": api.photo(data), "caption": "…"}``.
        """
        user: JSON = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            user["username"] = username
        if chat_id is None:
            chat_id = user_id if chat_type == "private" else -(10**12 + user_id)
        chat: JSON = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
            if username:
                chat["username"] = username
        else:
            chat["title"] = self.chats.get(chat_id, {}).get("title", "Test chat")
            if chat_type == "supergroup" and message_thread_id is not None:
                chat["is_forum"] = True
        self.chats[chat_id] = chat
        message: JSON = {
            "message_id": self._take_message_id(chat_id),
            "date": int(time.time()),
            "chat": dict(chat),
            "from": user,
            **(content if content is not None else {"text": text}),
        }
        if message_thread_id is not None:
            message["message_thread_id"] = message_thread_id
            if chat.get("is_forum"):
                message["is_topic_message"] = True
        if reply_to_message is not None:
            target = self.message(chat_id, reply_to_message)
            if target is None:
                raise ValueError(f"no stored message {reply_to_message} in chat {chat_id}")
            message["reply_to_message"] = self._message_object(target, with_reply=False)
        if entities is None and content is None and text.startswith("/"):
            command = text.split(maxsplit=1)[0] if text.strip() else text
            entities = [{"type": "bot_command", "offset": 0, "length": utf16_len(command)}]
        if entities:
            message["entities"] = entities
        return self.push_update({"message": message})

    # -- files users send -----------------------------------------------------------------------
    def add_file(self, data: bytes, name: str = "file.bin", *, size: int | None = None) -> JSON:
        """A file on Telegram's servers: its description as messages carry it
        (``file_id``, ``file_unique_id``, ``file_size``; ``size`` overrides the real size,
        to announce a file that is too big without sending 20 MB)."""
        self._file_count += 1
        file_id = f"BQAC-file-{self._file_count}"
        self.files[file_id] = {
            "data": data,
            "path": f"documents/file_{self._file_count}_{name}",
            "size": len(data) if size is None else size,
        }
        return {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "file_size": self.files[file_id]["size"],
        }

    def photo(self, data: bytes, *, small: bytes = b"small") -> list[JSON]:
        """The PhotoSize list of a photo: a thumbnail and the full size."""
        return [
            {**self.add_file(small, "thumb.jpg"), "width": 90, "height": 60},
            {**self.add_file(data, "photo.jpg"), "width": 1280, "height": 853},
        ]

    def forget_file(self, file_id: str) -> None:
        """The file is gone from Telegram's servers (its id no longer works)."""
        self.files.pop(file_id, None)

    def hold_downloads(self) -> None:
        """File downloads wait (asked for, unanswered) until ``release_downloads``."""
        self._download_gate.clear()

    def release_downloads(self) -> None:
        self._download_gate.set()

    def fail_downloads(self, count: int = 1, *, status: int = 0) -> None:
        """The next ``count`` file downloads fail: ``status`` 0 drops the connection."""
        self._download_faults.extend([status] * count)

    async def _send_message_draft(self, params: JSON) -> bool:
        """A draft shown in a private chat while a reply is written: kept in ``drafts``
        (chat id, draft id, plain text, entities, can_stop)."""
        chat_id = self._resolve_chat(params)
        if not isinstance(chat_id, int) or chat_id <= 0:
            raise ApiError(400, "Bad Request: drafts can be sent only to private chats")
        draft_id = _as_int(params.get("draft_id"), "draft_id")
        if draft_id == 0:
            raise ApiError(400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        entities = checked_entities(text, params.get("parse_mode"), params.get("entities"))
        if utf16_len(text) > MAX_TEXT_LENGTH:
            raise ApiError(400, TEXT_TOO_LONG)
        self._check_blocked(chat_id)
        self._check_rate(chat_id)
        self.drafts.append(
            {"chat_id": chat_id, "draft_id": draft_id, "plain_text": text, "entities": entities,
             "can_stop": _as_bool(params.get("can_stop", False)), "at": time.monotonic()}
        )  # fmt: skip
        return True

    def push_stop(self, chat_id: int, draft_id: int) -> int:
        """The user presses the stop button of a draft: a stopped_message_generation
        update. Returns its update_id."""
        chat = self.chats.get(chat_id, {"id": chat_id, "type": "private", "first_name": "User"})
        return self.push_update(
            {"stopped_message_generation": {"chat": dict(chat), "draft_id": draft_id}}
        )

    async def _get_file(self, params: JSON) -> JSON:
        file_id = str(params.get("file_id") or "")
        stored = self.files.get(file_id)
        if stored is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        if stored["size"] > MAX_DOWNLOAD_BYTES:
            raise ApiError(400, "Bad Request: file is too big")
        return {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "file_size": stored["size"],
            "file_path": stored["path"],
        }

    async def _download(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        self.downloads.append(path)
        self._pulse()
        await self._download_gate.wait()
        if self._download_faults:
            status = self._download_faults.pop(0)
            if status == 0:
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=500)
            return web.Response(status=status, text="error")
        if request.match_info["token"] != self.token:
            return web.json_response(
                {"ok": False, "error_code": 404, "description": "Not Found"}, status=404
            )
        stored = next((f for f in self.files.values() if f["path"] == path), None)
        if stored is None:
            return web.json_response(
                {"ok": False, "error_code": 404, "description": "Not Found"}, status=404
            )
        return web.Response(body=stored["data"], content_type="application/octet-stream")

    def push_callback(
        self,
        data: str,
        *,
        user_id: int = 42,
        message_id: int | None,
        chat_id: int | None = None,
    ) -> tuple[int, str]:
        """A user presses an inline button carrying ``data`` on a stored bot message.

        ``message_id=None`` sends a callback without a message. Returns (update_id,
        callback_id); the id stays answerable once via answerCallbackQuery.
        """
        if chat_id is None:
            chat_id = user_id
        callback_id = str(4_000_000_000 + self._next_callback)
        self._next_callback += 1
        query: JSON = {
            "id": callback_id,
            "from": {"id": user_id, "is_bot": False, "first_name": "User"},
            "chat_instance": f"{abs(chat_id)}{self.bot_user['id']}",
            "data": data,
        }
        if message_id is not None:
            record = self.message(chat_id, message_id)
            if record is None:
                raise ValueError(f"no stored message {message_id} in chat {chat_id}")
            query["message"] = self._message_object(record)
        self._open_callbacks.add(callback_id)
        return self.push_update({"callback_query": query}), callback_id

    def block_chat(self, chat_id: ChatId) -> None:
        """The user blocked the bot: sends to this chat answer 403."""
        self.blocked_chats.add(chat_id)

    def unblock_chat(self, chat_id: ChatId) -> None:
        self.blocked_chats.discard(chat_id)

    def fail_next(
        self,
        method: str,
        *,
        status: int,
        description: str | None = None,
        retry_after: int | None = None,
        count: int = 1,
        body: str | None = None,
    ) -> None:
        """The next ``count`` calls of ``method`` fail with this error (and have no effect).

        ``body`` replaces the JSON answer with raw text (e.g. an HTML 502 page).
        """
        if description is None:
            description = _DEFAULT_DESCRIPTIONS.get(status, f"Error {status}")
            if status == 429:
                description = f"Too Many Requests: retry after {retry_after or 1}"
        if status == 429 and retry_after is None:
            retry_after = 1
        self._faults.setdefault(method, []).append(
            _Fault(status, description, retry_after, count, body)
        )

    def disconnect_next(self, method: str, *, count: int = 1) -> None:
        """Drop the connection without answering (aiogram raises TelegramNetworkError)."""
        self._faults.setdefault(method, []).append(_Fault(0, "", None, count, disconnect=True))

    def redirect_next(self, method: str, *, count: int = 1) -> None:
        """Answer the next ``count`` requests of ``method`` with ``302`` to the same URL:
        a redirect loop (the client gives up with TooManyRedirects, naming the URL —
        which holds the token)."""
        self._faults.setdefault(method, []).append(_Fault(302, "", None, count, redirect=True))

    def delay_next(self, method: str, seconds: float, *, count: int = 1) -> None:
        """Delay the answer to the next ``count`` calls; their effect happens at once."""
        self._delays.setdefault(method, []).extend([seconds] * count)

    async def deliver_webhook(
        self,
        url: str | None,
        update: JSON | int,
        secret_token: str | None = REGISTERED,
    ) -> int:
        """POST an update to the bot's webhook like Telegram does; returns the HTTP status.

        ``url=None`` uses the URL from setWebhook. ``update`` is a raw update dict (an
        update_id is assigned if missing) or the update_id of a pending pushed update, which
        is then removed from the queue on a 2xx answer. ``secret_token`` defaults to the one
        given to setWebhook; ``None`` sends no X-Telegram-Bot-Api-Secret-Token header. The
        answer body is read and dropped (the channel answers webhooks with no method).
        """
        if url is None:
            if self.webhook is None:
                raise ValueError("no webhook registered and no url given")
            url = self.webhook.url
        if isinstance(update, int):
            body = next((u for u in self._pending if u["update_id"] == update), None)
            if body is None:
                raise ValueError(f"no pending update {update}")
        else:
            body = copy.deepcopy(update)
            if "update_id" not in body:
                body["update_id"] = self._next_update_id
            self._next_update_id = max(self._next_update_id, int(body["update_id"]) + 1)
        if secret_token is REGISTERED:
            secret_token = self.webhook.secret_token if self.webhook else None
        headers = {"Content-Type": "application/json"}
        if secret_token is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret_token
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url,
                data=json.dumps(body),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10.0),
            ) as resp,
        ):
            status = resp.status
            await resp.read()
        if 200 <= status < 300 and isinstance(update, int):
            self._pending = [u for u in self._pending if u["update_id"] != update]
        return status

    # -- HTTP plumbing --------------------------------------------------------------------------

    def _pulse(self) -> None:
        """Wake everybody waiting on a state change."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        raw_method = request.match_info["method"]
        params = await self._read_params(request)
        method = self._canonical.get(raw_method.lower(), raw_method)
        call = Call(method=method, params=params, at=time.monotonic(), token=token)
        self.calls.append(call)
        self._pulse()
        fault = self._take_fault(method) if token == self.token else None
        if fault is not None and fault.disconnect:
            call.status = 0
            self._pulse()
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)
        if fault is not None and fault.redirect:
            call.status = fault.status
            self._pulse()
            raise web.HTTPFound(location=str(request.url))
        if fault is not None and fault.body is not None:
            call.status = fault.status
            self._pulse()
            return web.Response(status=fault.status, text=fault.body, content_type="text/html")
        if fault is not None:
            status, payload = (
                fault.status,
                ApiError(fault.status, fault.description, retry_after=fault.retry_after).payload(),
            )
        else:
            status, payload = await self._answer(call)
        call.status, call.response = status, payload
        self._pulse()
        delays = self._delays.get(method)
        if delays:
            with contextlib.suppress(TimeoutError):  # stop() cuts delays short
                await asyncio.wait_for(self._stopping.wait(), delays.pop(0))
        return web.json_response(payload, status=status)

    async def _answer(self, call: Call) -> tuple[int, JSON]:
        if call.token != self.token:
            return 401, ApiError(401, UNAUTHORIZED).payload()
        handler = self._handlers.get(call.method)
        try:
            # A method the fake does not model is recorded and answers true.
            result = True if handler is None else await handler(call.params)
        except ApiError as exc:
            return exc.status, exc.payload()
        return 200, {"ok": True, "result": result}

    @staticmethod
    async def _read_params(request: web.Request) -> JSON:
        params: JSON = {}
        if not request.body_exists:
            return params
        if request.content_type == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                params.update(body)
            return params
        form = await request.post()
        for key, value in form.items():
            if isinstance(value, web.FileField):
                params[key] = UploadedFile(
                    field=key,
                    filename=value.filename,
                    content_type=value.content_type,
                    data=value.file.read(),
                )
            else:
                params[key] = _decode_field(key, str(value))
        return params

    def _take_fault(self, method: str) -> _Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return None
        fault = queue[0]
        fault.remaining -= 1
        if fault.remaining <= 0:
            queue.pop(0)
        return fault

    # -- state helpers --------------------------------------------------------------------------

    def _is_allowed(self, update: JSON) -> bool:
        kind = _update_type(update)
        if not self.allowed_updates:
            return kind not in DEFAULT_EXCLUDED_UPDATES
        return kind in self.allowed_updates

    def _take_message_id(self, chat_id: ChatId) -> int:
        message_id = self._next_message_ids.get(chat_id, 1)
        self._next_message_ids[chat_id] = message_id + 1
        return message_id

    def _remember_user_message(self, message: JSON) -> None:
        chat = message.get("chat")
        message_id = message.get("message_id")
        if not isinstance(chat, dict) or not isinstance(message_id, int) or "id" not in chat:
            return
        chat_id = chat["id"]
        self.chats.setdefault(chat_id, dict(chat))
        self._next_message_ids[chat_id] = max(
            self._next_message_ids.get(chat_id, 1), message_id + 1
        )
        reply = message.get("reply_to_message")
        self.messages_by_id[(chat_id, message_id)] = {
            "method": None,
            "message_id": message_id,
            "chat_id": chat_id,
            "date": message.get("date", 0),
            "text": message.get("text"),
            "caption": message.get("caption"),
            "plain_text": message.get("text") or message.get("caption") or "",
            "entities": message.get("entities", []),
            "reply_markup": message.get("reply_markup"),
            "reply_to_message_id": reply.get("message_id") if isinstance(reply, dict) else None,
            "message_thread_id": message.get("message_thread_id"),
            "from_bot": False,
            "raw": copy.deepcopy(message),
        }

    def _chat(self, chat_id: ChatId) -> JSON:
        chat = self.chats.get(chat_id)
        if chat is None:
            if isinstance(chat_id, int) and chat_id > 0:
                chat = {"id": chat_id, "type": "private", "first_name": "User"}
            else:
                chat = {"id": chat_id, "type": "supergroup", "title": f"Chat {chat_id}"}
            self.chats[chat_id] = chat
        return dict(chat)

    def _resolve_chat(self, params: JSON) -> ChatId:
        raw = params.get("chat_id")
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        try:
            return _as_int(raw, "chat_id")
        except ApiError:
            raise ApiError(400, CHAT_NOT_FOUND) from None

    def _message_object(self, record: JSON, *, with_reply: bool = True) -> JSON:
        """The Message JSON Telegram would return for a stored record."""
        if not record["from_bot"]:
            raw: JSON = copy.deepcopy(record["raw"])
            if not with_reply:
                raw.pop("reply_to_message", None)
            return raw
        chat = self._chat(record["chat_id"])
        obj: JSON = {
            "message_id": record["message_id"],
            "date": record["date"],
            "chat": chat,
            "from": dict(self.bot_user),
        }
        if record["message_thread_id"] is not None:
            obj["message_thread_id"] = record["message_thread_id"]
            if chat.get("is_forum"):
                obj["is_topic_message"] = True
        if record["media"] is not None:
            obj[record["media"]] = copy.deepcopy(record["media_object"])
            if record["plain_text"]:
                obj["caption"] = record["plain_text"]
            if record["entities"]:
                obj["caption_entities"] = copy.deepcopy(record["entities"])
        else:
            obj["text"] = record["plain_text"]
            if record["entities"]:
                obj["entities"] = copy.deepcopy(record["entities"])
        markup = _inline_markup(record["reply_markup"])
        if markup is not None:
            obj["reply_markup"] = copy.deepcopy(markup)
        if record.get("edit_date"):
            obj["edit_date"] = record["edit_date"]
        reply_id = record["reply_to_message_id"]
        if with_reply and reply_id is not None:
            target = self.message(record["chat_id"], reply_id)
            if target is not None:
                obj["reply_to_message"] = self._message_object(target, with_reply=False)
        return obj

    @staticmethod
    def _check_markup(markup: Any) -> JSON | None:
        if markup is None:
            return None
        if not isinstance(markup, dict):
            raise ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object")
        rows = markup.get("inline_keyboard")
        if rows is None:
            return markup
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise ApiError(400, 'Bad Request: field "inline_keyboard" must be of type Array')
        for row in rows:
            for button in row:
                if not isinstance(button, dict) or not button.get("text"):
                    raise ApiError(400, "Bad Request: can't parse inline keyboard button")
                actions = _INLINE_BUTTON_ACTIONS & button.keys()
                if not actions:
                    raise ApiError(
                        400,
                        "Bad Request: can't parse inline keyboard button: "
                        "Text buttons are unallowed in the inline keyboard",
                    )
                if "callback_data" in button:
                    data = str(button["callback_data"])
                    if not 1 <= len(data.encode()) <= MAX_CALLBACK_DATA_BYTES:
                        raise ApiError(400, BUTTON_DATA_INVALID)
                if "url" in button and not re.match(r"(https?|tg)://", str(button["url"])):
                    raise ApiError(
                        400,
                        f"Bad Request: inline keyboard button URL '{button['url']}' is invalid: "
                        "Wrong HTTP URL",
                    )
        return markup

    def _reply_target(self, chat_id: ChatId, params: JSON) -> int | None:
        reply_id = params.get("reply_to_message_id")
        allow = _as_bool(params.get("allow_sending_without_reply", False))
        reply_parameters = params.get("reply_parameters")
        if isinstance(reply_parameters, dict):
            reply_id = reply_parameters.get("message_id", reply_id)
            allow = allow or _as_bool(reply_parameters.get("allow_sending_without_reply", False))
        if reply_id is None:
            return None
        reply_id = _as_int(reply_id, "reply_to_message_id")
        if self.message(chat_id, reply_id) is None:
            if allow:
                return None
            raise ApiError(400, REPLY_NOT_FOUND)
        return reply_id

    def _check_blocked(self, chat_id: ChatId) -> None:
        if chat_id in self.blocked_chats:
            raise ApiError(403, BLOCKED)

    def _check_rate(self, chat_id: ChatId) -> None:
        if not self.enforce_limits:
            return
        now = time.monotonic()
        limits = self.limits
        if self._global_bucket is None:
            self._global_bucket = TokenBucket(limits.global_rate, limits.global_burst)
        buckets = [self._global_bucket]
        buckets.append(
            self._chat_buckets.setdefault(
                chat_id, TokenBucket(limits.per_chat_rate, limits.per_chat_burst)
            )
        )
        if isinstance(chat_id, int) and chat_id < 0:
            buckets.append(
                self._group_buckets.setdefault(
                    chat_id,
                    TokenBucket(limits.group_per_minute / 60, limits.group_per_minute),
                )
            )
        wait = max(bucket.wait(now) for bucket in buckets)
        if wait > 0:
            self.rate_limited += 1
            retry_after = max(1, math.ceil(wait))
            raise ApiError(
                429, f"Too Many Requests: retry after {retry_after}", retry_after=retry_after
            )
        for bucket in buckets:
            bucket.take()

    def _store_bot_message(
        self,
        method: str,
        chat_id: ChatId,
        params: JSON,
        *,
        plain: str,
        entities: list[JSON],
        markup: JSON | None,
        reply_to: int | None,
        media: str | None = None,
        media_object: Any = None,
    ) -> JSON:
        thread = params.get("message_thread_id")
        record: JSON = {
            "method": method,
            "message_id": self._take_message_id(chat_id),
            "chat_id": chat_id,
            "date": int(time.time()),
            "text": params.get("text") if media is None else None,
            "caption": params.get("caption") if media is not None else None,
            "plain_text": plain,
            "entities": entities,
            "reply_markup": markup,
            "reply_to_message_id": reply_to,
            "message_thread_id": None if thread is None else _as_int(thread, "message_thread_id"),
            "media": media,
            "media_object": media_object,
            "from_bot": True,
            "edit_date": None,
        }
        self.messages_by_id[(chat_id, record["message_id"])] = record
        self._sent.append(copy.deepcopy(record))
        return record

    def _editable(self, params: JSON) -> JSON:
        chat_id = self._resolve_chat(params)
        message_id = _as_int(params.get("message_id"), "message_id")
        record = self.message(chat_id, message_id)
        if record is None:
            raise ApiError(400, EDIT_NOT_FOUND)
        if not record["from_bot"]:
            raise ApiError(400, CANT_EDIT)
        return record

    @staticmethod
    def _scope_key(scope: Any) -> str:
        return json.dumps(scope, sort_keys=True) if scope else "default"

    # -- methods --------------------------------------------------------------------------------

    async def _get_me(self, params: JSON) -> JSON:
        return {
            **self.bot_user,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    async def _get_updates(self, params: JSON) -> list[JSON]:
        if self.webhook is not None:
            raise ApiError(409, WEBHOOK_CONFLICT)
        offset = params.get("offset")
        offset = None if offset is None else _as_int(offset, "offset")
        self.offsets.append(offset)
        limit = min(100, max(1, _as_int(params.get("limit", 100), "limit")))
        wait = max(0.0, float(params.get("timeout", 0) or 0))
        if "allowed_updates" in params:
            allowed = params["allowed_updates"]
            self.allowed_updates = list(allowed) if isinstance(allowed, list) else None
        if offset is not None and offset > 0:
            self._pending = [u for u in self._pending if u["update_id"] >= offset]
        self._poll_generation += 1
        generation = self._poll_generation
        self._pulse()  # a poll still waiting is now superseded
        try:
            async with asyncio.timeout(wait):
                while not self._pending and not self._closing:
                    await self._changed.wait()
                    if generation != self._poll_generation:
                        raise ApiError(409, POLL_CONFLICT)
        except TimeoutError:
            pass
        return copy.deepcopy(self._pending[:limit])

    async def _set_webhook(self, params: JSON) -> bool:
        url = params.get("url") or ""
        secret = params.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        if _as_bool(params.get("drop_pending_updates", False)):
            self._pending.clear()
        allowed = params.get("allowed_updates")
        if isinstance(allowed, list):
            self.allowed_updates = allowed
        if not url:
            self.webhook = None
            return True
        self.webhook = Webhook(url=str(url), secret_token=None if secret is None else str(secret))
        self._pulse()
        return True

    async def _delete_webhook(self, params: JSON) -> bool:
        if _as_bool(params.get("drop_pending_updates", False)):
            self._pending.clear()
        self.webhook = None
        return True

    async def _get_webhook_info(self, params: JSON) -> JSON:
        info: JSON = {
            "url": self.webhook.url if self.webhook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(self._pending),
        }
        if self.webhook_error is not None:  # (unix time, message) of its last failed try
            info["last_error_date"], info["last_error_message"] = self.webhook_error
        return info

    async def _set_my_commands(self, params: JSON) -> bool:
        commands = params.get("commands")
        if not isinstance(commands, list):
            raise ApiError(400, "Bad Request: commands must be an array")
        if len(commands) > 100:
            raise ApiError(400, "Bad Request: BOT_COMMANDS_TOO_MUCH")
        for command in commands:
            if not isinstance(command, dict):
                raise ApiError(400, "Bad Request: can't parse BotCommand")
            if not re.fullmatch(r"[a-z0-9_]{1,32}", str(command.get("command", ""))):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(command.get("description", ""))) <= 256:
                raise ApiError(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        key = (self._scope_key(params.get("scope")), str(params.get("language_code") or ""))
        self.commands[key] = [
            {"command": c["command"], "description": c["description"]} for c in commands
        ]
        return True

    async def _get_my_commands(self, params: JSON) -> list[JSON]:
        return self.my_commands(params.get("scope"), str(params.get("language_code") or ""))

    async def _send_message(self, params: JSON) -> JSON:
        chat_id = self._resolve_chat(params)
        text = params.get("text")
        if text is None or text == "":
            raise ApiError(400, TEXT_EMPTY)
        plain = str(text)
        entities = checked_entities(plain, params.get("parse_mode"), params.get("entities"))
        if not plain.strip():
            raise ApiError(400, TEXT_EMPTY)
        if utf16_len(plain) > MAX_TEXT_LENGTH:
            raise ApiError(400, TEXT_TOO_LONG)
        markup = self._check_markup(params.get("reply_markup"))
        reply_to = self._reply_target(chat_id, params)
        self._check_blocked(chat_id)
        self._check_rate(chat_id)
        record = self._store_bot_message(
            "sendMessage",
            chat_id,
            params,
            plain=plain,
            entities=entities,
            markup=markup,
            reply_to=reply_to,
        )
        return self._message_object(record)

    def _media_handler(self, method: str) -> Callable[[JSON], Awaitable[JSON]]:
        media, build = _MEDIA[method]

        async def handler(params: JSON) -> JSON:
            chat_id = self._resolve_chat(params)
            source = params.get(media)
            if source is None or source == "":
                raise ApiError(400, f"Bad Request: there is no {media} in the request")
            plain = str(params.get("caption") or "")
            entities = checked_entities(
                plain, params.get("parse_mode"), params.get("caption_entities")
            )
            if utf16_len(plain) > MAX_CAPTION_LENGTH:
                raise ApiError(400, CAPTION_TOO_LONG)
            if isinstance(source, str) and source.startswith("attach://"):
                attached = params.get(source.removeprefix("attach://"))
                if not isinstance(attached, UploadedFile):
                    raise ApiError(400, f"Bad Request: file {source!r} is not attached")
                source = attached
            if isinstance(source, UploadedFile):
                limit = MAX_UPLOAD_PHOTO if media == "photo" else MAX_UPLOAD_FILE
                if len(source.data) > limit:
                    raise ApiError(413 if media != "photo" else 400, "Request Entity Too Large")
                if not source.data:
                    raise ApiError(400, "Bad Request: file must be non-empty")
            markup = self._check_markup(params.get("reply_markup"))
            reply_to = self._reply_target(chat_id, params)
            self._check_blocked(chat_id)
            self._check_rate(chat_id)
            file_id = f"F{len(self._sent) + 1}"
            if isinstance(source, str) and not source.startswith("attach://"):
                file_id = source
            record = self._store_bot_message(
                method,
                chat_id,
                params,
                plain=plain,
                entities=entities,
                markup=markup,
                reply_to=reply_to,
                media=media,
                media_object=build(file_id),
            )
            return self._message_object(record)

        return handler

    async def _edit_message_text(self, params: JSON) -> JSON:
        text = params.get("text")
        if text is None or text == "":
            raise ApiError(400, TEXT_EMPTY)
        plain = str(text)
        entities = checked_entities(plain, params.get("parse_mode"), params.get("entities"))
        if not plain.strip():
            raise ApiError(400, TEXT_EMPTY)
        if utf16_len(plain) > MAX_TEXT_LENGTH:
            raise ApiError(400, TEXT_TOO_LONG)
        markup = self._check_markup(params.get("reply_markup"))
        record = self._editable(params)
        if record["media"] is not None:
            raise ApiError(400, "Bad Request: there is no text in the message to edit")
        self._check_rate(record["chat_id"])
        if (
            record["plain_text"] == plain
            and record["entities"] == entities
            and _inline_markup(record["reply_markup"]) == _inline_markup(markup)
        ):
            raise ApiError(400, NOT_MODIFIED)
        # Like Telegram: an edit without reply_markup removes the inline keyboard.
        record.update(
            text=plain,
            plain_text=plain,
            entities=entities,
            reply_markup=markup,
            edit_date=int(time.time()),
        )
        return self._message_object(record)

    async def _edit_message_reply_markup(self, params: JSON) -> JSON:
        markup = self._check_markup(params.get("reply_markup"))
        record = self._editable(params)
        if _inline_markup(record["reply_markup"]) == _inline_markup(markup):
            raise ApiError(400, NOT_MODIFIED)
        record.update(reply_markup=markup, edit_date=int(time.time()))
        return self._message_object(record)

    async def _delete_message(self, params: JSON) -> bool:
        chat_id = self._resolve_chat(params)
        message_id = _as_int(params.get("message_id"), "message_id")
        if self.messages_by_id.pop((chat_id, message_id), None) is None:
            raise ApiError(400, DELETE_NOT_FOUND)
        return True

    async def _answer_callback_query(self, params: JSON) -> bool:
        callback_id = str(params.get("callback_query_id", ""))
        if callback_id not in self._open_callbacks:
            raise ApiError(400, QUERY_TOO_OLD)
        self._open_callbacks.discard(callback_id)
        self.callback_answers[callback_id] = {
            "callback_query_id": callback_id,
            "text": params.get("text"),
            "show_alert": _as_bool(params.get("show_alert", False)),
            "url": params.get("url"),
            "cache_time": params.get("cache_time"),
        }
        return True

    async def _send_chat_action(self, params: JSON) -> bool:
        chat_id = self._resolve_chat(params)
        if params.get("action") not in _CHAT_ACTIONS:
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        self._check_blocked(chat_id)
        return True
