"""The channel host: the one object the runtime hands every channel (``bus.ChannelHost``),
and the wiring of the channels the daemon runs.

Built in one place (``app``'s ``_make_channels``) from the daemon's parts, passed in as
arguments so that this module does not depend on how the daemon is assembled. Every
part is always there: a daemon without an HTTP server answers ``routes()`` with
``NoHttpServer``, a daemon alone on its store holds every lease. What a channel can do is
read from its ``capabilities``, never probed on the object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .bus import (
    AccessControl,
    Bus,
    Channel,
    Connects,
    MediaSource,
    NoHttpServer,
    PreviewSink,
    Routes,
    ShowsTyping,
    ShowsWhenReady,
)
from .edge import Edge
from .events import Address, OutboundMessage
from .lifecycle import Parts
from .link import Link
from .secrets import Masker
from .store import Store, Tx

if TYPE_CHECKING:  # aiohttp is imported only when the server is needed
    from .approvals.gate import ApprovalGate
    from .cluster import Cluster
    from .delivery import DeliveryWorker
    from .http import HttpServer
    from .media.inbound import MediaPreparer
    from .previews import Previews


class DaemonHost:
    """``ChannelHost`` over one daemon's parts (its store, bus, gate, HTTP server, …)."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: Store,
        access: AccessControl,
        gate: ApprovalGate,
        masker: Masker,
        environ: Mapping[str, str],
        commands: Sequence[tuple[str, str]],
        started_at: float,
        http: HttpServer | None,
        cluster: Cluster | None,
        delivery: DeliveryWorker,
        previews: Previews,
        timezone_for: Callable[[Address], Awaitable[str]],
        argv_args: Callable[[str], Collection[str]],
        request_stop: Callable[[int], None],
        state_dir: Path,
    ) -> None:
        self.state_dir = state_dir
        self._bus = bus
        self._store = store
        self._access = access
        self._gate = gate
        self._masker = masker
        self._environ = environ
        self._commands = tuple(commands)
        self._started_at = started_at
        self._http = http
        self._cluster = cluster
        self._delivery = delivery
        self._previews = previews
        self._timezone_for = timezone_for
        self._argv_args = argv_args
        self._request_stop = request_stop

    @property
    def bus(self) -> Bus:
        return self._bus

    @property
    def access(self) -> AccessControl:
        return self._access

    def edge(self, channel: str, *, prefix: str = "/", pair_as: str = "as `pair CODE`") -> Edge:
        typing = self._previews.typing
        return Edge(channel, self, prefix=prefix, pair_as=pair_as, typing=typing)

    def link(self, channel: str) -> Link:
        link = Link(channel)
        self.add_health(channel, link.state)
        return link

    @property
    def masker(self) -> Masker:
        return self._masker

    @property
    def environ(self) -> Mapping[str, str]:
        return self._environ

    @property
    def commands(self) -> Sequence[tuple[str, str]]:
        return self._commands

    @property
    def started_at(self) -> float:
        return self._started_at

    @property
    def shared(self) -> bool:
        return self._cluster is not None

    @property
    def serves_http(self) -> bool:
        return self._http is not None

    def routes(self) -> Routes:
        if self._http is None:
            raise NoHttpServer(
                "this daemon serves no HTTP ([http] enabled = false and no channel asked"
                " for the server)"
            )
        return self._http

    def add_health(self, name: str, check: Callable[[], dict[str, Any]]) -> None:
        if self._http is not None:
            self._http.add_health(name, check)

    async def audit(self, event: str, **data: Any) -> None:
        await self._store.run(
            lambda tx: tx.audit.write(event, trace_id=None, session_key=None, **data)
        )

    async def pending_prompts(self, to: Address) -> list[OutboundMessage]:
        gate = self._gate

        def read(tx: Tx) -> list[OutboundMessage]:
            now = gate.clock()
            return [
                gate.reprompt(tx, row)
                for row in tx.approvals.pending_for(str(to))
                if not row.expired_at(now)
            ]

        return await self._store.run(read)

    async def timezone_for(self, to: Address) -> str:
        return await self._timezone_for(to)

    def request_stop(self, exit_code: int = 0) -> None:
        self._request_stop(exit_code)

    def detach(self, channel: str) -> None:
        self._delivery.remove_channel(channel)

    async def hold(self, name: str, within: float) -> bool:
        if self._cluster is None:  # alone on the store: always this daemon
            return True
        return await self._cluster.take(name, within=within)

    async def recall(self, name: str) -> tuple[int, float] | None:
        return await self._store.run(lambda tx: tx.meta.position(name))

    async def remember(self, name: str, value: int) -> None:
        await self._store.run(lambda tx: tx.meta.set_position(name, value))

    async def recall_note(self, name: str) -> tuple[str, float] | None:
        return await self._store.run(lambda tx: tx.meta.note(name))

    async def remember_note(self, name: str, value: str, *, replace: bool = True) -> None:
        await self._store.run(lambda tx: tx.meta.set_note(name, value, replace=replace))

    def stop_generation(self, key: str) -> bool:
        return self._previews.stop(key)

    def argv_args(self, tool: str) -> Collection[str]:
        return self._argv_args(tool)


async def start_channels(
    parts: Parts,
    channels: Sequence[Channel],
    *,
    bus: Bus,
    delivery: DeliveryWorker,
    media: MediaPreparer,
    previews: Previews,
    started: list[Channel],
) -> None:
    """Start each channel (stopped in reverse by ``parts``), hand it to delivery, and
    wire what its capabilities declare: files to the media preparer, previews to the
    preview sinks, typing to the indicator. ``started`` receives each channel once it runs."""
    for channel in channels:
        stop = partial(_stop_channel, delivery, previews, channel)
        await parts.start(f"the {channel.name} channel", partial(_start, channel, bus), stop)
        started.append(channel)
        delivery.add_channel(channel)
        can = channel.capabilities
        if can.media:
            media.add_source(cast(MediaSource, channel))
        if can.previews:
            previews.add_sink(cast(PreviewSink, channel))
        if can.typing:
            previews.typing.add(cast(ShowsTyping, channel))


async def _start(channel: Channel, bus: Bus) -> None:
    """``start``, then for a channel that ``connects``, its first contact with its peer
    (``Link.first_contact``: a refusal fails the start, after the channel stops; a peer
    away is tried again in the background)."""
    await channel.start(bus)
    if not channel.capabilities.connects:
        return
    connects = cast(Connects, channel)
    try:
        await connects.link.first_contact(connects.connect)
    except BaseException:
        await connects.link.close()
        await channel.stop()
        raise


async def _stop_channel(delivery: DeliveryWorker, previews: Previews, channel: Channel) -> None:
    """Delivery lets go of the channel first (its sends in flight finish), then it stops
    (no longer tried again first, when the host makes its contact; typing no more)."""
    await delivery.release(channel.name)
    await previews.typing.remove(channel.name)
    if channel.capabilities.connects:
        await cast(Connects, channel).link.close()
    await channel.stop()


async def show_when_ready(channels: Sequence[Channel]) -> None:
    """What a channel shows once the whole daemon is up (the terminal: the approval
    prompts still pending there, after the banner)."""
    for channel in channels:
        if channel.capabilities.shows_when_ready:
            await cast(ShowsWhenReady, channel).ready()
