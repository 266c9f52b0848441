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
    outbound: Outbound

    def __init__(self, section: SlackConfig, options: Mapping[str, Any], host: ChannelHost) -> None:
        self.config = section
        self.host = host
        # Each secret the mode needs is set: the host made the channel only after its
        # spec found no problem in the environment (config.check_environment).
        self.token = host.environ.get(section.bot_token_env, "")
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
        """What needs no answer from Slack: the Web API's session, the Events API's
        route (the server's routes are fixed once it starts)."""
        await self.web.open()
        await self.outbound.sends.read_left_over()  # the previews the last run left
        if self.config.mode == "http":
            # Deliveries before the first auth.test are answered 503: Slack sends again.
            secret = self.host.environ.get(self.config.signing_secret_env, "")
            self.events = EventsOverHttp(self.config, self.host, secret)

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
        self._tasks.spawn(self.outbound.sends.remove_left_over())
        log.info("slack: signed in as %s (%s)", bot_user, self.config.mode)

    async def _drop_socket(self) -> None:
        if self.socket is not None:
            await self.socket.stop()
            self.socket = None

    async def _who_am_i(self) -> str:
        """The bot's user ID (``auth.test``): its own messages and mentions are known by it."""
        refused = f"slack.bot_token_env: Slack refused ${self.config.bot_token_env}"
        answer = await self._asked("auth.test", self.web.client.auth_test, refused)
        user = answer.get("user_id")
        if not isinstance(user, str) or not user:
            raise ConfigError("slack: auth.test named no bot user")
        return user

    async def _socket_url(self, app_token: str) -> str:
        client = AsyncWebClient(
            token=app_token, base_url=self.config.api_base, retry_handlers=[],
            session=self.web.client.session,
        )  # fmt: skip
        refused = (
            f"slack.app_token_env: Slack refused ${self.config.app_token_env} for Socket Mode"
            " (is Socket Mode on for the app?)"
        )
        answer = await self._asked(
            "apps.connections.open", lambda: client.apps_connections_open(app_token=app_token),
            refused,
        )  # fmt: skip
        url = answer.get("url")
        if not isinstance(url, str) or not url.startswith(("wss://", "ws://")):
            raise PeerAway("apps.connections.open gave no WebSocket URL")
        return url

    async def _asked(self, method: str, call: Any, refused: str) -> Any:
        """A Web API call at the first contact: a refusal is the user's to fix (a
        ``ConfigError`` saying ``refused``), the network or Slack's side is away."""
        try:
            return await self.web.call(method, call)
        except ChannelError as exc:
            if exc.retryable:
                raise PeerAway(str(exc)) from None
            raise ConfigError(f"{refused}: {exc}") from None

    async def stop(self) -> None:
        await self._tasks.cancel_all()
        await self._drop_socket()
        await self.web.close()

    @staticmethod
    async def diagnose(
        section: SlackConfig, environ: Mapping[str, str], state_dir: Path
    ) -> list[Diagnosis]:
        return await diagnose(section, environ, state_dir)
