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
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from . import __version__
from .brains.base import Brain
from .bus import Bus, Channel
from .channel_host import DaemonHost, show_when_ready, start_channels
from .config import Config, load_config, secret_env_names, with_credentials
from .core import Core, build_core
from .errors import ConfigError, StoreUnavailable
from .housekeeping import warn_unreachable
from .lifecycle import Parts
from .live import Reloadable, restart_needed
from .logs import log_retrying
from .runtime import Runtime, brain_label, wire
from .scheduling.reminders import ReminderService
from .scheduling.scheduler import Scheduler
from .sdnotify import Notifier
from .statedir import StateLock
from .store import Tx
from .tools.builtin.messaging import ChatSender

if TYPE_CHECKING:  # aiohttp is imported only when the server is needed
    from .http import HttpServer

log = logging.getLogger(__name__)

# While the store cannot be reached at start: wait this long, doubling up to the second.
STORE_RETRY_FIRST = 1.0
STORE_RETRY_MAX = 30.0
# The longest READY waits for the MCP servers' first connection; slower ones go on
# connecting in the background (their tools appear when they are listed).
MCP_START_BOUND = 5.0

# name → "module:Class", imported only when the channel is enabled.
CHANNELS: dict[str, str] = {
    "cli": "channels.cli:CliChannel",
    "telegram": "channels.telegram:TelegramChannel",
    "webhook": "channels.webhook:WebhookChannel",
}


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
        wait_for_mcp: bool = False,
    ) -> None:
        self.core = core
        self.channel_names = channel_names
        self.channel_options = channel_options or {}
        self.environ = os.environ if environ is None else environ
        self.banner = banner
        # Only a process of its own (the CLI) sets it: it affects the whole interpreter.
        self.freeze_heap = freeze_heap
        self.extra_channels = list(extra_channels)
        # A piped chat: its first line may call an MCP tool, and nobody types it again
        # later. Wait for each server's first attempt, as long as that may take.
        self.wait_for_mcp = wait_for_mcp
        self._brain = brain
        self.runtime: Runtime | None = None  # the parts, once wired
        self.channels: list[Channel] = []  # the started ones, in start order
        self.bus: Bus | None = None
        self.http: HttpServer | None = None
        self.notifier = Notifier(self.environ)
        self._stopping_mcp = False
        self._reload_lock = asyncio.Lock()
        self._mcp_writes: set[asyncio.Task[None]] = set()
        self._reloads: set[asyncio.Task[list[str]]] = set()
        self._started = asyncio.Event()
        self._stop = asyncio.Event()
        self._signals = 0
        self.exit_code = 0
        self.started_at = time.time()

    @property
    def scheduler(self) -> Scheduler | None:
        return self.runtime.scheduler if self.runtime is not None else None

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
        """Start every part in order, wait for the stop, stop them in reverse: each part
        is entered into one exit stack as it starts (``lifecycle.Parts``)."""
        async with contextlib.AsyncExitStack() as stack:
            self._catch_signals(stack)
            stack.push_async_callback(self.notifier.close)
            self.notifier.status("opening the store")
            if not await self._open_store(http):  # asked to stop while it waited for it
                await self.core.store.close()
                return self.exit_code
            parts = Parts(stack)
            await parts.start("the store", stop=self.core.store.close)
            try:
                await self._start(parts, config, http)
                await self._stop.wait()
            finally:
                log.info("stopping")
                self.notifier.stopping()
        return self.exit_code

    def _catch_signals(self, stack: contextlib.AsyncExitStack) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            stack.callback(loop.remove_signal_handler, sig)

    async def _start(self, parts: Parts, config: Config, http: HttpServer | None) -> None:
        core = self.core
        rt = self.runtime = wire(core, self.environ, started_at=self.started_at, brain=self._brain)
        # Alive in the store before anything takes work: the leases of a shared store
        # are held for as long as this row is fresh.
        await parts.start("the instance row", rt.membership.start, rt.membership.stop)
        for name, close in rt.clients.items():
            await parts.start(name, stop=close)
        if http is not None:
            admin_env = config.webhook.admin_token_env
            http.protect_health(core.masker, self.environ.get(admin_env, "") if admin_env else "")
            http.add_health("store", core.store.health)
            http.add_route("GET", "/metrics", self._metrics)
        # Before the turns: recovered ones may call their tools. Its stop looks at the
        # hub then: a reload may add the first server.
        await parts.start("the MCP servers", partial(self._start_mcp, http), self._stop_mcp)
        # Delivery before the turns, so it is still sending what they queue at stop.
        await parts.start("delivery", rt.delivery.start, rt.delivery.stop)
        grace = config.bot.shutdown_timeout.total_seconds()
        await parts.start("the turns", rt.dispatcher.start, partial(rt.dispatcher.stop, grace))
        await parts.start("the scheduler", rt.scheduler.start, rt.scheduler.stop)
        if rt.cluster is not None:
            core.store.on_wake(partial(_woken, rt, core.reminders))
        await parts.start("housekeeping", rt.housekeeping.start, rt.housekeeping.stop)
        if http is not None:
            http.add_health("scheduler", rt.scheduler.health)
        self.notifier.status("starting channels")
        await start_channels(
            parts,
            self._make_channels(config, rt, http) + self.extra_channels,
            bus=rt.bus,
            delivery=rt.delivery,
            media=rt.media,
            previews=rt.previews,
            started=self.channels,
        )
        if http is not None:
            await parts.start("the HTTP server", http.start, http.stop)
            self.http = http
        running = frozenset(c.name for c in self.channels)
        warn_unreachable(config, running)
        for tool in core.registry:
            if isinstance(tool, ChatSender):
                tool.bind(rt.bus.send, running)
        self.bus = rt.bus
        self._started.set()
        await self._announce(rt, config)
        await show_when_ready(self.channels)
        log.info(
            "echo-bot %s started as %s (state dir %s)",
            __version__,
            rt.membership.label,
            core.state_dir,
        )

    def _make_channels(self, config: Config, rt: Runtime, http: HttpServer | None) -> list[Channel]:
        """Every configured channel, made before any starts (a bad token fails them all)."""
        host = DaemonHost(
            bus=rt.bus,
            store=self.core.store,
            access=rt.access,
            gate=self.core.gate,
            masker=self.core.masker,
            environ=self.environ,
            commands=[(c.name, c.help) for c in self.core.commands.all()],
            started_at=self.started_at,
            http=http,
            cluster=rt.cluster,
            delivery=rt.delivery,
            previews=rt.previews,
            timezone_for=self.core.reminders.timezone_for,
            argv_args=self._argv_args,
            request_stop=self.request_stop,
        )
        return [
            load_channel_class(name)(
                getattr(config, name, None), self.channel_options.get(name, {}), host
            )
            for name in self.channel_names
        ]

    async def _announce(self, rt: Runtime, config: Config) -> None:
        """Up: the daemon's facts in the store, READY to systemd, the banner."""
        core = self.core
        label = brain_label(rt.brain, config)
        info = {
            "pid": os.getpid(),
            "started_at": time.time(),
            "version": __version__,
            "channels": [c.name for c in self.channels],
            "brain": label,
            "instance": rt.membership.label,
        }
        await core.store.run(lambda tx: self._started_here(tx, info, rt.membership.label))
        if core.mcp is not None:
            self._record_mcp(info)
            core.mcp.on_state = partial(self._record_mcp, info)
        self.notifier.ready(
            f"running: brain {label}; channels {', '.join(self.channel_names) or 'none'}"
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
            self._print_banner(label)

    def _argv_args(self, tool: str) -> tuple[str, ...]:
        """The arguments of ``tool`` that become a command line: as it declares; for an
        MCP server's tool not listed now, as the config says."""
        core = self.core
        if core.registry.get(tool) is not None:
            return core.registry.argv_args(tool)
        return core.mcp.declared_argv(tool) if core.mcp is not None else ()

    async def _start_mcp(self, http: HttpServer | None) -> None:
        hub = self.core.mcp
        if hub is None:
            return
        self.notifier.status("starting MCP servers")
        if not self.wait_for_mcp:
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

    async def _stop_mcp(self) -> None:
        hub = self.core.mcp
        if hub is None:
            return
        self._stopping_mcp = True
        await hub.stop()
        await asyncio.gather(*self._mcp_writes, return_exceptions=True)

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
            try:
                await self.core.store.run(lambda tx: tx.meta.set_daemon_info(info))
            except Exception:  # it is written again at the next change
                log_retrying(log, "recording the MCP servers' states failed")

        task = asyncio.create_task(write())
        self._mcp_writes.add(task)
        task.add_done_callback(self._mcp_writes.discard)

    async def _reload_mcp(self, new: Config) -> None:
        core = self.core
        if core.mcp is None:  # the first server of this run
            from .mcp.hub import McpHub

            core.mcp = McpHub([], core.registry, self.environ, max_tools=new.mcp.max_tools)
            tools = new.tools

            def expose() -> None:
                core.exposed = core.registry.exposed(tools.profile, tools.allow, tools.deny)

            core.mcp.on_change = expose
            if self.http is not None:
                self.http.add_health("mcp", core.mcp.health)
        changes = await core.mcp.reload(new.mcp.servers, new.mcp.max_tools)
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
        if not self._started.is_set():
            log.info("SIGHUP while starting: ignored; send it again once started")
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
        restart = restart_needed(old, new)
        if isinstance(self.environ, dict):  # channels share this mapping: new route secrets
            self.environ.update(environ)
        core.masker.add(environ.get(name, "") for name in secret_env_names(new))
        core.live.current = trial.live.current  # the policy, approvers and timeout at once
        for label, part in self._reloadables():
            try:
                restart += part.reload(new)
            except ConfigError as exc:
                log.error("SIGHUP: %s not reloaded: %s", label, exc)
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

    def _reloadables(self) -> list[tuple[str, Reloadable]]:
        """The running parts that take a new config live, named for the log."""
        assert self.runtime is not None
        found: list[tuple[str, Reloadable]] = [
            ("the allowlists", self.runtime.access),
            ("the cron jobs", self.runtime.scheduler),
        ]
        found += [(f"the {c.name} channel", c) for c in self.channels if isinstance(c, Reloadable)]
        found += [
            (f"the {t.name} tool", t) for t in self.core.registry if isinstance(t, Reloadable)
        ]
        return found

    def _started_here(self, tx: Tx, info: dict[str, Any], label: str) -> None:
        tx.meta.set_daemon_info(info)
        tx.audit.write(
            "daemon.started",
            trace_id=None,
            session_key=None,
            instance=label,
            version=__version__,
            channels=info["channels"],
        )

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


def _woken(rt: Runtime, reminders: ReminderService, kinds: str) -> None:
    """Another daemon on the shared store committed work (LISTEN/NOTIFY)."""
    every = kinds == "*"  # the listener (re)connected: it may have missed some
    if every or "timezone" in kinds:
        reminders.forget_zones()
    if every or "inbound" in kinds:
        rt.dispatcher.wake()
    if every or "outbound" in kinds:
        rt.delivery.wake()
    if every or "reminder" in kinds:
        rt.scheduler.wake()
