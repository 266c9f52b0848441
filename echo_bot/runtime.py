"""The daemon's one build: ``build`` makes every part from a validated config and starts
none; the ``Runtime`` it returns is frozen (what a reload changes lives in the mutable
holders it names: ``Live``, ``Exposed``, ``McpSlot``), starts its parts in one order
(``start``, or ``async with runtime.running()``) and stops them in the reverse, and
takes a new config with ``reload`` once ``check`` (store-free) has accepted it."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .access import StoreAccess
from .agent import Dispatcher, TurnRunner
from .agent.calls import CallExecutor
from .agent.runner import HISTORY_LIMIT
from .approvals import ApprovalGate
from .brains.base import Brain, BrainContext
from .brains.model_view import history_text
from .brains.rules import RulesBrain
from .bus import Bus, Channel
from .cluster import Cluster
from .commands.console import register_console_command
from .commands.core import register_core_commands
from .commands.history import register_history_command
from .commands.memory import register_memory_commands
from .commands.model import register_model_command
from .commands.registry import CommandRegistry
from .commands.reminders import register_reminder_commands
from .config import Config, LoadedConfig, check_environment, llm_enabled, secret_env_names
from .core import check, settings, tool_registry, workspace_of
from .delivery import DeliveryWorker
from .errors import ConfigError
from .events import MessageInbound, OutboundKind, OutboundMessage
from .housekeeping import Housekeeping
from .instances import InstanceMembership, default_name
from .lifecycle import Parts
from .live import Exposed, Live, LiveSettings, Reloadable, restart_needed
from .media.budget import MediaBudget
from .media.inbound import MediaPreparer, Transcribe
from .media.inbox import INBOX
from .memory_notes import MemoryNotes
from .previews import Previews
from .scheduling.reminders import ReminderService
from .scheduling.scheduler import Scheduler
from .secrets import Masker
from .store import BusQueues, Store, Tx, make_database
from .store.approvals import ApprovalRow
from .tools.builtin.messaging import Outlet
from .tools.registry import ToolRegistry

if TYPE_CHECKING:
    from .http import HttpServer
    from .mcp.hub import McpHub

log = logging.getLogger(__name__)

# With several daemons on one store: how often reminders set elsewhere are looked for.
SCHEDULE_RESYNC = 15.0
# The longest start waits for the MCP servers' first connection; slower ones go on
# connecting in the background (their tools appear when they are listed).
MCP_START_BOUND = 5.0

Close = Callable[[], Awaitable[None]]


def process_instance() -> str:
    """This daemon among those that write the store: host and pid, and a few random
    characters that tell apart two daemons built in one process (tests do)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class McpSlot:
    """The MCP servers' hub, made in one place (``hub_for``): at build when the config
    names a server, else at the first reload that adds one. Its tools follow into what
    the brain sees; once the HTTP server is known, its health too."""

    def __init__(self, registry: ToolRegistry, environ: Mapping[str, str], exposed: Exposed):
        self._registry = registry
        self._environ = environ
        self._exposed = exposed
        self.hub: McpHub | None = None
        self.http: HttpServer | None = None
        self.stopping = False  # no more state writes: the store closes after
        self.writes: set[asyncio.Task[None]] = set()  # state writes under way

    def hub_for(self, servers: Sequence[Any], max_tools: int) -> McpHub:
        if self.hub is None:  # imported only now: a plain run's footprint stays as it is
            from .mcp.hub import McpHub

            self.hub = McpHub(
                servers,
                self._registry,
                self._environ,
                on_change=self._exposed.refresh,
                max_tools=max_tools,
            )
            if self.http is not None:
                self.http.add_health("mcp", self.hub.health)
        return self.hub

    async def start(
        self, http: HttpServer | None, status: Callable[[str], None], wait: bool
    ) -> None:
        self.http = http
        hub = self.hub
        if hub is None:
            return
        status("starting MCP servers")
        if not wait:
            await hub.start(bound=MCP_START_BOUND)
        else:
            from .mcp.hub import FIRST_TRY

            await hub.start(bound=FIRST_TRY)
            for name, server in hub.servers.items():
                if server.status.state == "starting":  # one that is down said why
                    log.warning(
                        "mcp %s: no answer within %.0f s; its tools answer TOOL_UNAVAILABLE"
                        " until it has started",
                        name,
                        FIRST_TRY,
                    )
        if http is not None:
            http.add_health("mcp", hub.health)

    async def stop(self) -> None:
        """Looks at the hub only now: a reload may have made the first one."""
        if self.hub is None:
            return
        self.stopping = True
        await self.hub.stop()
        await asyncio.gather(*self.writes, return_exceptions=True)


@dataclass(frozen=True)
class Runtime:
    """Every part of one run, made and not started. Nothing is assigned after ``build``;
    what a reload changes is in ``live`` (the config, policy, approvers and timeout at
    once), ``exposed`` and ``mcp``, and in the parts that are ``Reloadable``."""

    state_dir: Path
    environ: Mapping[str, str]  # the channels share it: a reload adds route secrets
    started_at: float
    masker: Masker
    store: Store
    reminders: ReminderService
    registry: ToolRegistry
    outlet: Outlet  # where the sending tools send, once the channels run
    exposed: Exposed
    mcp: McpSlot
    live: Live
    commands: CommandRegistry
    gate: ApprovalGate
    workspace: Path
    bus: Bus
    cluster: Cluster | None  # only on a shared store (several daemons)
    membership: InstanceMembership
    executor: CallExecutor
    brain: Brain
    media: MediaPreparer
    previews: Previews
    runner: TurnRunner
    delivery: DeliveryWorker
    dispatcher: Dispatcher
    scheduler: Scheduler
    access: StoreAccess
    housekeeping: Housekeeping
    # The brain's and the transcriber's HTTP clients, by name: closed at stop.
    clients: dict[str, Close] = field(default_factory=dict)

    @property
    def loaded(self) -> LoadedConfig:
        """The config running now (a reload replaces it with ``live``)."""
        return self.live.current.loaded

    async def start(
        self,
        parts: Parts,
        *,
        http: HttpServer | None = None,
        status: Callable[[str], None] = lambda _: None,
        wait_for_mcp: bool = False,
    ) -> None:
        """Start the core's parts into ``parts`` in order (the store is open already);
        they stop in the reverse when its stack closes. Channels come after."""
        config = self.loaded.config
        # Alive in the store before anything takes work: the leases of a shared store
        # are held for as long as this row is fresh.
        await parts.start("the instance row", self.membership.start, self.membership.stop)
        for name, close in self.clients.items():
            await parts.start(name, stop=close)
        if http is not None:
            admin_env = config.webhook.admin_token_env
            http.protect_health(self.masker, self.environ.get(admin_env, "") if admin_env else "")
            http.add_health("store", self.store.health)
            http.add_route("GET", "/metrics", self.metrics)
        # Before the turns: recovered ones may call their tools. Its stop looks at the
        # hub then: a reload may add the first server.
        await parts.start(
            "the MCP servers", partial(self.mcp.start, http, status, wait_for_mcp), self.mcp.stop
        )
        # Delivery before the turns, so it is still sending what they queue at stop.
        await parts.start("delivery", self.delivery.start, self.delivery.stop)
        grace = config.bot.shutdown_timeout.total_seconds()
        dispatcher = self.dispatcher
        await parts.start("the turns", dispatcher.start, partial(dispatcher.stop, grace))
        await parts.start("the scheduler", self.scheduler.start, self.scheduler.stop)
        if self.cluster is not None:
            self.store.on_wake(self._woken)
        await parts.start("housekeeping", self.housekeeping.start, self.housekeeping.stop)
        if http is not None:
            http.add_health("scheduler", self.scheduler.health)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Parts]:
        """Open the store, start the core's parts; stop them in reverse on the way out
        (``Daemon`` does the same with a store it waits for, and adds the channels)."""
        async with AsyncExitStack() as stack:
            parts = Parts(stack)
            await parts.start("the store", self.store.open, self.store.close)
            await self.start(parts)
            yield parts

    def check(self, loaded: LoadedConfig, environ: Mapping[str, str]) -> LiveSettings:
        """Validate a new config for ``reload`` (store-free; raises ``ConfigError``)."""
        return check(loaded, environ, state_dir=self.state_dir, reminders=self.reminders)

    async def reload(
        self,
        new: LiveSettings,
        environ: Mapping[str, str],
        *,
        channels: Sequence[Channel] = (),
    ) -> list[str]:
        """Apply a config ``check`` accepted: the policy, approvers and timeout at once,
        then every ``Reloadable`` part (one that refuses keeps its settings, logged),
        then the MCP servers. Returns the changes that need a restart."""
        old, config = self.loaded.config, new.loaded.config
        restart = restart_needed(old, config)
        if isinstance(self.environ, dict):  # channels share this mapping: new route secrets
            self.environ.update(environ)
        self.masker.add(environ.get(name, "") for name in secret_env_names(config))
        self.live.current = new
        for label, part in self._reloadables(channels):
            try:
                restart += part.reload(config)
            except ConfigError as exc:
                log.error("SIGHUP: %s not reloaded: %s", label, exc)
        if old.mcp != config.mcp:
            hub = self.mcp.hub_for([], config.mcp.max_tools)
            changes = await hub.reload(config.mcp.servers, config.mcp.max_tools)
            if changes:
                log.info("SIGHUP: MCP servers: %s", ", ".join(changes))
        return restart

    def _reloadables(self, channels: Sequence[Channel]) -> list[tuple[str, Reloadable]]:
        """The running parts that take a new config live, named for the log."""
        found: list[tuple[str, Reloadable]] = [
            ("the allowlists", self.access),
            ("the cron jobs", self.scheduler),
        ]
        found += [
            (f"the {c.name} channel", cast(Reloadable, c))
            for c in channels
            if c.capabilities.reloads
        ]
        found += [(f"the {t.name} tool", t) for t in self.registry if isinstance(t, Reloadable)]
        return found

    def argv_args(self, tool: str) -> tuple[str, ...]:
        """The arguments of ``tool`` that become a command line: as it declares; for an
        MCP server's tool not listed now, as the config says."""
        if self.registry.get(tool) is not None:
            return self.registry.argv_args(tool)
        hub = self.mcp.hub
        return hub.declared_argv(tool) if hub is not None else ()

    async def metrics(self, request: Any) -> Any:
        from aiohttp import web

        from . import metrics

        queues = await self.store.run(lambda tx: tx.meta.queue_counts())
        # Label values come from many places (tool names a model chose, …): mask them all.
        body = self.masker.mask(metrics.render(queues).decode()).encode()
        return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})

    def _woken(self, kinds: str) -> None:
        """Another daemon on the shared store committed work (LISTEN/NOTIFY)."""
        every = kinds == "*"  # the listener (re)connected: it may have missed some
        if every or "timezone" in kinds:
            self.reminders.forget_zones()
        if every or "inbound" in kinds:
            self.dispatcher.wake()
        if every or "outbound" in kinds:
            self.delivery.wake()
        if every or "reminder" in kinds:
            self.scheduler.wake()
        if every or "approval" in kinds:  # another daemon's request: when does it expire
            self.dispatcher.decisions.rearm()


def build(
    loaded: LoadedConfig,
    state_dir: Path,
    environ: Mapping[str, str],
    *,
    brain: Brain | None = None,
    started_at: float | None = None,
) -> Runtime:
    """The one place the daemon is made: validate everything that can be validated,
    make every part, start none (``brain`` replaces the configured one)."""
    config = loaded.config
    check_environment(loaded, environ, state_dir)
    masker = Masker.from_environment(secret_env_names(config), environ)
    workspace = workspace_of(config, state_dir)
    database = make_database(
        config.storage.engine,
        state_dir=state_dir,
        durability=config.bot.durability,
        url=environ.get(config.storage.url_env),
    )
    # The store knows this process by a name no other can have (leases are held by it);
    # [bot] instance is only the label people see (every machine may share one config).
    store = Store(database, masker, instance=process_instance())
    reminders = ReminderService(
        store,
        timezone=config.bot.timezone,
        languages=config.scheduler.languages,
        max_active=config.scheduler.max_active_per_chat,
    )
    outlet = Outlet()  # connected by the daemon once its channels run
    registry = tool_registry(loaded, state_dir, reminders, outlet)
    exposed = Exposed(registry, config.tools)
    mcp = McpSlot(registry, environ, exposed)
    if config.mcp.servers:
        mcp.hub_for(config.mcp.servers, config.mcp.max_tools)
    live = Live(settings(loaded, environ, registry))
    gate = ApprovalGate(live, masker, timezone=config.bot.timezone)
    commands = _commands(store, gate, reminders, live, config)
    thinks = llm_enabled(loaded, environ)
    register_model_command(commands, store, config.openai if thinks else None)

    async def history_view(session_key: str, newest: int | None) -> str:
        def read(tx: Tx) -> str:
            return history_text(tx, session_key, config.brain, limit=HISTORY_LIMIT, llm=thinks,
                                newest=newest)  # fmt: skip

        return await store.run(read)

    register_history_command(commands, history_view)
    clients: dict[str, Close] = {}
    started_at = time.time() if started_at is None else started_at
    membership = InstanceMembership(
        store, label=config.bot.instance or default_name(), started_at=started_at
    )
    cluster = Cluster(store, membership.name, label=membership.label) if store.shared else None
    fence = cluster.fence if cluster is not None else None
    queues = BusQueues(store)
    bus = Bus(queues, queues)
    executor = CallExecutor(
        store=store, registry=registry, gate=gate, live=live, masker=masker, fence=fence
    )
    brain = brain or _brain(loaded, environ, store, live, commands, bus, clients)
    inbox_dir = workspace / INBOX
    budget = MediaBudget(
        inbox_dir,
        daily_per_sender=config.media.daily_bytes_per_sender,
        inbox_max=config.media.inbox_max,
    )

    async def approver(message: MessageInbound) -> bool:  # exempt from the daily budget
        directory = live.current.directory
        return await store.run(
            lambda tx: directory.is_approver(tx, message.address, message.sender.id)
        )

    media = MediaPreparer(
        workspace,
        transcribe=_transcriber(config, environ, clients),
        budget=budget,
        exempt=approver,
    )
    previews = Previews(masker)
    runner = TurnRunner(
        store=store,
        brain=brain,
        commands=commands,
        registry=registry,
        exposed=exposed,
        executor=executor,
        media=media,
        previews=previews,
        fence=fence,
        masker=masker,
        config=config.brain,
    )
    if cluster is not None:  # what the runner keeps of a session holds while its lease does
        cluster.on_break(runner.history.forget)
    return Runtime(
        state_dir=state_dir,
        environ=environ,
        started_at=started_at,
        masker=masker,
        store=store,
        reminders=reminders,
        registry=registry,
        outlet=outlet,
        exposed=exposed,
        mcp=mcp,
        live=live,
        commands=commands,
        gate=gate,
        workspace=workspace,
        bus=bus,
        cluster=cluster,
        membership=membership,
        executor=executor,
        brain=brain,
        media=media,
        previews=previews,
        runner=runner,
        # Both subscribe to the store: new inbound runs, queued outbound is sent.
        delivery=DeliveryWorker(
            store=store, masker=masker, cluster=cluster, sending=previews.typing.stop_for
        ),
        dispatcher=Dispatcher(
            store=store,
            runner=runner,
            gate=gate,
            max_concurrent=config.bot.max_concurrent_turns,
            cluster=cluster,
        ),
        scheduler=Scheduler(
            store,
            bus,
            cron_jobs=config.cron,
            timezone=config.bot.timezone,
            grace=config.scheduler.grace,
            resync=SCHEDULE_RESYNC if cluster is not None else None,
        ),
        access=StoreAccess(store, config),
        housekeeping=Housekeeping(
            store, retention=config.storage.retention.total_seconds(), inbox=inbox_dir
        ),
        clients=clients,
    )


def _commands(
    store: Store, gate: ApprovalGate, reminders: ReminderService, live: Live, started: Config
) -> CommandRegistry:
    """The chat commands every channel shares."""
    commands = CommandRegistry()

    async def pending() -> list[Any]:
        return await store.run(lambda tx: tx.approvals.list())

    async def reset(session_key: str) -> None:
        def fresh(tx: Tx) -> None:
            tx.turns.reset_session(session_key)
            tx.summaries.drop(session_key)  # it summarised the conversation left behind

        await store.run(fresh)

    async def reprompt(row: ApprovalRow) -> OutboundMessage:
        return await store.run(lambda tx: gate.reprompt(tx, row))

    register_core_commands(commands, pending, reprompt, reset, reminders.timezone_for)
    register_console_command(commands, store, live, started, reminders.timezone_for)
    register_reminder_commands(commands, reminders)
    register_memory_commands(commands, MemoryNotes(store))
    return commands


def _brain(
    loaded: LoadedConfig,
    environ: Mapping[str, str],
    store: Store,
    live: Live,
    commands: CommandRegistry,
    bus: Bus,
    clients: dict[str, Close],
) -> Brain:
    """The rules brain; with a model configured, the model first and rules when it fails."""
    rules = RulesBrain(commands)
    config = loaded.config
    if not llm_enabled(loaded, environ):
        return rules
    from .brains.openai_brain import OpenAIBrain
    from .brains.routed import RoutedBrain

    llm = OpenAIBrain(config.openai, config.brain, environ.get(config.openai.api_key_env))
    clients["the model's client"] = llm.close

    async def usage_since(ts: float) -> int:
        return await store.run(lambda tx: tx.audit.tokens_since(ts), slow=True)

    async def notify(text: str, context: BrainContext) -> None:
        to = live.current.directory.default_chat or context.origin
        await bus.send(OutboundMessage(to=to, text=text, kind=OutboundKind.NOTICE))

    return RoutedBrain(
        llm,
        rules,
        fallback_after=config.brain.fallback_after,
        probe_interval=config.brain.probe_interval.total_seconds(),
        daily_token_budget=config.openai.daily_token_budget,
        usage_since=usage_since,
        notify=notify,
        timezone=config.bot.timezone,
    )


def _transcriber(
    config: Config, environ: Mapping[str, str], clients: dict[str, Close]
) -> Transcribe | None:
    openai = config.openai
    if openai.transcription_model is None:
        return None
    from .media.transcribe import Transcriber

    transcriber = Transcriber(openai, environ.get(openai.api_key_env))
    clients["the transcription client"] = transcriber.close
    return transcriber


def brain_label(brain: Brain, config: Config) -> str:
    """The brain in the words ``check-config`` uses: ``llm (MODEL)`` (the model first,
    rules when it fails) or ``rules``."""
    if brain.name in {"openai", "routed"}:
        return f"llm ({config.openai.model})"
    return brain.name
