"""A channel host for a channel built outside a daemon (a unit test of its rendering or
of its constructor): the parts a test gives, and a clear failure for any other."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_bot.bus import AccessControl, Bus, Masking, NoHttpServer, Routes
from echo_bot.edge import Edge
from echo_bot.events import Address, OutboundMessage
from echo_bot.link import Link
from echo_bot.secrets import Masker


class BareHost:
    """``ChannelHost`` with no daemon behind it: ``environ``, ``http`` and ``started_at``
    as given; publishing, access and the store are not there (AssertionError)."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        http: Routes | None = None,
        started_at: float = 0.0,
        state_dir: Path | None = None,
    ) -> None:
        self.state_dir = state_dir or Path("/nonexistent/bare-host")
        self.environ: Mapping[str, str] = environ or {}
        self._http = http
        self.started_at = started_at
        self.commands: Sequence[tuple[str, str]] = ()
        self.shared = False
        self.masker: Masking = Masker()
        self.stopped: list[int] = []
        self.detached: list[str] = []

    @property
    def bus(self) -> Bus:
        raise AssertionError("a bare host has no bus")

    @property
    def access(self) -> AccessControl:
        raise AssertionError("a bare host has no access control")

    def edge(self, channel: str, *, prefix: str = "/", pair_as: str = "as `pair CODE`") -> Edge:
        return Edge(channel, self, prefix=prefix, pair_as=pair_as)

    def link(self, channel: str) -> Link:
        link = Link(channel)
        self.add_health(channel, link.state)
        return link

    @property
    def serves_http(self) -> bool:
        return self._http is not None

    def routes(self) -> Routes:
        if self._http is None:
            raise NoHttpServer("no HTTP server in this test")
        return self._http

    def add_health(self, name: str, check: Callable[[], dict[str, Any]]) -> None:
        if self._http is not None:
            self._http.add_health(name, check)

    async def audit(self, event: str, **data: Any) -> None:
        pass

    async def pending_prompts(self, to: Address) -> list[OutboundMessage]:
        return []

    async def timezone_for(self, to: Address) -> str:
        return "UTC"

    def request_stop(self, exit_code: int = 0) -> None:
        self.stopped.append(exit_code)

    def detach(self, channel: str) -> None:
        self.detached.append(channel)

    async def hold(self, name: str, within: float) -> bool:
        return True

    async def recall(self, name: str) -> tuple[int, float] | None:
        return None

    async def remember(self, name: str, value: int) -> None:
        pass

    async def recall_note(self, name: str) -> tuple[str, float] | None:
        return None

    async def remember_note(self, name: str, value: str, *, replace: bool = True) -> None:
        pass

    def stop_generation(self, key: str) -> bool:
        return False

    def argv_args(self, tool: str) -> Collection[str]:
        return ()
