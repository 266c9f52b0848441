"""The Slack channel: the wiring of the Web API client, the transport and the parts that
do the work, and the start's checks (a wrong token fails the start with its key's name,
instead of a connection retried for ever; Slack out of reach is retried)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from channels.parts import ThroughParts
from echo_bot.bus import Bus, Capabilities, ChannelHost, Diagnosis
from echo_bot.errors import ChannelError, ConfigError, PeerAway

from .common import Tasks, log
from .doctor import diagnose
from .inbound import Inbound
from .media import Downloads
from .outbound import Outbound
from .settings import SlackConfig
from .transport import EventsOverHttp, SocketMode
from .web import Web


class SlackChannel(ThroughParts):
    """Buttons (Block Kit), threads as conversations of their own, and two transports:
    Socket Mode, or the Events API over the daemon's HTTP server."""

    name = "slack"
    capabilities = Capabilities(
        buttons=True, edits=True, previews=True, media=True, threads=True, rate_limited=True,
        diagnoses=True, connects=True,
    )  # fmt: skip

    def __init__(self, section: SlackConfig, options: Mapping[str, Any], host: ChannelHost) -> None:
        self.config = section
        self.host = host
        self.token = host.environ.get(section.bot_token_env, "")
        if not self.token:
            raise ConfigError(f"slack.bot_token_env: ${section.bot_token_env} is not set")
        self.link = host.link("slack")
        self.link.facts["mode"] = section.mode
        self._tasks = Tasks()
        self.web = Web(self.token, section.api_base, self.link)
        self.edge = host.edge("slack", prefix="!")  # Slack takes /commands as its own
        self.outbound = Outbound(host, self.web, self.edge, self._tasks)
        self.previews = self.outbound.previews
        self.downloads = Downloads(section, self.token)
        self.socket: SocketMode | None = None
        self.events: EventsOverHttp | None = None

    async def start(self, bus: Bus) -> None:
        """What needs no answer from Slack: the Web API's session, the transport's
        secret, the Events API's route (the server's routes are fixed once it starts)."""
        await self.web.open()
        if self.config.mode == "socket":
            if not self.host.environ.get(self.config.app_token_env, ""):
                await self.stop()
                raise ConfigError(f"slack.app_token_env: ${self.config.app_token_env} is not set")
        else:
            secret = self.host.environ.get(self.config.signing_secret_env, "")
            if not secret:
                await self.stop()
                raise ConfigError(
                    f"slack.signing_secret_env: ${self.config.signing_secret_env} is not set"
                )
            # Registered now: the server's routes are fixed once it starts. Deliveries
            # before the first auth.test are answered 503, which Slack sends again.
            self.events = EventsOverHttp(self.config, self.host, secret)
            self.events.register()

    async def connect(self) -> None:
        """Check the tokens with Slack and connect. A refused token is the user's to fix;
        Slack that cannot be reached, or fails on its side (5xx), is tried again by the
        host (``Link.first_contact``) while the daemon runs."""
        try:
            bot_user = await self._who_am_i()
            inbound = Inbound(self.config, self.host, self.edge, self._tasks, bot_user)
            if self.config.mode == "socket":
                app_token = self.host.environ.get(self.config.app_token_env, "")
                url = await self._socket_url(app_token)
                self.socket = SocketMode(
                    app_token, self.config.api_base, inbound, self.link, self._tasks
                )
                await self.socket.start(url)
            else:
                assert self.events is not None
                self.events.inbound = inbound
        except BaseException:
            await self._drop_socket()
            raise
        log.info("slack: signed in as %s (%s)", bot_user, self.config.mode)

    async def _drop_socket(self) -> None:
        if self.socket is not None:
            await self.socket.stop()
            self.socket = None

    async def _who_am_i(self) -> str:
        """The bot's user ID (``auth.test``): its own messages and mentions are known by it."""
        try:
            answer = await self.web.call("auth.test", self.web.client.auth_test)
        except ChannelError as exc:
            if exc.retryable:  # the network, or Slack's side: not the token
                raise PeerAway(str(exc)) from None
            raise ConfigError(
                f"slack.bot_token_env: Slack refused ${self.config.bot_token_env} ({exc})"
            ) from None
        user = answer.get("user_id")
        if not isinstance(user, str) or not user:
            raise ConfigError("slack: auth.test named no bot user")
        return user

    async def _socket_url(self, app_token: str) -> str:
        client = AsyncWebClient(
            token=app_token, base_url=self.config.api_base, retry_handlers=[],
            session=self.web.client.session,
        )  # fmt: skip
        try:
            answer = await self.web.call(
                "apps.connections.open", lambda: client.apps_connections_open(app_token=app_token)
            )
        except ChannelError as exc:
            if exc.retryable:  # the network, or Slack's side: not the token
                raise PeerAway(str(exc)) from None
            raise ConfigError(
                f"slack.app_token_env: Slack refused ${self.config.app_token_env} for Socket"
                f" Mode ({exc}); is Socket Mode on for the app?"
            ) from None
        url = answer.get("url")
        if not isinstance(url, str) or not url.startswith(("wss://", "ws://")):
            raise PeerAway("apps.connections.open gave no WebSocket URL")
        return url

    async def stop(self) -> None:
        await self._tasks.cancel_all()
        await self._drop_socket()
        await self.web.close()

    @staticmethod
    async def diagnose(
        section: SlackConfig, environ: Mapping[str, str], state_dir: Path
    ) -> list[Diagnosis]:
        return await diagnose(section, environ, state_dir)

    def health(self) -> dict[str, object]:
        return self.link.state()
