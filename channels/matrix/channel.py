"""The Matrix channel: the wiring of the client and the parts that do the work (the
package's docstring names them); ``show_typing`` is how a room shows the bot typing
(the host's indicator says when)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from channels.parts import ThroughParts
from echo_bot.bus import Bus, Capabilities, ChannelHost, Diagnosis
from echo_bot.config import Config, channel_section
from echo_bot.errors import ConfigError, PeerAway
from echo_bot.events import Address

from .common import NETWORK_ERRORS, Tasks, log
from .doctor import diagnose
from .inbound import Inbound
from .media import Downloads
from .outbound import Outbound
from .session import log_in, make_client, store_dir
from .settings import MatrixConfig
from .sync import Syncer

TYPING_LASTS = 30.0  # seconds one typing notification shows


class MatrixChannel(ThroughParts):
    """No buttons: prompts are answered by reaction or reply; rooms may be encrypted."""

    name = "matrix"
    capabilities = Capabilities(
        edits=True, previews=True, media=True, reactions=True, rate_limited=True, diagnoses=True,
        reloads=True, connects=True, typing=True,
    )  # fmt: skip
    outbound: Outbound

    def __init__(
        self, section: MatrixConfig, options: Mapping[str, Any], host: ChannelHost
    ) -> None:
        if section.user_id is None:
            raise ConfigError("matrix.user_id: the bot account is needed (@name:server)")
        self.config = section
        self.host = host
        self.directory = store_dir(host.state_dir)
        self.client = make_client(section, self.directory)
        self.link = host.link("matrix")
        self.link.facts["user"] = section.user_id
        self.link.ok_after_connect = False  # ok once synced: the rooms' keys are known
        self._tasks = Tasks()
        self.inbound = Inbound(section, host, self.client, self._tasks)
        self.syncer = Syncer(section, options, host, self.client, self.inbound, self.link)
        self.outbound = Outbound(
            host, self.client, self.inbound.edge, self.link, self.syncer.synced, self._tasks,
        )  # fmt: skip
        self.previews = self.outbound.previews
        self.downloads = Downloads(self.client, section, host)

    async def start(self, bus: Bus) -> None:
        """Nothing to open before the homeserver answers (the host's first contact is
        ``connect``); the previews the last run left are read, to remove."""
        await self.outbound.sends.read_left_over()

    async def connect(self) -> None:
        """Sign in, then sync. A refused token or password is the user's to fix; a
        homeserver that cannot be reached is tried again by the host
        (``Link.first_contact``) while the daemon runs."""
        try:
            await log_in(self.client, self.config, self.host.environ, self.directory)
        except NETWORK_ERRORS as exc:
            raise PeerAway(f"cannot reach {self.config.homeserver}: {exc}") from None
        log.info("matrix: signed in as %s (device %s)", self.client.user_id, self.client.device_id)
        self._tasks.spawn(self.syncer.run())
        self._tasks.spawn(self.outbound.sends.remove_left_over())

    async def show_typing(self, to: Address, on: bool) -> float | None:
        """Each notification lasts TYPING_LASTS; renewed before it ends."""
        try:
            await self.client.room_typing(to.chat_id, on, timeout=int(TYPING_LASTS * 1000))
        except Exception as exc:  # never worth a failure: this room shows none
            log.debug("matrix: typing in %s failed: %s", to.chat_id, exc)
            return None
        return TYPING_LASTS * 2 / 3

    def reload(self, config: Config) -> list[str]:
        """The allowlists apply live (the core's access check reads them); the devices
        of a newly allowed user are trusted from the next sync. Other keys of [matrix]
        need a restart, which the core's reload says (live.restart_needed)."""
        self.syncer.trusted = tuple(channel_section(config, "matrix").allowed_users)
        return []

    @staticmethod
    async def diagnose(
        section: MatrixConfig, environ: Mapping[str, str], state_dir: Path
    ) -> list[Diagnosis]:
        return await diagnose(section, environ, state_dir)

    async def stop(self) -> None:
        await self._tasks.cancel_all()
        await self.client.close()
