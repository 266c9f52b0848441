"""The composition root: builds every part from the config, starts them in order and
stops them in reverse. The only module that knows the channel registry."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .access import StoreAccess
from .agent import Dispatcher, TurnRunner
from .agent.calls import CallExecutor
from .brains.base import Brain, BrainContext
from .brains.rules import RulesBrain
from .bus import Bus, Channel, ChannelSetup, MediaSource, PreviewSink
from .cluster import BEAT, Cluster
from .commands import CommandRegistry
from .config import (
    Config,
    TelegramConfig,
    llm_enabled,
    load_config,
    secret_env_names,
    with_credentials,
)
from .core import Core, build_core
from .delivery import DeliveryWorker
from .errors import ConfigError, StoreUnavailable, log_retrying
from .events import Address, OutboundKind, OutboundMessage
from .media.inbound import MediaPreparer, Transcribe
from .previews import Previews
from .reminders import ReminderService
from .scheduler import Scheduler
from .sdnotify import Notifier
from .statedir import StateLock
from .store import SqliteInbox, SqliteOutbox, Store, Tx
from .store.meta import InstanceRow
from .tools.builtin.messaging import ChatSender

if TYPE_CHECKING:  # aiohttp is imported only when the server is needed
    from .http import HttpServer

log = logging.getLogger(__name__)

# While the store cannot be reached at start: wait this long, doubling up to the second.
STORE_RETRY_FIRST = 1.0
STORE_RETRY_MAX = 30.0
# How often a daemon refreshes its row in `instances` (`status` counts one unseen for
# three beats as gone: admin.INSTANCE_GONE_AFTER).
INSTANCE_BEAT = BEAT
# The longest READY waits for the MCP servers' first connection; slower ones go on
# connecting in the background (their tools appear when they are listed).
MCP_START_BOUND = 5.0
# With several daemons on one store: how often reminders set elsewhere are looked for.
SCHEDULE_RESYNC = 15.0

# name → "module:Class", imported only when the channel is enabled.
CHANNELS: dict[str, str] = {
    "cli": "channels.cli:CliChannel",
    "telegram": "channels.telegram:TelegramChannel",
    "webhook": "channels.webhook:WebhookChannel",
}


def boot_id() -> str:
    """This machine's current boot and this process's pid namespace ('' where the kernel
    does not say): two daemons with the same one see each other's pids (containers on one
    host share the boot, not the pids)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pids = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{pids}"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def http_reasons(config: Config, channel_names: Sequence[str]) -> list[str]:
    """Why the HTTP server (and its port) is needed; empty: it is not started.

    Webhooks and Telegram webhook mode need it; Telegram polling does not, so /healthz
    and /metrics alone are asked for with ``[http] enabled = true``.
    """
    reasons = []
    if "webhook" in channel_names:
        reasons.append("webhooks")
    if "telegram" in channel_names and config.telegram.mode == "webhook":
        reasons.append("Telegram webhook mode")
    if config.http.enabled:
        reasons.append("[http] enabled")
    return reasons


def load_channel_class(name: str) -> type[Channel]:
    target = CHANNELS.get(name)
    if target is None:
        raise ConfigError(f"the {name} channel is not available in echo-bot {__version__}")
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)  # type: ignore[no-any-return]


def brain_label(brain: Brain, config: Config) -> str:
    """The brain in the words ``check-config`` uses: ``llm (MODEL)`` (the model first,
    rules when it fails) or ``rules``."""
    if brain.name in {"openai", "routed"}:
        return f"llm ({config.openai.model})"
    return brain.name


class Daemon:
    """``echo-bot run`` and ``echo-bot chat``: one process that holds the state dir."""

    def __init__(
        self,
        core: Core,
        *,
        channel_names: list[str],
        channel_options: Mapping[str, Mapping[str, Any]] | None = None,
        environ: Mapping[str, str] | None = None,
        banner: bool = True,
        extra_channels: Sequence[Channel] = (),
        brain: Brain | None = None,
        freeze_heap: bool = False,
    ) -> None:
        self.core = core
        self.channel_names = channel_names
        self.channel_options = channel_options or {}
        self.environ = os.environ if environ is None else environ
        self.banner = banner
        # Only a process of its own (the CLI) sets it: it affects the whole interpreter.
        self.freeze_heap = freeze_heap
        self.channels: list[Channel] = []
        self.extra_channels = list(extra_channels)
        self._brain = brain
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self.bus: Bus | None = None
        self.http: HttpServer | None = None
        self.scheduler: Scheduler | None = None
        self.notifier = Notifier(self.environ)
        self._housekeeping: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._stopping_mcp = False
        self._reload_lock = asyncio.Lock()
        self._mcp_writes: set[asyncio.Task[None]] = set()
        self._instance_row: InstanceRow | None = None
        self._reloads: set[asyncio.Task[list[str]]] = set()
        self._live: dict[str, Any] = {}
        self._started = asyncio.Event()
        self._stop = asyncio.Event()
        self._signals = 0
        self.exit_code = 0
        self.started_at = time.time()

    async def wait_started(self) -> Bus:
        await self._started.wait()
        assert self.bus is not None
        return self.bus

    def request_stop(self, exit_code: int = 0) -> None:
        """End the daemon; a channel may set the exit status (the terminal chat: 141
        when its output closed, as a process killed by SIGPIPE reports)."""
        self.exit_code = max(self.exit_code, exit_code)
        self._stop.set()

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals > 1:
            # A second signal: leave now. SQLite's WAL keeps the store consistent.
            os._exit(130)
        self.request_stop()

    def _build_brain(self, commands: CommandRegistry, bus: Bus) -> Brain:
        if self._brain is not None:
            return self._brain
        rules = RulesBrain(commands)
        core, config = self.core, self.core.loaded.config
        if not llm_enabled(core.loaded, self.environ):
            return rules
        from .brains.openai_brain import OpenAIBrain
        from .brains.routed import RoutedBrain

        llm = OpenAIBrain(config.openai, config.brain, self.environ.get(config.openai.api_key_env))
        self._closers.append(llm.close)

        async def usage_since(ts: float) -> int:
            return await core.store.run(lambda tx: tx.audit.tokens_since(ts), slow=True)

        async def notify(text: str, context: BrainContext) -> None:
            to = core.directory.default_chat or context.origin
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

    def _build_transcriber(self) -> Transcribe | None:
        openai = self.core.loaded.config.openai
        if openai.transcription_model is None:
            return None
        from .media.transcribe import Transcriber

        transcriber = Transcriber(openai, self.environ.get(openai.api_key_env))
        self._closers.append(transcriber.close)
        return transcriber

    async def run(self) -> int:
        self.started_at = time.time()
        core = self.core
        config = core.loaded.config
        lock = StateLock(core.state_dir)
        lock.acquire()
        try:
            # The port first: when it is taken, nothing else has started (exit code 2).
            http = await self._bind_http(config)
            try:
                return await self._run_locked(config, http)
            finally:
                if http is not None:
                    await http.stop()  # a no-op when _run_locked stopped it in order
        finally:
            lock.release()

    async def _open_store(self, http: HttpServer | None) -> bool:
        """Open the store; while it cannot be reached (PostgreSQL down or far), wait and
        try again (1 s, doubling to 30 s) with /healthz and every request answered 503.
        False when asked to stop meanwhile; a refusal that waiting cannot mend (a wrong
        password, no such database) is raised: one line, exit code 2."""
        pause = STORE_RETRY_FIRST
        while True:
            try:
                await self.core.store.open()
                return True
            except StoreUnavailable as exc:
                log.warning("the store is unavailable (%s); trying again in %.0f s", exc, pause)
                self.notifier.status("waiting for the store")
                if http is not None:
                    http.serve_not_ready("store")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), pause)
            if self._stop.is_set():
                return False
            pause = min(pause * 2, STORE_RETRY_MAX)

    async def _bind_http(self, config: Config) -> HttpServer | None:
        if not http_reasons(config, self.channel_names):
            if "telegram" in self.channel_names:  # it used to open one in polling mode
                log.info(
                    "Telegram polls: no HTTP server and no port ([http] enabled = true"
                    " serves /healthz and /metrics)"
                )
            return None
        from .http import HttpServer

        http = HttpServer(config.http, client_max_size=config.webhook.max_body)
        await http.bind()
        return http

    async def _run_locked(self, config: Config, http: HttpServer | None) -> int:
        core = self.core
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        self.notifier.status("opening the store")
        if not await self._open_store(http):  # asked to stop while it waited for it
            await core.store.close()
            return self.exit_code
        # Alive in the store before anything takes work: the leases of a shared store
        # are held for as long as this row is fresh.
        await core.store.run(self._register_instance)
        self._heartbeat = asyncio.create_task(self._beat(), name="instance-heartbeat")
        cluster = Cluster(core.store, self._instance_name()) if core.store.shared else None
        inbox, outbox = SqliteInbox(core.store), SqliteOutbox(core.store)
        bus = Bus(inbox, outbox)
        gate = core.gate
        executor = CallExecutor(
            store=core.store,
            registry=core.registry,
            policy=core.policy,
            gate=gate,
            directory=core.directory,
            masker=core.masker,
            fence=cluster.fence if cluster is not None else None,
        )
        brain = self._build_brain(core.commands, bus)
        media = MediaPreparer(core.workspace, transcribe=self._build_transcriber())
        previews = Previews(core.masker)
        runner = TurnRunner(
            store=core.store,
            brain=brain,
            registry=core.registry,
            exposed=lambda: core.exposed,
            executor=executor,
            media=media,
            previews=previews,
            fence=cluster.fence if cluster is not None else None,
            masker=core.masker,
            config=config.brain,
        )
        # Both subscribe to the store: new inbound runs, queued outbound is sent.
        delivery = DeliveryWorker(outbox, store=core.store, masker=core.masker, cluster=cluster)
        dispatcher = Dispatcher(
            store=core.store,
            inbox=inbox,
            runner=runner,
            gate=gate,
            max_concurrent=config.bot.max_concurrent_turns,
            cluster=cluster,
        )
        commands = [(c.name, c.help) for c in core.commands.all()]
        if http is not None:
            admin_env = config.webhook.admin_token_env
            http.protect_health(core.masker, self.environ.get(admin_env, "") if admin_env else "")
            http.add_health("store", core.store.health)
            http.add_route("GET", "/metrics", self._metrics)
        access = StoreAccess(core.store, config)
        self._live = {"executor": executor, "gate": gate, "access": access}

        async def channel_audit(event: str, **data: Any) -> None:
            await core.store.run(
                lambda tx: tx.audit.write(event, trace_id=None, session_key=None, **data)
            )

        try:
            if core.mcp is not None:  # before the turns: recovered ones may call their tools
                self.notifier.status("starting MCP servers")
                await core.mcp.start(bound=MCP_START_BOUND)
                if http is not None:
                    http.add_health("mcp", core.mcp.health)
            await dispatcher.start()
            await delivery.start()
            scheduler = Scheduler(
                core.store,
                bus,
                cron_jobs=config.cron,
                timezone=config.bot.timezone,
                grace=config.scheduler.grace,
                resync=SCHEDULE_RESYNC if cluster is not None else None,
            )
            await scheduler.start()
            self.scheduler = scheduler
            if cluster is not None:
                core.store.on_wake(
                    partial(self._woken, dispatcher, delivery, scheduler, core.reminders)
                )
            self._housekeeping = asyncio.create_task(
                self._prune_daily(config.storage.retention.total_seconds())
            )
            if http is not None:
                http.add_health("scheduler", scheduler.health)
            self.notifier.status("starting channels")
            to_start: list[Channel] = []
            for name in self.channel_names:
                cls = load_channel_class(name)
                setup = ChannelSetup(
                    section=getattr(config, name, None),
                    request_stop=self.request_stop,
                    environ=self.environ,
                    commands=commands,
                    options=self.channel_options.get(name, {}),
                    access=access,
                    http=http,
                    audit=channel_audit,
                    pending_prompts=self._pending_prompts,
                    started_at=self.started_at,
                    detach=partial(delivery.remove_channel, name),
                    hold=partial(self._hold, cluster) if cluster is not None else None,
                    recall=partial(self._recall, core.store),
                    remember=partial(self._remember, core.store),
                    stop_generation=previews.stop,
                )
                to_start.append(cls(setup))
            for channel in to_start + self.extra_channels:
                await channel.start(bus)
                self.channels.append(channel)
                delivery.add_channel(channel)
                if isinstance(channel, MediaSource):
                    media.add_source(channel)
                if isinstance(channel, PreviewSink):
                    previews.add_sink(channel)
            if http is not None:
                await http.start()
                self.http = http
            running = frozenset(c.name for c in self.channels)
            self._warn_unreachable(config, running)
            for tool in core.registry:
                if isinstance(tool, ChatSender):
                    tool.bind(bus.send, running)
            self.bus = bus
            self._started.set()
            info = {
                "pid": os.getpid(),
                "started_at": time.time(),
                "version": __version__,
                "channels": [c.name for c in self.channels],
                "brain": brain_label(brain, config),
            }
            await core.store.run(lambda tx: self._started_here(tx, info))
            if core.mcp is not None:
                self._record_mcp(info)
                core.mcp.on_state = partial(self._record_mcp, info)
            self.notifier.ready(
                f"running: brain {brain_label(brain, config)}; "
                f"channels {', '.join(self.channel_names) or 'none'}"
            )
            self.notifier.start_watchdog()
            if self.freeze_heap:
                # What start-up made lives as long as the process: out of the cyclic
                # collector's sight, a full collection no longer walks it each time
                # (under a webhook flood: 0.8 s of 12 s in full collections, pauses up to
                # 77 ms; after this, 0.07 s).
                gc.collect()
                gc.freeze()
            if self.banner:
                self._print_banner(brain_label(brain, config))
            for channel in self.channels:  # optional: what a channel shows once all is up
                ready = getattr(channel, "ready", None)
                if ready is not None:
                    await ready()
            log.info("echo-bot %s started (state dir %s)", __version__, core.state_dir)
            await self._stop.wait()
        finally:
            log.info("stopping")
            self.notifier.stopping()
            for channel in reversed(self.channels):
                with contextlib.suppress(Exception):
                    await channel.stop()
            if http is not None:
                await http.stop()
            if self._housekeeping is not None:
                self._housekeeping.cancel()
                await asyncio.gather(self._housekeeping, return_exceptions=True)
            if self.scheduler is not None:
                await self.scheduler.stop()
            await dispatcher.stop(config.bot.shutdown_timeout.total_seconds())
            await delivery.stop()
            if core.mcp is not None:
                self._stopping_mcp = True
                await core.mcp.stop()
                await asyncio.gather(*self._mcp_writes, return_exceptions=True)
            for close in self._closers:
                with contextlib.suppress(Exception):
                    await close()
            # Alive (and holding its leases) until its turns and sends are done: then it
            # leaves the list of live daemons, and its leases are free at once.
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                await asyncio.gather(self._heartbeat, return_exceptions=True)
            if self._instance_row is not None:
                name = self._instance_row.name
                with contextlib.suppress(Exception):
                    await core.store.run(lambda tx: tx.meta.instance_gone(name))
            await core.store.close()
            await self.notifier.close()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        return self.exit_code

    async def _pending_prompts(self, to: Address) -> list[OutboundMessage]:
        gate = self.core.gate

        def read(tx: Tx) -> list[OutboundMessage]:
            now = gate.clock()
            return [
                gate.reprompt(tx, row)
                for row in tx.approvals.pending_for(str(to))
                if not row.expired_at(now)
            ]

        return await self.core.store.run(read)

    @staticmethod
    def _warn_unreachable(config: Config, running: frozenset[str]) -> None:
        """Results for a channel that is not running wait in the outbox: say so."""
        targets = [(f"webhook route {r.name}", r.deliver_to) for r in config.webhook.routes]
        targets += [(f"cron job {j.name}", j.deliver_to) for j in config.cron]
        targets.append(("[approvals] default_chat", config.approvals.default_chat))
        for what, address in targets:
            channel = address.split(":", 1)[0] if address else None
            if channel and channel not in running:
                log.warning(
                    "%s delivers to %s, but the %s channel is not running here; its"
                    " messages wait in the outbox until it does",
                    what,
                    address,
                    channel,
                )

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        from . import metrics

        queues = await self.core.store.run(lambda tx: tx.meta.queue_counts())
        # Label values come from many places (tool names a model chose, …): mask them all.
        body = self.core.masker.mask(metrics.render(queues).decode()).encode()
        return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})

    def _record_mcp(self, info: dict[str, Any]) -> None:
        """Keep the MCP servers' states with the daemon's facts in the store (`status`
        reads them there; state changes are rare)."""
        hub = self.core.mcp
        if hub is None or self._stopping_mcp:
            return

        async def write() -> None:
            info["mcp"] = hub.summary()  # the newest, whichever write runs last
            with contextlib.suppress(Exception):  # it is refreshed at the next change
                await self.core.store.run(lambda tx: tx.meta.set_daemon_info(info))

        task = asyncio.create_task(write())
        self._mcp_writes.add(task)
        task.add_done_callback(self._mcp_writes.discard)

    async def _reload_mcp(self, new: Config) -> None:
        core = self.core
        if core.mcp is None:  # the first server of this run
            from .mcp.hub import McpHub

            core.mcp = McpHub([], core.registry, self.environ)
            tools = new.tools

            def expose() -> None:
                core.exposed = core.registry.exposed(tools.profile, tools.allow, tools.deny)

            core.mcp.on_change = expose
            if self.http is not None:
                self.http.add_health("mcp", core.mcp.health)
        changes = await core.mcp.reload(new.mcp.servers)
        if changes:
            log.info("SIGHUP: MCP servers: %s", ", ".join(changes))

    def _on_hup(self) -> None:
        task = asyncio.create_task(self.reload())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def reload(self) -> list[str]:
        """SIGHUP: re-read the config file. Routes, cron jobs, allowlists, approvers, the
        approval policy and MCP servers change live; anything else is reported as
        needing a restart.
        A bad file changes nothing. Two signals in a row reload one after the other."""
        async with self._reload_lock:
            return await self._reload()

    async def _reload(self) -> list[str]:
        core = self.core
        if core.loaded.path is None:
            log.info("SIGHUP: running on embedded defaults; there is no file to reload")
            return []
        try:
            loaded = load_config(core.loaded.path)
            environ = with_credentials(loaded.config, self.environ)
            trial = build_core(loaded, core.state_dir, environ)
        except ConfigError as exc:
            log.error("SIGHUP: the config was not reloaded, the running one stays:\n%s", exc)
            self.notifier.status("config reload failed; running on the previous config")
            return []
        old, new = core.loaded.config, loaded.config
        live_telegram = {"allowed_users", "approvers"}
        restart = [
            name
            for name in Config.model_fields
            if name not in {"approvals", "webhook", "cron", "telegram", "tools", "mcp"}
            and getattr(old, name) != getattr(new, name)
        ]
        restart += [
            f"telegram.{key}"
            for key in TelegramConfig.model_fields
            if key not in live_telegram and getattr(old.telegram, key) != getattr(new.telegram, key)
        ]
        if old.tools.model_copy(update={"shell": new.tools.shell}) != new.tools or (
            old.tools.shell.enabled != new.tools.shell.enabled
        ):
            restart.append("tools")
        shell = core.registry.get("shell_exec")
        if shell is not None and hasattr(shell, "configure"):
            shell.configure(new.tools.shell)  # allow_commands, timeout, output cap: live
        if isinstance(self.environ, dict):  # channels share this mapping: new route secrets
            self.environ.update(environ)
        core.masker.add(environ.get(name, "") for name in secret_env_names(new))
        executor, gate = self._live["executor"], self._live["gate"]
        executor.policy = trial.policy
        executor.directory = gate.directory = core.directory = trial.directory
        gate.timeout = new.approvals.timeout
        self._live["access"].configure(new)
        for channel in self.channels:
            reload_channel = getattr(channel, "reload", None)
            if reload_channel is not None and channel.name == "webhook":
                try:
                    restart += reload_channel(new.webhook)
                except ConfigError as exc:
                    log.error("SIGHUP: webhook routes not reloaded: %s", exc)
        if self.scheduler is not None and old.cron != new.cron:
            self.scheduler.reload_cron(new.cron)
        if old.mcp != new.mcp:
            await self._reload_mcp(new)
        core.loaded = loaded
        log.info(
            "SIGHUP: config reloaded (routes, cron jobs, allowlists, approvers, approval policy)%s",
            f"; needs restart to apply: {', '.join(restart)}" if restart else "",
        )
        self.notifier.status(
            "config reloaded" + (" (some changes need a restart)" if restart else "")
        )
        return restart

    @staticmethod
    def _woken(
        dispatcher: Dispatcher,
        delivery: DeliveryWorker,
        scheduler: Scheduler,
        reminders: ReminderService,
        kinds: str,
    ) -> None:
        """Another daemon on the shared store committed work (LISTEN/NOTIFY)."""
        every = kinds == "*"  # the listener (re)connected: it may have missed some
        if every or "timezone" in kinds:
            reminders.forget_zones()
        if every or "inbound" in kinds:
            dispatcher.wake()
        if every or "outbound" in kinds:
            delivery.wake()
        if every or "reminder" in kinds:
            scheduler.wake()

    @staticmethod
    async def _recall(store: Store, name: str) -> tuple[int, float] | None:
        return await store.run(lambda tx: tx.meta.position(name))

    @staticmethod
    async def _remember(store: Store, name: str, value: int) -> None:
        await store.run(lambda tx: tx.meta.set_position(name, value))

    @staticmethod
    async def _hold(cluster: Cluster, name: str, within: float) -> bool:
        """What a channel asks before its one-daemon-at-a-time work (the poller)."""
        return await cluster.take(name, within=within)

    def _instance_name(self) -> str:
        """This process's unique name in the store (what holds its leases)."""
        return self.core.store.instance or f"{socket.gethostname()}-{os.getpid()}"

    def _instance_label(self) -> str:
        """What people see: ``[bot] instance``, else host-pid."""
        return self.core.loaded.config.bot.instance or f"{socket.gethostname()}-{os.getpid()}"

    def _register_instance(self, tx: Tx) -> None:
        boot = boot_id()
        for other in tx.meta.instances():
            # A daemon of this machine's current boot whose process is gone (killed,
            # crashed) gives up its leases at once, not after the lease time: a restart
            # goes on with its sessions without waiting.
            mine = boot and other.boot_id == boot and other.pid != os.getpid()
            if mine and not process_alive(other.pid):
                tx.meta.instance_gone(other.name)
        row = InstanceRow(
            name=self._instance_name(),
            label=self._instance_label(),
            host=socket.gethostname(),
            boot_id=boot,
            pid=os.getpid(),
            version=__version__,
            started_at=self.started_at,
            seen_at=time.time(),
        )
        tx.meta.instance_seen(row)
        tx.on_commit(lambda: setattr(self, "_instance_row", row))

    def _started_here(self, tx: Tx, info: dict[str, Any]) -> None:
        tx.meta.set_daemon_info(info)
        tx.audit.write(
            "daemon.started",
            trace_id=None,
            session_key=None,
            instance=self._instance_label(),
            version=__version__,
            channels=info["channels"],
        )

    async def _beat(self) -> None:
        """Refresh this daemon's row in ``instances`` (``status`` lists the live ones)."""
        while True:
            await asyncio.sleep(INSTANCE_BEAT)
            row = self._instance_row
            if row is None:
                continue
            seen = replace(row, seen_at=time.time())
            try:
                await self.core.store.run(partial(_instance_seen, seen=seen))
            except Exception:  # the store may be away for a while: next beat
                log_retrying(log, "refreshing this daemon's instance row failed")

    async def _prune_daily(self, retention: float) -> None:
        """Prune finished work older than the retention, at start and then daily."""
        while True:
            try:
                counts = await self._prune(before=time.time() - retention)
                if any(counts.values()):
                    log.info("pruned finished work older than the retention: %s", counts)
            except Exception:  # housekeeping must never stop the daemon
                log.exception("pruning failed; trying again tomorrow")
            await asyncio.sleep(86400)

    async def _prune(self, before: float) -> dict[str, int]:
        """Delete finished rows last touched before ``before``: a slow transaction."""
        return await self.core.store.run(lambda tx: tx.meta.prune(before), slow=True)

    def _print_banner(self, brain: str) -> None:
        core = self.core
        channels = ", ".join(self.channel_names) or "none (no terminal attached)"
        source = core.loaded.path or "embedded defaults"
        chat = "; /help lists commands" if "cli" in self.channel_names else ""
        print(
            f"echo-bot {__version__} — config: {source}; brain: {brain}; channels: {channels}\n"
            f"state: {core.store.describe()}\n"
            f"stop with Ctrl+C or `kill {os.getpid()}`{chat}",
            file=sys.stderr,
            flush=True,
        )


def _instance_seen(tx: Tx, seen: InstanceRow) -> None:
    tx.meta.instance_seen(seen)
