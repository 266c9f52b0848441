"""A fake Slack for tests: the Web API, Socket Mode, the Events API over HTTP, and files.

The real ``slack_sdk`` clients talk to it unmodified on 127.0.0.1::

    async with FakeSlack() as slack:
        web = AsyncWebClient(token=slack.bot_token, base_url=slack.base_url)
        socket = SocketModeClient(
            app_token=slack.app_token, web_client=AsyncWebClient(base_url=slack.base_url)
        )
        await socket.connect()          # apps.connections.open, then the WebSocket
        await slack.wait_connected()
        envelope = await slack.push_message("hi")
        await slack.wait_acked(envelope)

Web API methods live at ``{base_url}{method}`` (``base_url`` ends in ``/api/``). The SDK
sends some methods as JSON (``chat.postMessage``, ``chat.update``) and the rest as query
parameters or ``application/x-www-form-urlencoded`` forms whose structured fields
(``blocks``, ``files``…) are JSON text; the fake merges query, form and JSON body into
``Call.params`` and decodes those JSON-text fields, so a test sees one shape whatever the
transport. Answers are Slack's: HTTP 200 with ``{"ok": true, ...}`` or ``{"ok": false,
"error": "..."}``, and HTTP 429 with ``Retry-After`` for rate limits, which the SDK turns
into ``SlackApiError``.

Socket Mode follows https://docs.slack.dev/apis/events-api/using-socket-mode/:
``apps.connections.open`` (app-level token) hands out a one-use ``ws://`` URL; on connect
the fake sends ``hello``, then envelopes (``events_api``, ``interactive``); the client
acknowledges each with ``{"envelope_id": ...}``. An ``events_api`` envelope that is not
acknowledged within ``ack_timeout`` is delivered again, as Slack does.

State is plain Python (``calls``, ``messages``, ``updates``, ``uploads``, ``acks``…).
Web API handlers are synchronous: nothing awaits between reading a request and applying
it, so a test woken by ``wait_for_call`` sees the call's effect already applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import hmac
import json
import math
import mimetypes
import random
import re
import string
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote, urlencode

from aiohttp import WSMsgType, web

from tests.fakes.limits import TokenBucket
from tests.waiting import eventually

JSON = dict[str, Any]

# fmt: off
DEFAULT_SCOPES: tuple[str, ...] = (
    "chat:write", "im:history", "app_mentions:read", "files:read", "files:write",
    "users:read", "channels:history", "groups:history", "mpim:history",
)
# fmt: on

VERIFICATION_TOKEN = "fake-verification-token"  # the deprecated "token" field of payloads
OWNER_ID = "U0OWNER"
MAX_TEXT_LENGTH = 40_000
MAX_BLOCKS = 50
SIGNATURE_VERSION = "v0"

# The scope each method needs (https://docs.slack.dev/reference/methods/...). Not enforced
# for conversations.info: Slack wants channels:read/groups:read/im:read/mpim:read there,
# which DEFAULT_SCOPES does not carry.
_METHOD_SCOPES = {
    "chat.postMessage": "chat:write",
    "chat.update": "chat:write",
    "chat.delete": "chat:write",
    "users.info": "users:read",
    "files.getUploadURLExternal": "files:write",
    "files.completeUploadExternal": "files:write",
}

# Parameters the SDK (and Slack's docs) send as JSON text inside a form or query string.
_JSON_TEXT_FIELDS = ("blocks", "attachments", "files", "metadata")

_CHANNEL_ID = re.compile(r"[CDG][A-Z0-9]+")
_USER_ID = re.compile(r"[UW][A-Z0-9]+")
_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")

# Keys of a stored message that are the fake's bookkeeping, not part of Slack's objects.
_LOCAL_KEYS = frozenset({"channel", "unfurl_links", "unfurl_media", "mrkdwn", "reply_broadcast"})


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass
class Call:
    """One Web API request the bot made, as answered (recorded once the answer is known)."""

    method: str
    params: dict[str, Any]
    ok: bool
    response: dict[str, Any]
    status: int
    token: str = ""
    at: float = 0.0


@dataclass
class Envelope:
    """One Socket Mode envelope sent to a client (a redelivery is a new Envelope)."""

    envelope_id: str
    type: str  # "events_api" | "interactive"
    payload: dict[str, Any]
    retry_attempt: int = 0
    event_id: str | None = None
    retry_reason: str = ""
    accepts_response_payload: bool = False

    def wire(self) -> JSON:
        """The envelope as it goes over the WebSocket."""
        message: JSON = {
            "envelope_id": self.envelope_id,
            "payload": self.payload,
            "type": self.type,
            "accepts_response_payload": self.accepts_response_payload,
        }
        if self.type == "events_api":
            message["retry_attempt"] = self.retry_attempt
            message["retry_reason"] = self.retry_reason
        return message


class SlackError(Exception):
    """Raised inside a handler; becomes ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, *, status: int = 200, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.extra = extra

    def body(self) -> JSON:
        return {"ok": False, "error": self.error, **self.extra}


@dataclass
class _Fault:
    error: str
    status: int
    retry_after: int | None
    remaining: int


@dataclass
class _Connection:
    number: int
    ws: web.WebSocketResponse
    request: web.Request
    ready: bool = False  # got its hello; envelopes may go here
    draining: bool = False  # told to go away (disconnect) or being dropped
    closed: bool = False


# ---------------------------------------------------------------------------------------------
# Block Kit — enough of its limits (https://docs.slack.dev/reference/block-kit/) to reject
# what Slack rejects with invalid_blocks
# ---------------------------------------------------------------------------------------------

# fmt: off
BLOCK_TYPES = frozenset({
    "section", "actions", "context", "divider", "header", "rich_text", "image", "markdown",
})
RICH_TEXT_CONTAINERS = frozenset({
    "rich_text_section", "rich_text_preformatted", "rich_text_quote", "rich_text_list",
})
RICH_TEXT_INLINE = frozenset({
    "text", "link", "emoji", "user", "channel", "usergroup", "broadcast", "date", "color",
    "team",
})
INTERACTIVE_ELEMENTS = frozenset({
    "button", "overflow", "datepicker", "timepicker", "datetimepicker", "checkboxes",
    "radio_buttons", "static_select", "external_select", "users_select",
    "conversations_select", "channels_select", "multi_static_select",
    "multi_external_select", "multi_users_select", "multi_conversations_select",
    "multi_channels_select", "workflow_button",
})
# fmt: on
BUTTON_STYLES = frozenset({"primary", "danger"})


class _BlockChecker:
    """Collects Slack-style complaints ("... [json-pointer:/blocks/0/text]")."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.action_ids: set[str] = set()
        self.block_ids: set[str] = set()

    def fail(self, pointer: str, message: str) -> None:
        self.errors.append(f"{message} [json-pointer:{pointer}]")

    def check(self, blocks: list[Any]) -> None:
        if len(blocks) > MAX_BLOCKS:
            self.fail("/blocks", f"must contain at most {MAX_BLOCKS} items")
        for index, block in enumerate(blocks):
            self.block(block, f"/blocks/{index}")

    def text(self, obj: Any, pointer: str, *, max_len: int, plain_only: bool = False) -> None:
        allowed = ("plain_text",) if plain_only else ("plain_text", "mrkdwn")
        if not isinstance(obj, dict):
            self.fail(pointer, "must be an object")
            return
        if obj.get("type") not in allowed:
            self.fail(f"{pointer}/type", f"must be one of {', '.join(allowed)}")
        for key, kind in (("verbatim", "mrkdwn"), ("emoji", "plain_text")):
            if key in obj and (obj.get("type") != kind or not isinstance(obj[key], bool)):
                self.fail(f"{pointer}/{key}", f"must be a boolean of a {kind} text")
        text = obj.get("text")
        if not isinstance(text, str) or not text:
            self.fail(f"{pointer}/text", "must be more than 0 characters")
        elif len(text) > max_len:
            self.fail(f"{pointer}/text", f"must be less than {max_len + 1} characters")

    def limit(self, value: Any, pointer: str, max_len: int) -> None:
        if value is None:
            return
        if not isinstance(value, str):
            self.fail(pointer, "must be a string")
        elif len(value) > max_len:
            self.fail(pointer, f"must be less than {max_len + 1} characters")

    def block(self, block: Any, pointer: str) -> None:
        if not isinstance(block, dict):
            self.fail(pointer, "must be an object")
            return
        kind = block.get("type")
        if kind not in BLOCK_TYPES:
            self.fail(f"{pointer}/type", f"unsupported block type {kind!r}")
            return
        block_id = block.get("block_id")
        if block_id is not None:
            self.limit(block_id, f"{pointer}/block_id", 255)
            if block_id in self.block_ids:
                self.fail(f"{pointer}/block_id", "duplicate block_id")
            self.block_ids.add(str(block_id))
        getattr(self, f"_{kind}")(block, pointer)

    def element(self, element: Any, pointer: str) -> None:
        if not isinstance(element, dict):
            self.fail(pointer, "must be an object")
            return
        kind = element.get("type")
        if kind == "image":
            self._image_element(element, pointer)
            return
        if kind not in INTERACTIVE_ELEMENTS:
            self.fail(f"{pointer}/type", f"unsupported element type {kind!r}")
            return
        action_id = element.get("action_id")
        if action_id is not None:
            self.limit(action_id, f"{pointer}/action_id", 255)
            if action_id in self.action_ids:
                self.fail(f"{pointer}/action_id", "duplicate action_id")
            self.action_ids.add(str(action_id))
        if kind == "button":
            self.text(element.get("text"), f"{pointer}/text", max_len=75, plain_only=True)
            self.limit(element.get("value"), f"{pointer}/value", 2000)
            self.limit(element.get("url"), f"{pointer}/url", 3000)
            style = element.get("style")
            if style is not None and style not in BUTTON_STYLES:
                self.fail(f"{pointer}/style", "must be one of primary, danger")

    def _image_element(self, element: JSON, pointer: str) -> None:
        if not element.get("image_url") and not element.get("slack_file"):
            self.fail(pointer, "must provide image_url or slack_file")
        self.limit(element.get("image_url"), f"{pointer}/image_url", 3000)
        alt = element.get("alt_text")
        if not isinstance(alt, str) or not alt:
            self.fail(f"{pointer}/alt_text", "must be more than 0 characters")
        else:
            self.limit(alt, f"{pointer}/alt_text", 2000)

    def _section(self, block: JSON, pointer: str) -> None:
        text, fields = block.get("text"), block.get("fields")
        if text is None and fields is None:
            self.fail(pointer, "must provide text or fields")
        if text is not None:
            self.text(text, f"{pointer}/text", max_len=3000)
        if fields is not None:
            if not isinstance(fields, list) or not 1 <= len(fields) <= 10:
                self.fail(f"{pointer}/fields", "must contain between 1 and 10 items")
            else:
                for index, item in enumerate(fields):
                    self.text(item, f"{pointer}/fields/{index}", max_len=2000)
        if block.get("accessory") is not None:
            self.element(block["accessory"], f"{pointer}/accessory")

    def _header(self, block: JSON, pointer: str) -> None:
        self.text(block.get("text"), f"{pointer}/text", max_len=150, plain_only=True)

    def _actions(self, block: JSON, pointer: str) -> None:
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
            self.fail(f"{pointer}/elements", "must contain between 1 and 25 items")
            return
        for index, element in enumerate(elements):
            self.element(element, f"{pointer}/elements/{index}")

    def _context(self, block: JSON, pointer: str) -> None:
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
            self.fail(f"{pointer}/elements", "must contain between 1 and 10 items")
            return
        for index, element in enumerate(elements):
            where = f"{pointer}/elements/{index}"
            if isinstance(element, dict) and element.get("type") == "image":
                self._image_element(element, where)
            else:
                self.text(element, where, max_len=3000)

    def _divider(self, block: JSON, pointer: str) -> None:
        return

    def _image(self, block: JSON, pointer: str) -> None:
        self._image_element(block, pointer)
        if block.get("title") is not None:
            self.text(block["title"], f"{pointer}/title", max_len=2000, plain_only=True)

    def _markdown(self, block: JSON, pointer: str) -> None:
        text = block.get("text")
        if not isinstance(text, str) or not text:
            self.fail(f"{pointer}/text", "must be more than 0 characters")
        else:
            self.limit(text, f"{pointer}/text", 12_000)

    def _rich_text(self, block: JSON, pointer: str) -> None:
        elements = block.get("elements")
        if not isinstance(elements, list):
            self.fail(f"{pointer}/elements", "must be an array")
            return
        for index, element in enumerate(elements):
            self._rich_container(element, f"{pointer}/elements/{index}")

    def _rich_container(self, element: Any, pointer: str) -> None:
        kind = element.get("type") if isinstance(element, dict) else None
        if not isinstance(element, dict) or kind not in RICH_TEXT_CONTAINERS:
            self.fail(f"{pointer}/type", f"unsupported rich text element {kind!r}")
            return
        children = element.get("elements")
        if not isinstance(children, list):
            self.fail(f"{pointer}/elements", "must be an array")
            return
        if kind == "rich_text_list":
            if element.get("style") not in ("bullet", "ordered"):
                self.fail(f"{pointer}/style", "must be one of bullet, ordered")
            for index, child in enumerate(children):
                where = f"{pointer}/elements/{index}"
                if not isinstance(child, dict) or child.get("type") != "rich_text_section":
                    self.fail(f"{where}/type", "must be rich_text_section")
                else:
                    self._rich_container(child, where)
            return
        for index, child in enumerate(children):
            self._rich_inline(child, f"{pointer}/elements/{index}")

    def _rich_inline(self, element: Any, pointer: str) -> None:
        kind = element.get("type") if isinstance(element, dict) else None
        if not isinstance(element, dict) or kind not in RICH_TEXT_INLINE:
            self.fail(f"{pointer}/type", f"unsupported rich text element {kind!r}")
            return
        required = {
            "text": "text",
            "link": "url",
            "emoji": "name",
            "user": "user_id",
            "channel": "channel_id",
            "usergroup": "usergroup_id",
            "broadcast": "range",
            "date": "timestamp",
            "color": "value",
            "team": "team_id",
        }[kind]
        if element.get(required) in (None, ""):
            self.fail(f"{pointer}/{required}", "is required")


def check_blocks(blocks: Any) -> list[JSON]:
    """The blocks Slack would store, or SlackError as Slack refuses them.

    Malformed JSON text, or JSON that is not an array, is ``invalid_blocks_format``; an
    array breaking Block Kit's rules is ``invalid_blocks`` with Slack's ``errors`` list.
    """
    if not isinstance(blocks, list):
        raise SlackError("invalid_blocks_format")
    checker = _BlockChecker()
    checker.check(blocks)
    if checker.errors:
        raise SlackError(
            "invalid_blocks",
            errors=checker.errors,
            response_metadata={"messages": [f"[ERROR] {e}" for e in checker.errors]},
        )
    return copy.deepcopy(blocks)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _as_bool(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true"}
    return bool(value)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _rich_text_blocks(text: str) -> list[JSON]:
    """The rich_text block Slack attaches to a message a person typed."""
    elements: list[JSON] = []
    position = 0
    for match in _MENTION.finditer(text):
        if match.start() > position:
            elements.append({"type": "text", "text": text[position : match.start()]})
        elements.append({"type": "user", "user_id": match.group(1)})
        position = match.end()
    if position < len(text):
        elements.append({"type": "text", "text": text[position:]})
    block_id = "".join(random.choices(string.ascii_letters + string.digits, k=5))
    return [
        {
            "type": "rich_text",
            "block_id": block_id,
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


def _find_button(blocks: list[JSON], action_id: str) -> tuple[str, JSON] | None:
    """(block_id, element) of the interactive element with that action_id."""
    for block in blocks:
        candidates = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            candidates.append(block["accessory"])
        for element in candidates:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                return str(block.get("block_id") or ""), element
    return None


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


class FakeSlack:
    """A Slack peer for the real slack_sdk clients. See the module docstring."""

    TEAM_ID = "T0TEAM"
    TEAM_NAME = "Fake Team"
    TEAM_DOMAIN = "fake-team"
    BOT_USER_ID = "U0BOT"
    BOT_ID = "B0BOT"
    APP_ID = "A0APP"
    BOT_NAME = "echo"

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-test-token",
        app_token: str = "xapp-test-token",
        signing_secret: str = "test-signing-secret",
        scopes: tuple[str, ...] = DEFAULT_SCOPES,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.scopes = tuple(scopes)

        # -- Web API: what the bot did --
        self.calls: list[Call] = []
        # channel -> the bot's messages, in order; the same dicts as in ``history``, so
        # chat.update edits them in place and chat.delete removes them.
        self.messages: dict[str, list[JSON]] = {}
        # channel -> every message the fake knows (people's pushed ones and the bot's).
        self.history: dict[str, list[JSON]] = {}
        self.updates: list[JSON] = []  # {"channel", "ts", "text", "blocks"} per chat.update
        self.deletions: list[JSON] = []  # {"channel", "ts"} per chat.delete
        self.rate_limited = 0
        self.unknown_channels: set[str] = set()  # well-formed ids that answer not found
        self.users: dict[str, JSON] = {
            OWNER_ID: self._user_object(OWNER_ID, "owner", "Owner Person"),
            self.BOT_USER_ID: {
                **self._user_object(self.BOT_USER_ID, self.BOT_NAME, "Echo"),
                "is_bot": True,
                "is_app_user": False,
            },
        }

        # -- files --
        self.files: dict[str, JSON] = {}  # file id -> Slack file object
        self.uploads: list[JSON] = []  # files the bot uploaded and completed
        self.downloads: list[JSON] = []  # {"file_id", "path", "authorized"} per GET
        self.action_responses: list[JSON] = []  # {"url", "body"} POSTed to a response_url

        # -- Socket Mode --
        self.connections = 0
        self.ack_timeout = 3.0
        self.max_retries = 3
        self.disconnect_grace = 1.0  # how long a disconnected socket may stay open
        self.delivery_timeout = 10.0  # how long a push waits for a connection
        self.echo_bot_messages = False  # True: the bot's posts come back as message events
        self.envelopes: list[Envelope] = []  # every envelope sent, in order
        self.acks: dict[str, JSON] = {}  # envelope_id -> the first ack the client sent
        self.socket_messages: list[JSON] = []  # everything clients sent over WebSockets

        self._faults: dict[str, list[_Fault]] = {}
        self._limits: dict[str, tuple[float, int]] = {}
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._ts = 0
        self._ids = 0
        self._event_ids: set[str] = set()
        self._dms: dict[str, str] = {OWNER_ID: "D0OWNER"}
        self._file_content: dict[str, bytes] = {}
        self._pending_uploads: dict[str, JSON] = {}
        self._response_urls: dict[str, tuple[str, str]] = {}  # secret -> (channel, ts)
        self._tickets: set[str] = set()
        self._conns: list[_Connection] = []
        self._deliveries: dict[str, list[Envelope]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._closing = False

        self._handlers: dict[str, Callable[[JSON], JSON]] = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._connections_open,
            "chat.postMessage": self._post_message,
            "chat.update": self._update_message,
            "chat.delete": self._delete_message,
            "conversations.info": self._conversations_info,
            "users.info": self._users_info,
            "files.getUploadURLExternal": self._get_upload_url,
            "files.completeUploadExternal": self._complete_upload,
        }

        self._runner: web.AppRunner | None = None
        self.origin = ""  # "http://127.0.0.1:PORT"
        self.base_url = ""  # "http://127.0.0.1:PORT/api/"
        # Where apps.connections.open sends the WebSocket ("127.0.0.1:PORT", a proxy in
        # front of the fake); None: the fake's own address.
        self.socket_origin: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link/", self._link)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files-pri/{team_file}/{tail:.+}", self._download)
        app.router.add_get("/signin", self._signin)
        app.router.add_post("/actions/{secret}", self._response_url)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.origin = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.origin}/api/"

    async def stop(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self._conns):
            conn.draining = True
            with contextlib.suppress(Exception):
                await conn.ws.close(code=1001, message=b"server shutting down")
        self._pulse()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- inspection -----------------------------------------------------------------------------

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    async def wait_for_call(
        self,
        method: str,
        predicate: Callable[[Call], bool] | None = None,
        timeout: float = 10.0,
        *,
        after: int = 0,
    ) -> Call:
        """The first call of ``method`` among ``calls[after:]`` matching ``predicate``.

        Returns an existing call at once, else waits for one. Pass ``after=len(slack.calls)``
        to accept only calls made from now on.
        """

        def found() -> Call | None:
            return next(
                (
                    call
                    for call in self.calls[after:]
                    if call.method == method and (predicate is None or predicate(call))
                ),
                None,
            )

        def seen() -> str:
            names = ", ".join(call.method for call in self.calls[after:]) or "none"
            return f"no matching {method} call; calls seen: {names}"

        call = await eventually(found, timeout, seen, woken_by=self._wake)
        assert call is not None  # eventually returns only a truthy answer
        return call

    def message(self, channel: str, ts: str) -> JSON | None:
        """The stored message (the bot's or a pushed one) at ``ts`` in ``channel``, or None."""
        return next((m for m in self.history.get(channel, []) if m["ts"] == ts), None)

    def dm_channel(self, user: str) -> str:
        """The id of the bot's DM with ``user`` (what chat.postMessage to a user id uses)."""
        return self._dms.setdefault(user, "D" + user[1:])

    # -- faults and limits ----------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        *,
        error: str = "internal_error",
        status: int = 200,
        retry_after: int | None = None,
        count: int = 1,
    ) -> None:
        """The next ``count`` authenticated calls of ``method`` fail without effect.

        ``status=429`` answers as Slack's rate limiter does (HTTP 429, ``Retry-After``,
        ``"ratelimited"``); anything else answers ``{"ok": false, "error": error}`` with
        that HTTP status (Slack's own errors come with 200).
        """
        self._faults.setdefault(method, []).append(
            _Fault(error=error, status=status, retry_after=retry_after, remaining=count)
        )

    def rate_limit(self, method: str, per_second: float, burst: int) -> None:
        """A token bucket per (method, channel), like Slack's per-channel posting limit
        (about one message per second, with short bursts). Past it: HTTP 429."""
        self._limits[method] = (per_second, burst)
        for key in [key for key in self._buckets if key[0] == method]:
            del self._buckets[key]

    # -- Socket Mode ----------------------------------------------------------------------------

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Until a client has an open connection that got its hello (and is not going)."""
        await eventually(
            self._ready_connection, timeout, "a Socket Mode connection", woken_by=self._wake
        )

    async def push_event(self, event: JSON, *, event_id: str | None = None) -> Envelope:
        """Send an ``events_api`` envelope carrying ``event`` in an event_callback payload.

        Waits (up to ``delivery_timeout``) for a connected client, as Slack holds events
        while an app reconnects.
        """
        payload = self._event_callback(event, event_id)
        envelope = Envelope(
            envelope_id=str(uuid.uuid4()),
            type="events_api",
            payload=payload,
            event_id=payload["event_id"],
        )
        await self._deliver(envelope)
        return envelope

    async def push_message(
        self,
        text: str,
        *,
        user: str = OWNER_ID,
        channel: str = "D0OWNER",
        channel_type: str = "im",
        thread_ts: str | None = None,
        files: list[JSON] | None = None,
        subtype: str | None = None,
    ) -> Envelope:
        """A person writes ``text``: a ``message`` event (``message.im`` by default).

        With ``files`` (from ``add_file``) it is a ``file_share`` message. The message is
        stored, so ``message(channel, ts)`` finds it and chat.update on it is refused.
        """
        ts = self._next_ts()
        event: JSON = {
            "type": "message",
            "channel": channel,
            "user": user,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "channel_type": channel_type,
            "team": self.TEAM_ID,
        }
        if files:
            event.update(
                subtype="file_share",
                files=copy.deepcopy(files),
                upload=False,
                display_as_bot=False,
            )
        else:
            event["client_msg_id"] = str(uuid.uuid4())
        if subtype is not None:
            event["subtype"] = subtype
        if text:
            event["blocks"] = _rich_text_blocks(text)
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
            parent = self.message(channel, thread_ts)
            if parent is not None:
                event["parent_user_id"] = parent["user"]
        self._store_person_message(event)
        return await self.push_event(event)

    async def push_mention(
        self,
        text: str,
        *,
        user: str = OWNER_ID,
        channel: str = "C0GENERAL",
        thread_ts: str | None = None,
    ) -> Envelope:
        """A person mentions the bot in a channel: an ``app_mention`` event."""
        mention = f"<@{self.BOT_USER_ID}>"
        if mention not in text:
            text = f"{mention} {text}"
        ts = self._next_ts()
        event: JSON = {
            "type": "app_mention",
            "user": user,
            "text": text,
            "ts": ts,
            "client_msg_id": str(uuid.uuid4()),
            "team": self.TEAM_ID,
            "blocks": _rich_text_blocks(text),
            "channel": channel,
            "event_ts": ts,
        }
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        self._store_person_message(event)
        return await self.push_event(event)

    async def push_action(
        self,
        *,
        channel: str,
        message_ts: str,
        action_id: str,
        value: str | None = None,
        user: str = OWNER_ID,
    ) -> Envelope:
        """A person presses a button: an ``interactive`` envelope with block_actions.

        The button's block_id, label and value come from the stored message when it has an
        element with ``action_id``; ``value`` overrides the stored value.
        """
        envelope = Envelope(
            envelope_id=str(uuid.uuid4()),
            type="interactive",
            payload=self._block_actions(channel, message_ts, action_id, value, user),
        )
        await self._deliver(envelope)
        return envelope

    def acked(self, envelope: Envelope) -> bool:
        return envelope.envelope_id in self.acks

    async def wait_acked(
        self, envelope: Envelope, timeout: float = 10.0, *, any_delivery: bool = False
    ) -> JSON:
        """The ack message (``{"envelope_id": ..., "payload"?: ...}``) the client sent;
        ``any_delivery``: for this envelope or any redelivery of its event (the first
        may have gone down with a connection)."""

        def ack() -> JSON | None:
            if any_delivery and envelope.event_id is not None:
                for delivery in self.deliveries(envelope.event_id):
                    if delivery.envelope_id in self.acks:
                        return self.acks[delivery.envelope_id]
            return self.acks.get(envelope.envelope_id)

        found = await eventually(
            ack,
            timeout,
            f"an ack for envelope {envelope.envelope_id} ({envelope.type})",
            woken_by=self._wake,
        )
        assert found is not None
        return found

    def deliveries(self, event_id: str) -> list[Envelope]:
        """Every envelope sent for that event: the first and each redelivery."""
        return list(self._deliveries.get(event_id, []))

    async def redeliver(self, envelope: Envelope) -> Envelope:
        """Send ``envelope``'s payload again now, as Slack's retry would: a new envelope_id,
        the next retry_attempt, retry_reason "timeout"."""
        if envelope.event_id is not None:
            attempt = len(self._deliveries.get(envelope.event_id, []))
        else:
            attempt = envelope.retry_attempt + 1
        again = Envelope(
            envelope_id=str(uuid.uuid4()),
            type=envelope.type,
            payload=copy.deepcopy(envelope.payload),
            retry_attempt=attempt,
            event_id=envelope.event_id,
            retry_reason="timeout",
            accepts_response_payload=envelope.accepts_response_payload,
        )
        await self._deliver(again)
        return again

    async def disconnect(self, reason: str = "refresh_requested") -> None:
        """Send ``{"type": "disconnect", "reason": ...}`` on every open connection, then
        close them.

        Like Slack, the fake leaves a disconnected socket open for a moment
        (``disconnect_grace``) so the client can close it itself after opening a new one,
        and sends no more envelopes on it; slack_sdk reacts by calling
        apps.connections.open and reconnecting.
        """
        targets = [conn for conn in self._conns if not conn.closed]
        for conn in targets:
            conn.draining = True
        self._pulse()
        message = json.dumps(
            {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
        )
        for conn in targets:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await conn.ws.send_str(message)
        with contextlib.suppress(AssertionError):
            await eventually(
                lambda: all(conn.closed for conn in targets),
                self.disconnect_grace,
                woken_by=self._wake,
            )
        for conn in targets:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    await conn.ws.close(code=1000, message=b"disconnect")

    async def drop_connection(self) -> None:
        """Cut every open connection abruptly: no disconnect message, no close frame."""
        targets = [conn for conn in self._conns if not conn.closed]
        for conn in targets:
            conn.draining = True
            transport = conn.request.transport
            if transport is not None:
                transport.abort()
        self._pulse()
        with contextlib.suppress(AssertionError):
            await eventually(lambda: all(conn.closed for conn in targets), 2.0, woken_by=self._wake)

    # -- HTTP mode ------------------------------------------------------------------------------

    def signed_headers(
        self, body: bytes, *, timestamp: int | None = None, secret: str | None = None
    ) -> dict[str, str]:
        """Headers Slack signs an HTTP request with
        (https://docs.slack.dev/authentication/verifying-requests-from-slack/):
        ``v0=hex(HMAC-SHA256(secret, "v0:<ts>:<body>"))``, plus the body's Content-Type."""
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        key = (self.signing_secret if secret is None else secret).encode()
        base = f"{SIGNATURE_VERSION}:{stamp}:".encode() + body
        signature = hmac.new(key, base, hashlib.sha256).hexdigest()
        json_body = body.lstrip().startswith(b"{")
        return {
            "Content-Type": (
                "application/json" if json_body else "application/x-www-form-urlencoded"
            ),
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": f"{SIGNATURE_VERSION}={signature}",
        }

    @staticmethod
    def retry_headers(attempt: int, reason: str = "http_timeout") -> dict[str, str]:
        """The headers of an HTTP redelivery (Events API over HTTP)."""
        return {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": reason}

    def event_body(self, event: JSON, *, event_id: str | None = None) -> bytes:
        """The JSON event_callback body Slack POSTs to a Request URL."""
        return json.dumps(self._event_callback(event, event_id)).encode()

    def url_verification_body(self, challenge: str = "fake-challenge") -> bytes:
        """The body Slack POSTs once to check a Request URL (answer: the challenge)."""
        return json.dumps(
            {"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"}
        ).encode()

    def action_body(
        self,
        *,
        channel: str,
        message_ts: str,
        action_id: str,
        value: str | None = None,
        user: str = OWNER_ID,
    ) -> bytes:
        """The form body (``payload=<json>``) Slack POSTs to an interactivity Request URL."""
        payload = self._block_actions(channel, message_ts, action_id, value, user)
        return urlencode({"payload": json.dumps(payload)}).encode()

    # -- files ----------------------------------------------------------------------------------

    def add_file(
        self, content: bytes, *, name: str = "report.txt", mimetype: str = "text/plain"
    ) -> JSON:
        """A file a person shared: its Slack file object, for ``push_message(files=[...])``.

        ``url_private`` and ``url_private_download`` serve it to the bot token only."""
        file_id = self._new_file_id()
        obj = self._file_object(file_id, name, name, mimetype, len(content), OWNER_ID)
        self.files[file_id] = obj
        self._file_content[file_id] = bytes(content)
        return copy.deepcopy(obj)

    # -- Web API plumbing -----------------------------------------------------------------------

    def _pulse(self) -> None:
        """Wake everybody waiting on a state change."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _wake(self) -> None:
        await self._changed.wait()

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params, from_json, bad_body = await self._read_params(request)
        # From here on nothing awaits until the call is recorded and applied.
        token = self._token(request, params, from_json)
        status, body, headers = self._answer(method, token, params, bad_body)
        self.calls.append(
            Call(
                method=method,
                params=params,
                ok=bool(body.get("ok")),
                response=body,
                status=status,
                token=token,
                at=time.monotonic(),
            )
        )
        self._pulse()
        return web.json_response(body, status=status, headers=headers)

    @staticmethod
    async def _read_params(request: web.Request) -> tuple[JSON, bool, str | None]:
        """Query, then form or JSON body, merged; JSON-text fields decoded.

        Returns (params, whether the body was JSON, an error for an unreadable body)."""
        params: JSON = dict(request.query)
        from_json = False
        if request.body_exists:
            if request.content_type == "application/json":
                try:
                    body = await request.json()
                except ValueError:
                    return params, True, "invalid_json"
                if not isinstance(body, dict):
                    return params, True, "invalid_json"
                params.update(body)
                from_json = True
            elif request.content_type in (
                "application/x-www-form-urlencoded",
                "multipart/form-data",
            ):
                form = await request.post()
                for key, value in form.items():
                    params[key] = value.file.read() if isinstance(value, web.FileField) else value
        for key in _JSON_TEXT_FIELDS:
            text = params.get(key)
            if isinstance(text, str):
                with contextlib.suppress(ValueError):
                    params[key] = json.loads(text)  # malformed JSON stays a string
        return params, from_json, None

    @staticmethod
    def _token(request: web.Request, params: JSON, from_json: bool) -> str:
        """The bearer token, else a ``token`` form/query field (Slack accepts both for
        forms; a JSON body must use the header)."""
        field = params.pop("token", None)
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return header.removeprefix("Bearer ").strip()
        if isinstance(field, str) and not (from_json and field):
            return field
        return ""

    def _answer(
        self, method: str, token: str, params: JSON, bad_body: str | None
    ) -> tuple[int, JSON, dict[str, str]]:
        handler = self._handlers.get(method)
        if handler is None:
            return 200, {"ok": False, "error": "unknown_method", "req_method": method}, {}
        wants_app = method == "apps.connections.open"
        expected = self.app_token if wants_app else self.bot_token
        if not token:
            return 200, {"ok": False, "error": "not_authed"}, {}
        if token != expected:
            # Slack tells a real token of the wrong kind apart from a bad one.
            known = token in (self.bot_token, self.app_token)
            error = "not_allowed_token_type" if known else "invalid_auth"
            return 200, {"ok": False, "error": error}, {}
        headers: dict[str, str] = {}
        needed = _METHOD_SCOPES.get(method)
        if not wants_app:
            headers["x-oauth-scopes"] = ",".join(self.scopes)
            headers["x-accepted-oauth-scopes"] = needed or ""
        if bad_body is not None:
            return 200, {"ok": False, "error": bad_body}, headers
        if needed is not None and needed not in self.scopes:
            body = {
                "ok": False,
                "error": "missing_scope",
                "needed": needed,
                "provided": ",".join(self.scopes),
            }
            return 200, body, headers
        fault = self._take_fault(method)
        if fault is not None:
            if fault.status == 429:
                return self._too_many(fault.retry_after or 1, headers)
            return fault.status, {"ok": False, "error": fault.error}, headers
        wait = self._rate_wait(method, params)
        if wait > 0:
            return self._too_many(max(1, math.ceil(wait)), headers)
        try:
            result = handler(params)
        except SlackError as exc:
            return exc.status, exc.body(), headers
        return 200, {"ok": True, **result}, headers

    def _too_many(
        self, retry_after: int, headers: dict[str, str]
    ) -> tuple[int, JSON, dict[str, str]]:
        self.rate_limited += 1
        return (
            429,
            {"ok": False, "error": "ratelimited"},
            {**headers, "Retry-After": str(retry_after)},
        )

    def _take_fault(self, method: str) -> _Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return None
        fault = queue[0]
        fault.remaining -= 1
        if fault.remaining <= 0:
            queue.pop(0)
        return fault

    def _rate_wait(self, method: str, params: JSON) -> float:
        """Seconds until the (method, channel) bucket allows a call; takes a token if 0."""
        limit = self._limits.get(method)
        if limit is None:
            return 0.0
        channel = str(params.get("channel") or params.get("channel_id") or "")
        bucket = self._buckets.get((method, channel))
        if bucket is None:
            bucket = self._buckets[(method, channel)] = TokenBucket(*limit)
        wait = bucket.wait(time.monotonic())
        if wait == 0:
            bucket.take()
        return wait

    # -- state helpers --------------------------------------------------------------------------

    def _next_ts(self) -> str:
        """Message timestamps: unique and increasing, "1700000000.000100" style."""
        self._ts += 1
        micros = 100 * self._ts
        return f"{1_700_000_000 + micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _new_file_id(self) -> str:
        self._ids += 1
        return f"F{self._ids:010d}"

    def _new_event_id(self) -> str:
        alphabet = string.ascii_uppercase + string.digits
        while True:
            event_id = "Ev" + "".join(random.choices(alphabet, k=10))
            if event_id not in self._event_ids:
                self._event_ids.add(event_id)
                return event_id

    def _channel(self, value: Any, *, allow_user: bool = False) -> str:
        """A channel id Slack would accept; a user id means the bot's DM with that user
        where Slack allows it (chat.postMessage)."""
        if isinstance(value, str) and allow_user and _USER_ID.fullmatch(value):
            return self.dm_channel(value)
        if not isinstance(value, str) or not _CHANNEL_ID.fullmatch(value):
            raise SlackError("channel_not_found")
        if value in self.unknown_channels:
            raise SlackError("channel_not_found")
        return value

    def _store(self, record: JSON, *, bot: bool) -> None:
        channel = record["channel"]
        self.history.setdefault(channel, []).append(record)
        if bot:
            self.messages.setdefault(channel, []).append(record)

    def _store_person_message(self, event: JSON) -> None:
        record: JSON = {
            "type": "message",
            "channel": event["channel"],
            "ts": event["ts"],
            "text": event.get("text", ""),
            "blocks": copy.deepcopy(event.get("blocks", [])),
            "thread_ts": event.get("thread_ts"),
            "user": event.get("user"),
            "bot_id": None,
            "team": self.TEAM_ID,
            "subtype": event.get("subtype"),
            "files": copy.deepcopy(event.get("files")),
            "edited": None,
        }
        self._store(record, bot=False)
        self._pulse()

    def _store_bot_message(
        self,
        channel: str,
        *,
        text: str,
        blocks: list[JSON],
        thread_ts: str | None,
        subtype: str | None = None,
        files: list[JSON] | None = None,
        attachments: Any = None,
        options: JSON | None = None,
    ) -> JSON:
        record: JSON = {
            "type": "message",
            "channel": channel,
            "ts": self._next_ts(),
            "text": text,
            "blocks": blocks,
            "thread_ts": thread_ts,
            "user": self.BOT_USER_ID,
            "bot_id": self.BOT_ID,
            "app_id": self.APP_ID,
            "team": self.TEAM_ID,
            "subtype": subtype,
            "files": files,
            "attachments": attachments,
            "edited": None,
            **(options or {}),
        }
        self._store(record, bot=True)
        if self.echo_bot_messages and not self._closing:
            echo = self._wire(record) | {"channel": channel, "event_ts": record["ts"]}
            self._spawn(self.push_event(echo))
        return record

    def _wire(self, record: JSON) -> JSON:
        """A stored message as Slack's APIs show it (no bookkeeping, no empty fields)."""
        obj = {
            key: copy.deepcopy(value)
            for key, value in record.items()
            if key not in _LOCAL_KEYS and value is not None and value != []
        }
        if record.get("bot_id"):
            obj["bot_profile"] = {
                "id": self.BOT_ID,
                "app_id": self.APP_ID,
                "name": self.BOT_NAME,
                "deleted": False,
                "team_id": self.TEAM_ID,
            }
        return obj

    def _remove(self, record: JSON) -> None:
        channel = record["channel"]
        self.history[channel] = [m for m in self.history.get(channel, []) if m is not record]
        if channel in self.messages:
            self.messages[channel] = [m for m in self.messages[channel] if m is not record]

    def _user_object(self, user_id: str, name: str, real_name: str) -> JSON:
        return {
            "id": user_id,
            "team_id": self.TEAM_ID,
            "name": name,
            "deleted": False,
            "real_name": real_name,
            "tz": "Europe/London",
            "is_admin": False,
            "is_owner": False,
            "is_bot": False,
            "is_app_user": False,
            "profile": {
                "display_name": name,
                "display_name_normalized": name,
                "real_name": real_name,
                "real_name_normalized": real_name,
                "team": self.TEAM_ID,
            },
        }

    def _file_object(
        self, file_id: str, name: str, title: str, mimetype: str, size: int, user: str
    ) -> JSON:
        now = int(time.time())
        quoted = quote(name)
        private = f"{self.origin}/files-pri/{self.TEAM_ID}-{file_id}"
        return {
            "id": file_id,
            "created": now,
            "timestamp": now,
            "name": name,
            "title": title,
            "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1].lower() if "." in name else "binary",
            "pretty_type": mimetype,
            "user": user,
            "user_team": self.TEAM_ID,
            "editable": False,
            "size": size,
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": f"{private}/{quoted}",
            "url_private_download": f"{private}/download/{quoted}",
            "permalink": f"https://{self.TEAM_DOMAIN}.slack.com/files/{user}/{file_id}/{quoted}",
            "is_starred": False,
            "has_rich_preview": False,
            "file_access": "visible",
        }

    def _event_callback(self, event: JSON, event_id: str | None) -> JSON:
        """The event_callback payload (https://docs.slack.dev/apis/events-api/)."""
        if event_id is None:
            event_id = self._new_event_id()
        self._event_ids.add(event_id)
        return {
            "token": VERIFICATION_TOKEN,
            "team_id": self.TEAM_ID,
            "context_team_id": self.TEAM_ID,
            "context_enterprise_id": None,
            "api_app_id": self.APP_ID,
            "event": copy.deepcopy(event),
            "type": "event_callback",
            "event_id": event_id,
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.TEAM_ID,
                    "user_id": self.BOT_USER_ID,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-fake-{event_id}",
        }

    def _block_actions(
        self, channel: str, message_ts: str, action_id: str, value: str | None, user: str
    ) -> JSON:
        """A block_actions payload (https://docs.slack.dev/reference/interaction-payloads/)."""
        stored = self.message(channel, message_ts)
        found = _find_button(stored.get("blocks") or [], action_id) if stored else None
        block_id, element = found if found is not None else ("", {})
        action: JSON = {
            "action_id": action_id,
            "block_id": block_id or "".join(random.choices(string.ascii_letters, k=5)),
            "text": copy.deepcopy(element.get("text"))
            or {"type": "plain_text", "text": action_id, "emoji": True},
            "type": element.get("type", "button"),
            "action_ts": f"{time.time():.6f}",
        }
        chosen = value if value is not None else element.get("value")
        if chosen is not None:
            action["value"] = chosen
        if element.get("style"):
            action["style"] = element["style"]
        secret = uuid.uuid4().hex
        self._response_urls[secret] = (channel, message_ts)
        person = self.users.get(user, {"name": user.lower()})
        payload: JSON = {
            "type": "block_actions",
            "user": {
                "id": user,
                "username": person["name"],
                "name": person["name"],
                "team_id": self.TEAM_ID,
            },
            "api_app_id": self.APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel,
                "is_ephemeral": False,
            },
            "trigger_id": f"{int(time.time())}.{self._ts}.{uuid.uuid4().hex}",
            "team": {"id": self.TEAM_ID, "domain": self.TEAM_DOMAIN},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {
                "id": channel,
                "name": "directmessage" if channel.startswith("D") else channel[1:].lower(),
            },
            "state": {"values": {}},
            "response_url": f"{self.origin}/actions/{secret}",
            "actions": [action],
        }
        if stored is not None:
            payload["message"] = self._wire(stored)
        return payload

    # -- Web API methods (synchronous: see the module docstring) --------------------------------

    def _auth_test(self, params: JSON) -> JSON:
        return {
            "url": f"https://{self.TEAM_DOMAIN}.slack.com/",
            "team": self.TEAM_NAME,
            "user": self.BOT_NAME,
            "team_id": self.TEAM_ID,
            "user_id": self.BOT_USER_ID,
            "bot_id": self.BOT_ID,
            "is_enterprise_install": False,
        }

    def _connections_open(self, params: JSON) -> JSON:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        host = self.socket_origin or self.origin.removeprefix("http://")
        return {"url": f"ws://{host}/link/?ticket={ticket}&app_id={self.APP_ID}"}

    def _content(self, params: JSON) -> tuple[str | None, list[JSON] | None]:
        """(text, blocks) of a post or update, checked as Slack checks them."""
        text = params.get("text")
        if text is not None and not isinstance(text, str):
            text = str(text)
        blocks = params.get("blocks")
        if blocks is not None:
            blocks = check_blocks(blocks)
        if text is not None and len(text) > MAX_TEXT_LENGTH:
            raise SlackError("msg_too_long")
        return text, blocks

    def _post_message(self, params: JSON) -> JSON:
        channel = self._channel(params.get("channel"), allow_user=True)
        text, blocks = self._content(params)
        attachments = params.get("attachments")
        if not text and not blocks and not attachments:
            raise SlackError("no_text")
        thread_ts = params.get("thread_ts") or None
        broadcast = _as_bool(params.get("reply_broadcast"))
        record = self._store_bot_message(
            channel,
            text=text or "",
            blocks=blocks or [],
            thread_ts=thread_ts,
            subtype="thread_broadcast" if broadcast and thread_ts else None,
            attachments=attachments,
            options={
                "mrkdwn": _as_bool(params.get("mrkdwn")),
                "unfurl_links": _as_bool(params.get("unfurl_links")),
                "unfurl_media": _as_bool(params.get("unfurl_media")),
                "reply_broadcast": broadcast,
            },
        )
        return {"channel": channel, "ts": record["ts"], "message": self._wire(record)}

    def _editable(self, params: JSON, refusal: str) -> JSON:
        channel = self._channel(params.get("channel"))
        record = self.message(channel, str(params.get("ts") or ""))
        if record is None:
            raise SlackError("message_not_found")
        if record.get("bot_id") != self.BOT_ID:
            raise SlackError(refusal)
        return record

    def _update_message(self, params: JSON) -> JSON:
        record = self._editable(params, "cant_update_message")
        text, blocks = self._content(params)
        if text is None and blocks is None and params.get("attachments") is None:
            raise SlackError("no_text")
        # Slack keeps what an update leaves out ("If you don't include this field, the
        # message's previous blocks will be retained"): a text-only edit keeps the buttons.
        if text is not None:
            record["text"] = text
        if blocks is not None:
            record["blocks"] = blocks
        if params.get("attachments") is not None:
            record["attachments"] = params["attachments"]
        record["edited"] = {"user": self.BOT_USER_ID, "ts": self._next_ts()}
        self.updates.append(
            {
                "channel": record["channel"],
                "ts": record["ts"],
                "text": record["text"],
                "blocks": copy.deepcopy(record["blocks"]),
            }
        )
        return {
            "channel": record["channel"],
            "ts": record["ts"],
            "text": record["text"],
            "message": self._wire(record),
        }

    def _delete_message(self, params: JSON) -> JSON:
        record = self._editable(params, "cant_delete_message")
        self._remove(record)
        self.deletions.append({"channel": record["channel"], "ts": record["ts"]})
        return {"channel": record["channel"], "ts": record["ts"]}

    def _conversations_info(self, params: JSON) -> JSON:
        channel = self._channel(params.get("channel"))
        created = 1_690_000_000
        if channel.startswith("D"):
            user = next((u for u, d in self._dms.items() if d == channel), "U" + channel[1:])
            # An IM has no name and no is_member, as in Slack.
            return {
                "channel": {
                    "id": channel,
                    "created": created,
                    "is_archived": False,
                    "is_im": True,
                    "is_org_shared": False,
                    "context_team_id": self.TEAM_ID,
                    "user": user,
                    "is_user_deleted": False,
                    "priority": 0,
                }
            }
        name = channel[1:].lstrip("0").lower() or channel.lower()
        private = channel.startswith("G")
        return {
            "channel": {
                "id": channel,
                "name": name,
                "name_normalized": name,
                "is_channel": not private,
                "is_group": private,
                "is_im": False,
                "is_mpim": False,
                "is_private": private,
                "created": created,
                "creator": OWNER_ID,
                "is_archived": False,
                "is_general": name == "general",
                "is_shared": False,
                "is_ext_shared": False,
                "is_org_shared": False,
                "is_member": True,
                "context_team_id": self.TEAM_ID,
                "topic": {"value": "", "creator": "", "last_set": 0},
                "purpose": {"value": "", "creator": "", "last_set": 0},
            }
        }

    def _users_info(self, params: JSON) -> JSON:
        user = params.get("user")
        if not isinstance(user, str) or not _USER_ID.fullmatch(user):
            raise SlackError("user_not_found")
        found = self.users.get(user) or self._user_object(user, user.lower(), f"User {user}")
        return {"user": copy.deepcopy(found)}

    def _get_upload_url(self, params: JSON) -> JSON:
        filename = params.get("filename")
        length = _as_int(params.get("length"))
        if not isinstance(filename, str) or not filename or length is None or length <= 0:
            raise SlackError("invalid_arguments")
        file_id = self._new_file_id()
        self._pending_uploads[file_id] = {
            "id": file_id,
            "filename": filename,
            "length": length,
            "content": None,
        }
        return {"upload_url": f"{self.origin}/upload/{file_id}", "file_id": file_id}

    def _complete_upload(self, params: JSON) -> JSON:
        wanted = params.get("files")
        if (
            not isinstance(wanted, list)
            or not wanted
            or not all(isinstance(f, dict) and isinstance(f.get("id"), str) for f in wanted)
        ):
            raise SlackError("invalid_arguments")
        channels: list[str] = []
        if params.get("channel_id"):
            channels.append(self._channel(params["channel_id"]))
        for extra in str(params.get("channels") or "").split(","):
            if extra.strip() and extra.strip() not in channels:
                channels.append(self._channel(extra.strip()))
        for item in wanted:
            pending = self._pending_uploads.get(item["id"])
            # Unknown, never uploaded, or a different size than announced (Slack's error
            # for the last case is not documented; file_not_found is the fake's choice).
            if (
                pending is None
                or pending["content"] is None
                or len(pending["content"]) != pending["length"]
            ):
                raise SlackError("file_not_found")
        thread_ts = params.get("thread_ts") or None
        comment = params.get("initial_comment")
        objects: list[JSON] = []
        for item in wanted:
            pending = self._pending_uploads.pop(item["id"])
            title = item.get("title") or pending["filename"]
            content: bytes = pending["content"]
            mimetype = mimetypes.guess_type(pending["filename"])[0] or "application/octet-stream"
            obj = self._file_object(
                pending["id"],
                pending["filename"],
                title,
                mimetype,
                len(content),
                self.BOT_USER_ID,
            )
            self.files[pending["id"]] = obj
            self._file_content[pending["id"]] = content
            objects.append(obj)
            self.uploads.append(
                {
                    "id": pending["id"],
                    "title": title,
                    "filename": pending["filename"],
                    "content": content,
                    "channel_id": channels[0] if channels else None,
                    "thread_ts": thread_ts,
                    "initial_comment": comment,
                }
            )
        for channel in channels:
            self._store_bot_message(
                channel,
                text=str(comment or ""),
                blocks=[],
                thread_ts=thread_ts,
                subtype="file_share",
                files=copy.deepcopy(objects),
            )
        return {"files": copy.deepcopy(objects)}

    # -- other HTTP endpoints -------------------------------------------------------------------

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        """The upload URL: slack_sdk POSTs the raw bytes; curl-style multipart also works."""
        file_id = request.match_info["file_id"]
        if request.content_type == "multipart/form-data":
            form = await request.post()
            parts = [v for v in form.values() if isinstance(v, web.FileField)]
            data = parts[0].file.read() if parts else b""
        else:
            data = await request.read()
        pending = self._pending_uploads.get(file_id)
        if pending is None:
            return web.Response(status=404, text="Not Found", content_type="text/plain")
        pending["content"] = data
        self._pulse()
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    async def _download(self, request: web.Request) -> web.StreamResponse:
        """url_private(_download): the file for the bot token.

        Without a valid token real Slack does not answer 401: it redirects to the
        workspace's sign-in page, which comes back as a 200 HTML page. A client that forgets
        the Authorization header therefore gets HTML, not the file — as here.
        """
        team_file = request.match_info["team_file"]
        file_id = team_file.removeprefix(f"{self.TEAM_ID}-")
        header = request.headers.get("Authorization", "")
        authorized = header == f"Bearer {self.bot_token}" and "files:read" in self.scopes
        self.downloads.append({"file_id": file_id, "path": request.path, "authorized": authorized})
        self._pulse()
        if not authorized:
            raise web.HTTPFound(location=f"{self.origin}/signin?redir={quote(request.path)}")
        content = self._file_content.get(file_id)
        if content is None or not team_file.startswith(f"{self.TEAM_ID}-"):
            return web.Response(
                status=404,
                text="<html><body>File not found</body></html>",
                content_type="text/html",
            )
        obj = self.files[file_id]
        return web.Response(
            body=content,
            content_type=obj["mimetype"],
            headers={"Content-Disposition": f'attachment; filename="{obj["name"]}"'},
        )

    async def _signin(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            text=(
                "<!DOCTYPE html><html><head><title>Sign in | Slack</title></head>"
                "<body><h1>Sign in to Fake Team</h1></body></html>"
            ),
            content_type="text/html",
        )

    async def _response_url(self, request: web.Request) -> web.StreamResponse:
        """A block_actions response_url: recorded; replace_original / delete_original are
        applied to the message the button was on."""
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"ok": False, "error": "invalid_json"}, status=400)
        target = self._response_urls.get(request.match_info["secret"])
        if target is None or not isinstance(body, dict):
            return web.json_response({"ok": False, "error": "expired_url"}, status=404)
        self.action_responses.append({"url": str(request.url), "body": body})
        record = self.message(*target)
        if record is not None and record.get("bot_id") == self.BOT_ID:
            if _as_bool(body.get("delete_original")):
                self._remove(record)
            elif _as_bool(body.get("replace_original")):
                record["text"] = str(body.get("text") or "")
                record["blocks"] = copy.deepcopy(body.get("blocks") or [])
                record["edited"] = {"user": self.BOT_USER_ID, "ts": self._next_ts()}
        self._pulse()
        return web.json_response({"ok": True})

    # -- Socket Mode plumbing -------------------------------------------------------------------

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets or self._closing:
            return web.Response(status=401, text="invalid ticket")
        ws = web.WebSocketResponse(autoping=True, timeout=1.0)
        await ws.prepare(request)
        self._tickets.discard(ticket)  # one connection per URL
        self.connections += 1
        conn = _Connection(number=self.connections, ws=ws, request=request)
        self._conns.append(conn)
        self._pulse()
        hello = {
            "type": "hello",
            "num_connections": sum(1 for c in self._conns if not c.closed),
            "debug_info": {
                "host": "applink-fake",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.APP_ID},
        }
        try:
            await ws.send_str(json.dumps(hello))
            conn.ready = True
            self._pulse()
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_socket_text(msg.data)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            conn.closed = True
            conn.ready = False
            self._conns.remove(conn)
            self._pulse()
        return ws

    def _on_socket_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            message = {"raw": data}
        if not isinstance(message, dict):
            message = {"raw": message}
        self.socket_messages.append(message)
        envelope_id = message.get("envelope_id")
        if isinstance(envelope_id, str):
            self.acks.setdefault(envelope_id, message)
        self._pulse()

    def _ready_connection(self) -> _Connection | None:
        """The newest open connection that may carry envelopes."""
        ready = [c for c in self._conns if c.ready and not c.draining and not c.closed]
        return ready[-1] if ready else None

    async def _deliver(self, envelope: Envelope) -> None:
        conn = await eventually(
            self._ready_connection,
            self.delivery_timeout,
            "a Socket Mode connection to deliver to",
            woken_by=self._wake,
        )
        assert conn is not None
        self.envelopes.append(envelope)
        if envelope.event_id is not None:
            self._deliveries.setdefault(envelope.event_id, []).append(envelope)
        self._pulse()
        if envelope.type == "events_api" and self.ack_timeout > 0:
            self._spawn(self._redeliver_unless_acked(envelope, self.ack_timeout))
        # A socket closing under us loses the envelope; the ack timeout redelivers it.
        with contextlib.suppress(ConnectionError, RuntimeError):
            await conn.ws.send_str(json.dumps(envelope.wire()))

    def _event_acked(self, envelope: Envelope) -> bool:
        if envelope.event_id is None:
            return self.acked(envelope)
        return any(self.acked(e) for e in self._deliveries.get(envelope.event_id, []))

    async def _redeliver_unless_acked(self, envelope: Envelope, delay: float) -> None:
        """Slack's Socket Mode retry: an envelope unacked after ``delay`` comes again, up to
        ``max_retries`` times. Only the latest delivery of an event schedules the next."""
        await asyncio.sleep(delay)
        if self._closing or self._event_acked(envelope):
            return
        if envelope.retry_attempt >= self.max_retries:
            return
        if envelope.event_id is not None:
            latest = self._deliveries.get(envelope.event_id, [envelope])[-1]
            if latest is not envelope:
                return
        await self.redeliver(envelope)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        """A background delivery that found no connection in time just gives up."""
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()
