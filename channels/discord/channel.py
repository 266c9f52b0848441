"""The Discord channel: the wiring of discord.py's client and the parts that do the work,
and the start's checks (a refused token, or intents the application lacks, fail the
start with what to fix; Discord out of reach is retried)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import discord

from channels.parts import Tasks, ThroughParts, tls_context
from echo_bot.bus import Bus, Capabilities, ChannelHost, Diagnosis
from echo_bot.errors import ConfigError, PeerAway

from .client import Gateway
from .common import log
from .doctor import diagnose
from .inbound import Inbound
from .media import Downloads
from .outbound import Outbound
from .settings import DiscordConfig

INTENT_REFUSED = (
    "discord.message_content: Discord refused the Message Content intent: turn it on"
    " (developer portal → the application → Bot → Privileged Gateway Intents), or set"
    " [discord] message_content = false"
)


# The gateway's close codes that no reconnect mends (discord.py closes the client on
# them, and on any other it does not handle itself).
REFUSALS = {
    4004: "the token was refused: copy the bot's token again (developer portal → Bot →"
    " Reset Token)",
    4010: "invalid shard", 4011: "sharding required", 4012: "invalid API version",
    4013: "invalid intents",
}  # fmt: skip
IDENTIFY_PAUSE_MAX = 900.0  # seconds between new sessions after failures, at most
STABLE = 300.0  # seconds a session ran for its failure to start the waits anew


class DiscordChannel(ThroughParts):
    """Buttons (message components), threads as conversations of their own, previews
    edited from spare budget, files both ways."""

    name = "discord"
    capabilities = Capabilities(
        buttons=True, edits=True, previews=True, media=True, threads=True, rate_limited=True,
        diagnoses=True, connects=True,
    )  # fmt: skip
    outbound: Outbound
    inbound: Inbound

    def __init__(
        self, section: DiscordConfig, options: Mapping[str, Any], host: ChannelHost
    ) -> None:
        self.config = section
        self.host = host
        self.token = host.environ.get(section.token_env, "")
        self.link = host.link("discord")
        self.edge = host.edge("discord", prefix="!")  # Discord takes /commands as its own
        self._tasks = Tasks()
        self.downloads = Downloads(section)
        self.client: Gateway | None = None

    async def start(self, bus: Bus) -> None:
        self.outbound = Outbound(self.host, self.edge, self._tasks, self.link)
        self.previews = self.outbound.previews
        self.inbound = Inbound(self.config, self.host, self.edge, self._tasks)
        await self.inbound.load()
        await self.outbound.sends.read_left_over()

    async def connect(self) -> None:
        """Log in (the token checked over REST), then keep the gateway connected in the
        background (discord.py RESUMEs or identifies anew by itself). Each try has a
        client of its own: one whose login failed is closed whole."""
        client = Gateway(
            self.config, self.link, await asyncio.to_thread(tls_context, self.config.ca_file)
        )
        try:
            await self._login(client)
        except BaseException:
            await client.close()
            raise
        self.client = self.outbound.client = self.inbound.client = client
        client.receiver = self.inbound
        self._tasks.spawn(self.inbound.run())
        self._tasks.spawn(self._gateway(client))
        self._tasks.spawn(self.outbound.sends.remove_left_over())
        log.info(
            "discord: signed in as %s (%s)", client.user, client.user.id if client.user else "?"
        )

    async def _login(self, client: Gateway) -> None:
        try:
            await client.login(self.token)
        except discord.LoginFailure:
            raise ConfigError(
                f"discord.token_env: Discord refused ${self.config.token_env}: copy the bot's"
                " token again (developer portal → Bot → Reset Token)"
            ) from None
        except discord.RateLimited as exc:  # a wait longer than discord.py's own
            raise PeerAway(f"Discord asks to wait {exc.retry_after:.0f} s") from None
        except discord.HTTPException as exc:
            if exc.status == 429:  # Cloudflare's ban of this address for a while: not the token
                raise PeerAway(
                    "Discord's Cloudflare turned this address away for now (429)"
                ) from None
            if exc.status < 500:
                raise ConfigError(f"discord: logging in was refused ({exc.status})") from None
            raise PeerAway(f"Discord failed on its side ({exc.status})") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PeerAway(f"cannot reach Discord: {type(exc).__name__} {exc}") from None

    async def _gateway(self, client: Gateway) -> None:
        """The gateway kept connected. An event discord.py fails to parse ends its
        connection loop: a new session is made after a pause that grows (to
        IDENTIFY_PAUSE_MAX: Discord allows 1,000 new sessions a day), so one malformed
        event never stops the channel; a refusal (the token, the intents) is said."""
        pause = 1.0
        while not client.is_closed():
            began = asyncio.get_running_loop().time()
            try:
                await client.connect(reconnect=True)
            except discord.PrivilegedIntentsRequired:
                # discord.py leaves the client open: connecting again would IDENTIFY
                # again at once, refused each time, using up the day's 1,000 logins.
                self._refused(client, INTENT_REFUSED)
                return
            except discord.ConnectionClosed as exc:  # discord.py closed the client
                why = REFUSALS.get(exc.code or 0, "a close no reconnect mends")
                self._refused(client, f"discord: the gateway refused the bot ({exc.code}: {why})")
            except Exception as exc:
                if asyncio.get_running_loop().time() - began > STABLE:
                    pause = 1.0  # a failure after a good while starts the waits anew
                log.exception("discord: the gateway failed; a new session in %.0f s", pause)
                self.link.reconnecting(f"the gateway failed: {type(exc).__name__}", "gateway")
                if client.ws is not None:
                    await client.ws.close(code=1000)
                await asyncio.sleep(pause)
                pause = min(pause * 2, IDENTIFY_PAUSE_MAX)

    def _refused(self, client: Gateway, why: str) -> None:
        client.refused = True
        self.link.refused(why)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        await self._tasks.cancel_all()
        if self.client is not None and hasattr(self, "inbound"):
            try:
                await self.inbound.save()
            except Exception as exc:
                log.warning("discord: positions not saved at the stop (%s)", exc)

    @staticmethod
    async def diagnose(
        section: DiscordConfig, environ: Mapping[str, str], state_dir: Path
    ) -> list[Diagnosis]:
        return await diagnose(section, environ, state_dir)
