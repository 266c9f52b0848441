"""discord.py's client as the channel uses it: the intents it needs and no more, the
proxy and CA of ``[discord]``, no message cache (nothing is read back from it), and
every REST call's failure mapped onto the delivery worker's ``ChannelError``.

discord.py waits out a 429 itself (per route and global, by the bucket headers) up to
``RATE_WAIT_MAX`` seconds; a longer one comes back as ``ChannelError(retry_after=…)``
for the delivery worker to hold the message. Its own retries of a 5xx are made safe by
the nonce each post carries (Discord answers a repeated nonce with the message it made).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import aiohttp
import discord

from echo_bot.bus import ChannelLink
from echo_bot.errors import ChannelError

from .common import log
from .settings import DiscordConfig

T = TypeVar("T")
RATE_WAIT_MAX = 30.0  # seconds of a 429 discord.py waits out (its smallest allowed)
# No second try mends these. Not 401: the owner mends a reset token (and restarts),
# and the channel is down meanwhile, so its messages wait uncounted, not fail.
FINAL = frozenset({400, 403, 404, 405, 413})


class _Quieter(logging.Filter):
    """discord.py logs each reconnect try with a traceback at ERROR (the link says the
    connection is down once, and each try would fill a long outage's log), and warns
    at each start that voice is not supported (the channel has no voice)."""

    def filter(self, record: logging.LogRecord) -> bool:
        said = record.getMessage()
        if said.startswith("Attempting a reconnect"):
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return "voice will NOT be supported" not in said


logging.getLogger("discord.client").addFilter(_Quieter())


class Receiver(Protocol):
    def arrived(self, message: discord.Message) -> None: ...
    async def pressed(self, interaction: discord.Interaction) -> None: ...
    def new_session(self) -> None: ...


def intents_of(config: DiscordConfig) -> discord.Intents:
    """Guilds (to know channels and threads), messages in guilds and direct messages;
    Message Content only when ``[discord] message_content`` says so."""
    return discord.Intents(
        guilds=True, guild_messages=True, dm_messages=True, message_content=config.message_content
    )


class Gateway(discord.Client):
    """The bot's connection: each event handed to the ``receiver`` (a message in the
    order the gateway sent it: ``arrived`` is called before the handler's first
    ``await``, and discord.py starts handlers in order), its state to the ``link``."""

    def __init__(self, config: DiscordConfig, link: ChannelLink, tls: ssl.SSLContext) -> None:
        super().__init__(
            intents=intents_of(config), proxy=config.proxy, max_messages=None,
            connector=aiohttp.TCPConnector(ssl=tls),
            max_ratelimit_timeout=RATE_WAIT_MAX, chunk_guilds_at_startup=False,
            member_cache_flags=discord.MemberCacheFlags.none(),
        )  # fmt: skip
        self.link = link
        self.receiver: Receiver | None = None
        self.refused = False  # the gateway refused for good: no "reconnecting" after it

    async def on_message(self, message: discord.Message) -> None:
        if self.receiver is not None:
            self.receiver.arrived(message)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        if self.receiver is not None:
            await self.receiver.pressed(interaction)

    async def on_connect(self) -> None:  # READY: a new session (not a RESUME), catch up
        self.link.connected("gateway")
        if self.receiver is not None:
            self.receiver.new_session()

    async def on_resumed(self) -> None:
        self.link.connected("gateway")

    async def on_disconnect(self) -> None:
        if not self.is_closed() and not self.refused:
            self.link.reconnecting("the gateway connection was lost", "gateway")

    async def on_error(self, event: str, *args: Any, **kwargs: Any) -> None:
        log.exception("discord: handling %s failed", event)


async def called(what: str, request: Callable[[], Awaitable[T]], link: ChannelLink) -> T:
    """One REST call; its failure as a ``ChannelError`` (retryable unless Discord
    refused the request itself)."""
    try:
        answer = await request()
    except discord.RateLimited as exc:
        raise ChannelError(f"{what}: rate limited", retry_after=exc.retry_after) from None
    except discord.HTTPException as exc:
        if exc.status == 401:
            link.refused("Discord refused the bot token (401)")
        elif exc.status >= 500:
            link.reconnecting(f"Discord failed on its side ({exc.status} to {what})", "rest")
        elif exc.status == 429:  # not Discord's own (that is RateLimited): Cloudflare's ban
            # of this address, for minutes to an hour: sends wait for it, uncounted.
            link.reconnecting(f"Discord's Cloudflare turned this address away ({what})", "rest")
        error = f"{what}: HTTP {exc.status} {exc.text[:200]}".strip()
        if exc.status == 413:
            error = f"{what}: the file is over Discord's upload limit here (10 MB in most servers)"
        raise ChannelError(error, retryable=exc.status not in FINAL) from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        link.reconnecting(f"cannot reach Discord: {type(exc).__name__}", "rest")
        raise ChannelError(f"{what}: network error: {type(exc).__name__}") from None
    except RuntimeError as exc:  # the client closed (a refusal): tried again later
        raise ChannelError(f"{what}: not connected to Discord ({exc})") from None
    link.back("rest")
    return answer
