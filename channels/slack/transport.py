"""How Slack's deliveries arrive: Socket Mode (a WebSocket the daemon opens with the app
token) or the Events API over HTTP (POSTs to ``[slack] path`` on the core's server,
signed with the signing secret). Either way each delivery is committed before it is
acknowledged, and acknowledged before any work: Slack wants an answer within 3 s, and
the turn runs later from the inbox.

Socket Mode: slack-sdk's ``SocketModeClient`` (aiohttp) reads the envelopes; its
listener only queues them, and the host's ``echo_bot.in_order.InOrder`` commits each in
turn and then sends the envelope's ack. An event whose commit failed is
not acknowledged: Slack sends it again (with ``retry_attempt``), and a redelivered event
is the same inbound (its ``event_id``). Slack sends no button press again: one whose
commit failed shows Slack's warning on the button, and the person presses again.
Several daemons on one store may each hold a connection: Slack hands each envelope to
one of them.

HTTP (the core's ``echo_bot.http_deliveries``): the signature and timestamp are checked
by the SDK's ``SignatureVerifier`` on the raw body (5 minutes either way);
``url_verification`` is answered with its challenge; a delivery not committed is
answered 503, so Slack sends it again (``X-Slack-Retry-Num``; the same ``event_id``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from echo_bot.bus import ChannelHost, ChannelLink
from echo_bot.http_deliveries import DeliveryRoute, NotADelivery
from echo_bot.in_order import InOrder

from .common import CommitFailed, Tasks, log
from .inbound import Inbound
from .settings import SlackConfig

MAX_BODY = 1024 * 1024  # bytes of one HTTP delivery
WATCH_EVERY = 1.0  # seconds between looks at the Socket Mode connection


class _Routine(logging.Filter):
    """The SDK's routine lines (each session made or abandoned) are debug detail, as the
    README promises of library lines; and it logs each failed try to reconnect, with a
    traceback, every few seconds for as long as Slack cannot be reached, which
    /healthz and the channel's one line say."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        message = str(record.msg)
        return not message.startswith(("Failed to connect", "Failed to check the current"))


SDK_LOG = logging.getLogger("channels.slack.socket_mode")
SDK_LOG.addFilter(_Routine())
TAKEN = frozenset({"events_api", "interactive"})


class SocketMode:
    def __init__(
        self, app_token: str, api_base: str, inbound: Inbound, link: ChannelLink, tasks: Tasks
    ) -> None:
        self.app_token = app_token
        self.api_base = api_base
        self.inbound = inbound
        self.link = link
        self.tasks = tasks
        self.client: SocketModeClient | None = None
        # Each envelope committed, then acknowledged, in order. A press whose commit
        # failed is not sent again by Slack: the person sees Slack's warning on the
        # button and presses again; an event comes again (retry_attempt).
        self.envelopes = InOrder(self._take, self._ack, named=_named, log=log)

    async def start(self, url: str) -> None:
        """Connect to ``url`` (from ``apps.connections.open``, asked by the channel so a
        wrong app token fails the start instead of being retried for ever)."""
        client = self.client = SocketModeClient(
            app_token=self.app_token,
            web_client=AsyncWebClient(base_url=self.api_base, retry_handlers=[]),
            auto_reconnect_enabled=True,
            logger=SDK_LOG,
        )
        client.socket_mode_request_listeners.append(self._queued)
        client.wss_uri = url
        self.tasks.spawn(self.envelopes.run())
        await client.connect()  # type: ignore[no-untyped-call]
        self.tasks.spawn(self._watch(client))

    async def _watch(self, client: SocketModeClient) -> None:
        """The SDK reconnects by itself (a new URL from apps.connections.open, every
        ``ping_interval`` while Slack cannot be reached); this shows it on /healthz."""
        while True:
            await asyncio.sleep(WATCH_EVERY)
            if await client.is_connected():
                self.link.back("socket")
            else:
                self.link.reconnecting("the Socket Mode connection is down", "socket")

    async def _queued(self, client: Any, request: SocketModeRequest) -> None:
        self.envelopes.put(request)  # before any await: the envelopes keep their order

    async def _take(self, request: SocketModeRequest) -> None:
        kind = request.type if isinstance(request.type, str) else ""
        if kind in TAKEN:
            await self.inbound.take(kind, request.payload)

    async def _ack(self, request: SocketModeRequest) -> None:
        if self.client is not None and isinstance(request.envelope_id, str):
            response = SocketModeResponse(envelope_id=request.envelope_id)
            await self.client.send_socket_mode_response(response)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()  # type: ignore[no-untyped-call]
            session = self.client.aiohttp_client_session
            if not session.closed:
                await session.close()


class EventsOverHttp:
    """The Events API's route on the core's server (``echo_bot.http_deliveries``)."""

    def __init__(self, config: SlackConfig, host: ChannelHost, secret: str) -> None:
        self.verifier = SignatureVerifier(secret)
        self.inbound: Inbound | None = None  # set once auth.test named the bot
        self.route = DeliveryRoute(host.routes(), config.path, self.take, network="slack",
                                   body_ok=self.signed, max_body=MAX_BODY)  # fmt: skip

    def signed(self, body: bytes, headers: Mapping[str, str]) -> bool:
        """Whether Slack signed it (slack-sdk's verifier, which raises on some malformed
        headers and bodies rather than answering False: those are refused too)."""
        try:
            return bool(self.verifier.is_valid_request(body, dict(headers)))
        except (ValueError, TypeError, UnicodeError):
            return False

    async def take(self, body: bytes, headers: Mapping[str, str]) -> Any:
        kind, payload = _read(body, headers.get("Content-Type", ""))
        if payload is None:
            raise NotADelivery("not a Slack delivery")
        if kind == "url_verification":
            return {"challenge": str(payload.get("challenge", ""))}
        if self.inbound is None:  # not signed in yet (Slack's Web API out of reach)
            raise CommitFailed("not connected to Slack yet")
        await self.inbound.take(kind, payload)
        return None


def _named(request: SocketModeRequest) -> str:
    return f"slack: envelope {request.envelope_id} ({request.type})"


def _read(body: bytes, content_type: str) -> tuple[str, dict[str, Any] | None]:
    """(kind, payload) of an HTTP delivery: JSON for the Events API, a form with a
    ``payload`` field for interactivity."""
    try:
        if content_type.startswith("application/x-www-form-urlencoded"):
            fields = parse_qs(body.decode("utf-8"), max_num_fields=10)
            data = json.loads(fields.get("payload", [""])[0])
            return "interactive", data if isinstance(data, dict) else None
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "", None
    if not isinstance(data, dict):
        return "", None
    if data.get("type") == "url_verification":
        return "url_verification", data
    return "events_api", data
