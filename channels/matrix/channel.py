"""The Matrix channel: the wiring of the client and the parts that do the work.

``session`` logs in and loads the key store; ``sync`` runs the durable loop; ``inbound``
maps events; ``media`` reads, fetches and uploads files; ``outbound`` sends;
``previews`` shows a reply while it is written; ``typing`` shows the bot typing while a
turn runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from channels.parts import Backoff, ThroughParts, connect_when_reachable
from echo_bot.bus import Bus, Capabilities, ChannelHost, Diagnosis
from echo_bot.config import Config, channel_section
from echo_bot.errors import ConfigError

from .approvals import Prompts
from .common import NETWORK_ERRORS, Health, Tasks, Unreachable, log
from .doctor import diagnose
from .inbound import Inbound
from .media import Downloads
from .outbound import Outbound
from .session import log_in, make_client, store_dir
from .settings import MatrixConfig
from .sync import Syncer

STARTUP_TIMEOUT = 30.0


class MatrixChannel(ThroughParts):
    name = "matrix"
    capabilities = Capabilities(
        edits=True, previews=True, media=True, reactions=True, rate_limited=True, diagnoses=True,
        reloads=True,
    )  # fmt: skip

    def __init__(
        self, section: MatrixConfig, options: Mapping[str, Any], host: ChannelHost
    ) -> None:
        if section.user_id is None:
            raise ConfigError("matrix.user_id: the bot account is needed (@name:server)")
        self.config = section
        self.host = host
        self.directory = store_dir(host.state_dir)
        self.client = make_client(section, self.directory)
        self._health = Health()
        self._tasks = Tasks()
        self.prompts = Prompts(host)
        self.inbound = Inbound(section, host, self.client, self.prompts, self._tasks)
        self.syncer = Syncer(section, options, host, self.client, self.inbound, self._health)
        self.outbound = Outbound(
            host, self.client, self.prompts, self._health, self.inbound.typing,
            self.syncer.synced, self._tasks,
        )  # fmt: skip
        self.previews = self.outbound.previews
        self.downloads = Downloads(self.client, section, host)
        host.add_health("matrix", self.health)

    async def start(self, bus: Bus) -> None:
        """Sign in and start syncing. A refused token or password fails the start (the
        user must fix it); a homeserver that cannot be reached does not: the daemon
        runs, /healthz says so, and the channel signs in once the server answers."""
        try:
            await self._log_in()
        except ConfigError:
            await self.client.close()
            raise
        except NETWORK_ERRORS as exc:
            self._unreachable(exc)
            self._tasks.spawn(self._log_in_later())
            return
        self._signed_in()

    async def _log_in(self) -> None:
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                await log_in(self.client, self.config, self.host.environ, self.directory)
        except TimeoutError:
            raise Unreachable(f"no answer in {STARTUP_TIMEOUT:.0f} s") from None

    async def _log_in_later(self) -> None:
        async def sign_in() -> None:
            await self._log_in()
            self._signed_in()

        await connect_when_reachable(sign_in, self._health, NETWORK_ERRORS, self._unreachable)

    def _unreachable(self, exc: BaseException) -> None:
        self._health.degrade(f"cannot reach {self.config.homeserver}: {exc}")

    def _signed_in(self) -> None:
        log.info("matrix: signed in as %s (device %s)", self.client.user_id, self.client.device_id)
        self._tasks.spawn(self._sync())

    async def _sync(self) -> None:
        """The sync loop, for as long as the channel runs: the loop itself rides out a
        homeserver that cannot be reached; anything else it raises is logged and the
        loop starts again (from the stored token) after a backoff."""
        backoff = Backoff()
        while True:
            try:
                await self.syncer.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._health.degrade(f"the sync loop failed: {exc}")
                log.exception("matrix: the sync loop failed; starting it again")
                await backoff.wait()

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

    def health(self) -> dict[str, object]:
        state: dict[str, object] = {"status": self._health.status, "user": self.config.user_id}
        if self._health.last_error:
            state["error"] = self._health.last_error
        if self._health.standby:
            state["sync"] = "another daemon"
        if self._health.rate_limited:
            state["rate_limited"] = self._health.rate_limited
        return state
