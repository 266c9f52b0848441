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
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiohttp import web

JSON = dict[str, Any]
ChatId = int | str

BOT_ID = 999
BOT_USERNAME = "echo_test_bot"
BOT_FIRST_NAME = "Echo"

MAX_TEXT_LENGTH = 4096  # UTF-16 code units, after entity parsing
MAX_CAPTION_LENGTH = 1024
MAX_CALLBACK_DATA_BYTES = 64
MAX_UPLOAD_PHOTO = 10 * 1024 * 1024  # what bots may upload: a photo, any other file
MAX_UPLOAD_FILE = 50 * 1024 * 1024
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # getFile refuses bigger files ("file is too big")

UNAUTHORIZED = "Unauthorized"
TEXT_EMPTY = "Bad Request: message text is empty"
TEXT_TOO_LONG = "Bad Request: message is too long"
CAPTION_TOO_LONG = "Bad Request: message caption is too long"
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

# Form fields that are strings in the Bot API: never JSON-decode them ("123" stays "123").
# fmt: off
_STRING_FIELDS = frozenset({
    "text", "caption", "parse_mode", "callback_query_id", "inline_query_id", "inline_message_id",
    "url", "secret_token", "ip_address", "action", "language_code", "business_connection_id",
    "message_effect_id", "emoji", "name", "title", "description", "short_description", "query",
    "next_offset", "payload", "currency", "provider_token", "start_parameter", "custom_title",
    "invite_link", "question", "address", "phone_number", "first_name", "last_name", "vcard",
    "file_id", "photo", "document", "audio", "video", "voice", "animation", "video_note",
    "sticker", "thumbnail", "cover", "error_message", "shipping_query_id", "pre_checkout_query_id",
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
    drop_pending_updates: bool = False
    allowed_updates: list[str] | None = None
    max_connections: int | None = None


@dataclass
class RateLimits:
    """Telegram's documented flood limits, as token buckets (rate per second, burst)."""

    per_chat_rate: float = 1.0
    per_chat_burst: int = 3
    global_rate: float = 30.0
    global_burst: int = 30
    group_per_minute: int = 20  # extra limit for chats with a negative id (groups/channels)
    # Edits and drafts count like messages (Telegram does not document their limits:
    # counting them is the strict assumption).
    count_edits: bool = True


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


class _TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.capacity = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def wait(self, now: float) -> float:
        """Seconds until one token is available (0 if one is available now)."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self) -> None:
        self.tokens -= 1


class MessageStore(dict[tuple[ChatId, int], JSON]):
    """Messages keyed by ``(chat_id, message_id)``.

    As a convenience ``store[message_id]`` also works when exactly one chat has that id.
    """

    def __missing__(self, key: object) -> JSON:
        if isinstance(key, int):
            found = [record for (_, mid), record in self.items() if mid == key]
            if len(found) == 1:
                return found[0]
        raise KeyError(key)


# ---------------------------------------------------------------------------------------------
# Entity parsing (parse_mode) — enough of Telegram's rules to reject what Telegram rejects
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


@dataclass
class _Open:
    name: str
    type: str | None
    start: int  # UTF-16 offset in the output
    at: int  # index in the source
    extra: dict[str, Any] = field(default_factory=dict)


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.parts: list[str] = []
        self.offset = 0
        self.entities: list[JSON] = []

    def emit(self, text: str) -> None:
        self.parts.append(text)
        self.offset += utf16_len(text)

    def add(self, type_: str | None, start: int, end: int | None = None, **extra: Any) -> None:
        end = self.offset if end is None else end
        if type_ is not None and end > start:
            self.entities.append({"type": type_, "offset": start, "length": end - start, **extra})

    def byte(self, index: int) -> int:
        return len(self.source[:index].encode())

    def result(self) -> tuple[str, list[JSON]]:
        return "".join(self.parts), sorted(self.entities, key=lambda e: (e["offset"], -e["length"]))


_HTML_TAGS: dict[str, str | None] = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_HTML_CHAR_REF = re.compile(r"&(?:(lt|gt|amp|quot)|#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6}));")
_HTML_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_HTML_TAG_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9-]*")
_HTML_END_TAG = re.compile(r"</([a-zA-Z0-9-]*)\s*>")
_HTML_ATTR = re.compile(
    r"\s+([a-zA-Z_][a-zA-Z0-9_-]*)(?:\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'>]+)))?"
)
_HTML_PLAIN_RUN = re.compile(r"[^<&]+")


def _html_char(match: re.Match[str]) -> str:
    named, dec, hexa = match.groups()
    if named:
        return _HTML_NAMED[named]
    return chr(int(dec) if dec else int(hexa, 16))


def _html_unescape(value: str) -> str:
    return _HTML_CHAR_REF.sub(_html_char, value)


def parse_html(text: str) -> tuple[str, list[JSON]]:
    """Telegram's HTML parse mode: returns (plain text, entities) or raises EntityParseError."""
    out = _Builder(text)
    stack: list[_Open] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "&":
            ref = _HTML_CHAR_REF.match(text, i)
            out.emit(_html_char(ref) if ref else "&")
            i = ref.end() if ref else i + 1
            continue
        if ch != "<":
            run = _HTML_PLAIN_RUN.match(text, i)
            assert run is not None
            out.emit(run.group(0))
            i = run.end()
            continue
        if text.startswith("</", i):
            end = _HTML_END_TAG.match(text, i)
            if end is None:
                raise EntityParseError(f"Can't find end of end tag at byte offset {out.byte(i)}")
            name = end.group(1).lower()
            if not stack:
                raise EntityParseError(f"Unexpected end tag at byte offset {out.byte(i)}")
            top = stack.pop()
            if top.name != name:
                raise EntityParseError(
                    f'Unmatched end tag at byte offset {out.byte(i)}, expected "</{top.name}>", '
                    f'found "</{name}>"'
                )
            out.add(top.type, top.start, **top.extra)
            i = end.end()
            continue
        tag = _HTML_TAG_NAME.match(text, i + 1)
        name = tag.group(0).lower() if tag else ""
        if tag is None or name not in _HTML_TAGS:
            raise EntityParseError(f'Unsupported start tag "{name}" at byte offset {out.byte(i)}')
        j = tag.end()
        attrs: dict[str, str] = {}
        while (attr := _HTML_ATTR.match(text, j)) is not None:
            value = next((g for g in attr.groups()[1:] if g is not None), "")
            attrs[attr.group(1).lower()] = _html_unescape(value)
            j = attr.end()
        while j < n and text[j].isspace():
            j += 1
        if j >= n or text[j] != ">":
            raise EntityParseError(f"Unclosed start tag at byte offset {out.byte(i)}")
        type_: str | None = _HTML_TAGS[name]
        extra: dict[str, Any] = {}
        if name == "a":
            href = attrs.get("href", "")
            type_ = "text_link" if href else None
            if href:
                extra["url"] = href
        elif name == "span" and attrs.get("class") != "tg-spoiler":
            raise EntityParseError(
                f'Tag "span" must have class "tg-spoiler" at byte offset {out.byte(i)}'
            )
        elif name == "tg-emoji":
            if "emoji-id" not in attrs:
                raise EntityParseError(
                    f'Tag "tg-emoji" must have attribute "emoji-id" at byte offset {out.byte(i)}'
                )
            extra["custom_emoji_id"] = attrs["emoji-id"]
        elif name == "code" and stack and stack[-1].name == "pre":
            language = attrs.get("class", "")
            if language.startswith("language-"):
                stack[-1].extra["language"] = language.removeprefix("language-")
                type_ = None
        elif name == "blockquote" and "expandable" in attrs:
            type_ = "expandable_blockquote"
        stack.append(_Open(name, type_, out.offset, i, extra))
        i = j + 1
    if stack:
        raise EntityParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1].name}"')
    return out.result()


_MDV2_RESERVED = frozenset("_*[]()~`>#+-=|{}.!")
_MDV2_TOGGLES = (
    ("||", "spoiler"),
    ("__", "underline"),
    ("*", "bold"),
    ("_", "italic"),
    ("~", "strikethrough"),
)
_MD_NAMES = {
    "bold": "Bold",
    "italic": "Italic",
    "underline": "Underline",
    "strikethrough": "Strikethrough",
    "spoiler": "Spoiler",
    "text_link": "TextUrl",
    "custom_emoji": "CustomEmoji",
}


def _scan_until(text: str, start: int, closer: str) -> tuple[str, int] | None:
    """Read an escaped span up to ``closer``: (unescaped content, index of closer)."""
    parts: list[str] = []
    j, n = start, len(text)
    while j < n:
        if text[j] == "\\" and j + 1 < n and 1 <= ord(text[j + 1]) <= 126:
            parts.append(text[j + 1])
            j += 2
        elif text.startswith(closer, j):
            return "".join(parts), j
        else:
            parts.append(text[j])
            j += 1
    return None


def _split_language(content: str) -> tuple[str, str]:
    if "\n" in content:
        first, rest = content.split("\n", 1)
        if first and not any(c.isspace() for c in first):
            return first, rest
    return "", content


def parse_markdown_v2(text: str) -> tuple[str, list[JSON]]:
    """Telegram's MarkdownV2: returns (plain text, entities) or raises EntityParseError."""
    out = _Builder(text)
    stack: list[_Open] = []
    quote_start: int | None = None
    line_end = 0
    line_start = True
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if line_start:
            line_start = False
            if ch == ">":
                if quote_start is None:
                    quote_start = out.offset
                i += 1
                continue
            if quote_start is not None:
                out.add("blockquote", quote_start, line_end)
                quote_start = None
        if ch == "\n":
            line_end = out.offset
            out.emit("\n")
            line_start = True
            i += 1
            continue
        if ch == "\\":
            if i + 1 < n and 1 <= ord(text[i + 1]) <= 126:
                out.emit(text[i + 1])
                i += 2
            else:
                out.emit("\\")
                i += 1
            continue
        if ch == "`":
            fence = "```" if text.startswith("```", i) else "`"
            scanned = _scan_until(text, i + len(fence), fence)
            if scanned is None:
                kind = "Pre" if fence == "```" else "Code"
                raise EntityParseError(
                    f"Can't find end of {kind} entity at byte offset {out.byte(i)}"
                )
            content, close = scanned
            start = out.offset
            if fence == "```":
                language, content = _split_language(content)
                out.emit(content)
                out.add("pre", start, **({"language": language} if language else {}))
            else:
                out.emit(content)
                out.add("code", start)
            i = close + len(fence)
            continue
        toggle = next(((m, t) for m, t in _MDV2_TOGGLES if text.startswith(m, i)), None)
        if toggle is not None:
            marker, type_ = toggle
            if any(o.type == type_ for o in stack):
                top = stack[-1]
                if top.type != type_:
                    raise EntityParseError(
                        f"Can't find end of {_MD_NAMES.get(top.type or '', top.name)} entity "
                        f"at byte offset {out.byte(top.at)}"
                    )
                stack.pop()
                out.add(type_, top.start)
            else:
                stack.append(_Open(marker, type_, out.offset, i))
            i += len(marker)
            continue
        if ch == "[" or text.startswith("![", i):
            type_ = "text_link" if ch == "[" else "custom_emoji"
            stack.append(_Open("[", type_, out.offset, i))
            i += 1 if ch == "[" else 2
            continue
        if ch == "]" and stack and stack[-1].name == "[":
            top = stack.pop()
            if text.startswith("(", i + 1):
                scanned = _scan_until(text, i + 2, ")")
                if scanned is None:
                    raise EntityParseError(f"Can't find end of a URL at byte offset {out.byte(i)}")
                url, close = scanned
                if top.type == "custom_emoji":
                    out.add("custom_emoji", top.start, custom_emoji_id=url.rpartition("=")[2])
                else:
                    out.add("text_link", top.start, url=url)
                i = close + 1
            else:
                i += 1
            continue
        if ch in _MDV2_RESERVED:
            raise EntityParseError(
                f"Character '{ch}' is reserved and must be escaped with the preceding '\\'"
            )
        out.emit(ch)
        i += 1
    if stack:
        first = stack[0]
        raise EntityParseError(
            f"Can't find end of {_MD_NAMES.get(first.type or '', first.name)} entity "
            f"at byte offset {out.byte(first.at)}"
        )
    if quote_start is not None:
        out.add("blockquote", quote_start)
    return out.result()


def parse_markdown(text: str) -> tuple[str, list[JSON]]:
    """Legacy Markdown: *bold*, _italic_, `code`, ```pre```, [text](url); no nesting."""
    out = _Builder(text)
    i, n = 0, len(text)

    def unclosed(at: int) -> EntityParseError:
        return EntityParseError(
            f"Can't find end of the entity starting at byte offset {out.byte(at)}"
        )

    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "_*`[":
            out.emit(text[i + 1])
            i += 2
        elif ch in "*_":
            close = text.find(ch, i + 1)
            if close < 0:
                raise unclosed(i)
            start = out.offset
            out.emit(text[i + 1 : close])
            out.add("bold" if ch == "*" else "italic", start)
            i = close + 1
        elif ch == "`":
            fence = "```" if text.startswith("```", i) else "`"
            close = text.find(fence, i + len(fence))
            if close < 0:
                raise unclosed(i)
            content = text[i + len(fence) : close]
            start = out.offset
            if fence == "```":
                language, content = _split_language(content)
                out.emit(content)
                out.add("pre", start, **({"language": language} if language else {}))
            else:
                out.emit(content)
                out.add("code", start)
            i = close + len(fence)
        elif ch == "[":
            close = text.find("]", i + 1)
            if close < 0:
                raise unclosed(i)
            if text.startswith("(", close + 1):
                end = text.find(")", close + 2)
                if end < 0:
                    raise unclosed(i)
                start = out.offset
                out.emit(text[i + 1 : close])
                out.add("text_link", start, url=text[close + 2 : end])
                i = end + 1
            else:
                out.emit(text[i : close + 1])
                i = close + 1
        else:
            out.emit(ch)
            i += 1
    return out.result()


_PARSERS: dict[str, Callable[[str], tuple[str, list[JSON]]]] = {
    "html": parse_html,
    "markdownv2": parse_markdown_v2,
    "markdown": parse_markdown,
}


def render_text(
    text: str, parse_mode: str | None, entities: list[JSON] | None = None
) -> tuple[str, list[JSON]]:
    """What Telegram stores for a text: explicit entities win over parse_mode."""
    if entities:
        try:
            check_entities(text, entities)
        except EntityParseError as exc:
            raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
        return text, list(entities)
    if not parse_mode:
        return text, []
    parser = _PARSERS.get(parse_mode.lower())
    if parser is None:
        raise ApiError(400, f"Bad Request: unsupported parse_mode {parse_mode!r}")
    try:
        return parser(text)
    except EntityParseError as exc:
        raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None


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
    "sendAudio": (
        "audio",
        lambda fid: {"file_id": fid, "file_unique_id": f"u{fid}", "duration": 1},
    ),
    "sendVoice": (
        "voice",
        lambda fid: {"file_id": fid, "file_unique_id": f"u{fid}", "duration": 1},
    ),
    "sendVideo": (
        "video",
        lambda fid: {
            "file_id": fid,
            "file_unique_id": f"u{fid}",
            "width": 90,
            "height": 90,
            "duration": 1,
        },
    ),
    "sendAnimation": (
        "animation",
        lambda fid: {
            "file_id": fid,
            "file_unique_id": f"u{fid}",
            "width": 90,
            "height": 90,
            "duration": 1,
        },
    ),
    "sendSticker": (
        "sticker",
        lambda fid: {
            "file_id": fid,
            "file_unique_id": f"u{fid}",
            "type": "regular",
            "width": 512,
            "height": 512,
            "is_animated": False,
            "is_video": False,
        },
    ),
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
        bot_id: int = BOT_ID,
        username: str = BOT_USERNAME,
        first_name: str = BOT_FIRST_NAME,
        first_update_id: int = 1,
        enforce_limits: bool = False,
        limits: RateLimits | None = None,
        max_poll_timeout: float | None = None,
    ) -> None:
        self.token = token
        self.bot_user: JSON = {
            "id": bot_id,
            "is_bot": True,
            "first_name": first_name,
            "username": username,
        }
        self.enforce_limits = enforce_limits
        self.limits = limits or RateLimits()
        self.max_poll_timeout = max_poll_timeout

        # What the bot did.
        self.calls: list[Call] = []
        self.offsets: list[int | None] = []  # offset of every getUpdates (None when absent)
        self.messages_by_id = MessageStore()  # current state (after edits/deletes)
        self.callback_answers: dict[str, JSON] = {}
        self.commands: dict[tuple[str, str], list[JSON]] = {}  # (scope json, lang) -> cmds
        self.webhook: Webhook | None = None
        self.allowed_updates: list[str] | None = None
        self.rate_limited = 0
        self.deleted_messages: list[tuple[ChatId, int]] = []
        self.inline_edits: list[JSON] = []  # params of edits by inline_message_id
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
        self.webhook_deliveries: list[tuple[str, JSON, int]] = []
        self.chats: dict[ChatId, JSON] = {}
        self.blocked_chats: set[ChatId] = set()

        self._sent: list[JSON] = []
        self._pending: list[JSON] = []
        self._next_update_id = first_update_id
        self._next_message_ids: dict[ChatId, int] = {}
        self._next_callback = 1
        self._open_callbacks: set[str] = set()
        self._faults: dict[str, list[_Fault]] = {}
        self._delays: dict[str, list[float]] = {}
        self._results: dict[str, Any] = {}
        self._poll_generation = 0
        self._closing = False
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._global_bucket: _TokenBucket | None = None
        self._chat_buckets: dict[ChatId, _TokenBucket] = {}
        self._group_buckets: dict[ChatId, _TokenBucket] = {}

        self._handlers: dict[str, Callable[[JSON], Awaitable[Any]]] = {
            "getMe": self._get_me,
            "getUpdates": self._get_updates,
            "setWebhook": self._set_webhook,
            "deleteWebhook": self._delete_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "setMyCommands": self._set_my_commands,
            "getMyCommands": self._get_my_commands,
            "deleteMyCommands": self._delete_my_commands,
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

    def make_bot(self, token: str | None = None, **kwargs: Any) -> Bot:
        """A real aiogram Bot pointed at this server (use ``async with`` to close it)."""
        return Bot(token or self.token, session=AiohttpSession(api=self.server), **kwargs)

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

        try:
            async with asyncio.timeout(timeout):
                while len(found := matching()) < count:
                    await self._changed.wait()
        except TimeoutError:
            seen = ", ".join(call.method for call in self.calls[after:]) or "none"
            raise AssertionError(
                f"expected {count} {method} call(s) within {timeout}s, "
                f"got {len(matching())}; calls seen: {seen}"
            ) from None
        return found[:count]

    def sent_messages(self, chat_id: ChatId | None = None) -> list[JSON]:
        """Messages the bot sent, as they were when sent (see ``messages_by_id`` for edits).

        Keys: method, message_id, chat_id, date, text (raw, as the bot sent it), caption,
        plain_text (after parse_mode), entities, parse_mode, reply_markup,
        reply_to_message_id, message_thread_id.
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
        reply_to_message: int | JSON | None = None,
        entities: list[JSON] | None = None,
        chat_title: str | None = None,
        content: JSON | None = None,
    ) -> int:
        """A user writes ``text``. ``reply_to_message`` is a stored message id or a raw dict.

        Group/supergroup chats default to ``chat_id = -(10**12 + user_id)``; a ``channel``
        chat produces a ``channel_post`` (no ``from``). Commands get a bot_command entity.
        Returns the update_id (the message is ``api.pushed_updates[-1]``). ``content``
        replaces the text: e.g. ``{"photo": api.photo(data), "caption": "…"}``.
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
            chat["title"] = chat_title or self.chats.get(chat_id, {}).get("title", "Test chat")
            if chat_type == "supergroup" and message_thread_id is not None:
                chat["is_forum"] = True
        self.chats[chat_id] = chat
        message: JSON = {
            "message_id": self._take_message_id(chat_id),
            "date": int(time.time()),
            "chat": dict(chat),
            **(content if content is not None else {"text": text}),
        }
        if chat_type == "channel":
            message["sender_chat"] = dict(chat)
        else:
            message["from"] = user
        if message_thread_id is not None:
            message["message_thread_id"] = message_thread_id
            if chat.get("is_forum"):
                message["is_topic_message"] = True
        if isinstance(reply_to_message, int):
            target = self.message(chat_id, reply_to_message)
            if target is None:
                raise ValueError(f"no stored message {reply_to_message} in chat {chat_id}")
            message["reply_to_message"] = self._message_object(target, with_reply=False)
        elif reply_to_message is not None:
            message["reply_to_message"] = reply_to_message
        if entities is None and content is None and text.startswith("/"):
            command = text.split(maxsplit=1)[0] if text.strip() else text
            entities = [{"type": "bot_command", "offset": 0, "length": utf16_len(command)}]
        if entities:
            message["entities"] = entities
        kind = "channel_post" if chat_type == "channel" else "message"
        return self.push_update({kind: message})

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
        plain, entities = render_text(text, params.get("parse_mode"), params.get("entities"))
        if utf16_len(plain) > MAX_TEXT_LENGTH:
            raise ApiError(400, TEXT_TOO_LONG)
        self._check_blocked(chat_id)
        if self.limits.count_edits:
            self._check_rate(chat_id)
        self.drafts.append(
            {"chat_id": chat_id, "draft_id": draft_id, "plain_text": plain, "entities": entities,
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
        callback_id: str | None = None,
        username: str | None = None,
        first_name: str = "User",
    ) -> tuple[int, str]:
        """A user presses an inline button carrying ``data`` on a stored bot message.

        ``message_id=None`` sends a callback without a message. Returns (update_id,
        callback_id); the id stays answerable once via answerCallbackQuery.
        """
        if chat_id is None:
            chat_id = user_id
        if callback_id is None:
            callback_id = str(4_000_000_000 + self._next_callback)
            self._next_callback += 1
        user: JSON = {"id": user_id, "is_bot": False, "first_name": first_name}
        if username:
            user["username"] = username
        query: JSON = {
            "id": callback_id,
            "from": user,
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

    def set_result(self, method: str, result: Any) -> None:
        """What an otherwise unhandled method answers (default ``True``)."""
        self._results[method] = result

    async def deliver_webhook(
        self,
        url: str | None,
        update: JSON | int,
        secret_token: str | None = REGISTERED,
        *,
        timeout: float = 10.0,
    ) -> int:
        """POST an update to the bot's webhook like Telegram does; returns the HTTP status.

        ``url=None`` uses the URL from setWebhook. ``update`` is a raw update dict (an
        update_id is assigned if missing) or the update_id of a pending pushed update, which
        is then removed from the queue on a 2xx answer. ``secret_token`` defaults to the one
        given to setWebhook; ``None`` sends no X-Telegram-Bot-Api-Secret-Token header. A
        method in the answer body (aiogram's webhook reply) is executed as a bot call.
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
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp,
        ):
            status = resp.status
            reply = await self._read_webhook_reply(resp)
        self.webhook_deliveries.append((url, body, status))
        if 200 <= status < 300 and isinstance(update, int):
            self._pending = [u for u in self._pending if u["update_id"] != update]
        if reply is not None:
            method, params = reply
            await self._process(method, params, self.token)
        return status

    async def flush_webhook(self) -> list[int]:
        """Deliver every pending update to the registered webhook, stopping at a failure."""
        statuses: list[int] = []
        for update_id in [u["update_id"] for u in self._pending]:
            status = await self.deliver_webhook(None, update_id)
            statuses.append(status)
            if not 200 <= status < 300:
                break
        return statuses

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
            if handler is None:
                result = copy.deepcopy(self._results.get(call.method, True))
            else:
                result = await handler(call.params)
        except ApiError as exc:
            return exc.status, exc.payload()
        return 200, {"ok": True, "result": result}

    async def _process(self, method: str, params: JSON, token: str) -> Call:
        """Run a call that did not come over HTTP (a webhook reply)."""
        method = self._canonical.get(method.lower(), method)
        call = Call(method=method, params=params, at=time.monotonic(), token=token)
        self.calls.append(call)
        self._pulse()
        call.status, call.response = await self._answer(call)
        self._pulse()
        return call

    @staticmethod
    async def _read_params(request: web.Request) -> JSON:
        params: JSON = {key: _decode_field(key, value) for key, value in request.query.items()}
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

    @staticmethod
    async def _read_webhook_reply(resp: aiohttp.ClientResponse) -> tuple[str, JSON] | None:
        if resp.content_type == "application/json":
            data = await resp.json()
            if isinstance(data, dict) and "method" in data:
                params = {k: v for k, v in data.items() if k != "method"}
                return str(data["method"]), params
            return None
        if resp.content_type.startswith("multipart/"):
            reader = aiohttp.MultipartReader.from_response(resp)
            fields: JSON = {}
            while (part := await reader.next()) is not None:
                if isinstance(part, aiohttp.BodyPartReader) and part.name:
                    fields[part.name] = await part.text()
            if "method" in fields:
                method = str(fields.pop("method"))
                return method, {k: _decode_field(k, v) for k, v in fields.items()}
            return None
        await resp.read()
        return None

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
            "parse_mode": None,
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
        if isinstance(raw, str) and raw.startswith("@"):
            for chat_id, chat in self.chats.items():
                if chat.get("username", "").lower() == raw[1:].lower():
                    return chat_id
            raise ApiError(400, CHAT_NOT_FOUND)
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        try:
            return _as_int(raw, "chat_id")
        except ApiError:
            raise ApiError(400, CHAT_NOT_FOUND) from None

    def _message_object(self, record: JSON, *, with_reply: bool = True) -> JSON:
        """The Message JSON Telegram would return for a stored record."""
        if not record["from_bot"]:
            obj = copy.deepcopy(record["raw"])
            if not with_reply:
                obj.pop("reply_to_message", None)
            return obj
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
            self._global_bucket = _TokenBucket(limits.global_rate, limits.global_burst)
        buckets = [self._global_bucket]
        buckets.append(
            self._chat_buckets.setdefault(
                chat_id, _TokenBucket(limits.per_chat_rate, limits.per_chat_burst)
            )
        )
        if isinstance(chat_id, int) and chat_id < 0:
            buckets.append(
                self._group_buckets.setdefault(
                    chat_id,
                    _TokenBucket(limits.group_per_minute / 60, limits.group_per_minute),
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
            "parse_mode": params.get("parse_mode") or None,
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
        if self.max_poll_timeout is not None:
            wait = min(wait, self.max_poll_timeout)
        if "allowed_updates" in params:
            allowed = params["allowed_updates"]
            self.allowed_updates = list(allowed) if isinstance(allowed, list) else None
        if offset is not None and offset > 0:
            self._pending = [u for u in self._pending if u["update_id"] >= offset]
        elif offset is not None and offset < 0:
            self._pending = self._pending[offset:]
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
        drop = _as_bool(params.get("drop_pending_updates", False))
        if drop:
            self._pending.clear()
        allowed = params.get("allowed_updates")
        if isinstance(allowed, list):
            self.allowed_updates = allowed
        if not url:
            self.webhook = None
            return True
        max_connections = params.get("max_connections")
        self.webhook = Webhook(
            url=str(url),
            secret_token=None if secret is None else str(secret),
            drop_pending_updates=drop,
            allowed_updates=allowed if isinstance(allowed, list) else None,
            max_connections=None if max_connections is None else int(max_connections),
        )
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
        if self.webhook is not None:
            if self.webhook.max_connections is not None:
                info["max_connections"] = self.webhook.max_connections
            if self.webhook.allowed_updates is not None:
                info["allowed_updates"] = self.webhook.allowed_updates
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

    async def _delete_my_commands(self, params: JSON) -> bool:
        key = (self._scope_key(params.get("scope")), str(params.get("language_code") or ""))
        self.commands.pop(key, None)
        return True

    async def _send_message(self, params: JSON) -> JSON:
        chat_id = self._resolve_chat(params)
        text = params.get("text")
        if text is None or text == "":
            raise ApiError(400, TEXT_EMPTY)
        plain, entities = render_text(str(text), params.get("parse_mode"), params.get("entities"))
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
            caption = str(params.get("caption") or "")
            plain, entities = render_text(
                caption, params.get("parse_mode"), params.get("caption_entities")
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

    async def _edit_message_text(self, params: JSON) -> JSON | bool:
        text = params.get("text")
        if text is None or text == "":
            raise ApiError(400, TEXT_EMPTY)
        plain, entities = render_text(str(text), params.get("parse_mode"), params.get("entities"))
        if not plain.strip():
            raise ApiError(400, TEXT_EMPTY)
        if utf16_len(plain) > MAX_TEXT_LENGTH:
            raise ApiError(400, TEXT_TOO_LONG)
        markup = self._check_markup(params.get("reply_markup"))
        if params.get("inline_message_id"):
            self.inline_edits.append(params)
            return True
        record = self._editable(params)
        if record["media"] is not None:
            raise ApiError(400, "Bad Request: there is no text in the message to edit")
        if self.limits.count_edits:
            self._check_rate(record["chat_id"])
        if (
            record["plain_text"] == plain
            and record["entities"] == entities
            and _inline_markup(record["reply_markup"]) == _inline_markup(markup)
        ):
            raise ApiError(400, NOT_MODIFIED)
        # Like Telegram: an edit without reply_markup removes the inline keyboard.
        record.update(
            text=str(text),
            plain_text=plain,
            entities=entities,
            parse_mode=params.get("parse_mode") or None,
            reply_markup=markup,
            edit_date=int(time.time()),
        )
        return self._message_object(record)

    async def _edit_message_reply_markup(self, params: JSON) -> JSON | bool:
        markup = self._check_markup(params.get("reply_markup"))
        if params.get("inline_message_id"):
            self.inline_edits.append(params)
            return True
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
        self.deleted_messages.append((chat_id, message_id))
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
