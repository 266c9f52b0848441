"""The composition root: runs a built ``Runtime`` (``runtime.build``) as the daemon —
the state lock, the HTTP port, the store (waited for), the core's parts, the channels,
READY — and stops it all in reverse. The only module that knows the channel registry."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from . import __version__
from .bus import Bus, Channel
from .channel_host import DaemonHost, show_when_ready, start_channels
from .config import (
    Config,
    channel_section,
    console_base,
    console_exposure,
    load_config,
    with_credentials,
)
from .errors import ConfigError, StoreUnavailable
from .housekeeping import warn_unreachable
from .lifecycle import Parts
from .logs import log_retrying
from .plugins import load_class, registry
from .runtime import Runtime, brain_label
from .scheduling.scheduler import Scheduler
from .sdnotify import Notifier
from .statedir import StateLock
from .store import Tx

if TYPE_CHECKING:  # aiohttp is imported only when the server is needed
    from .console.web import Console
    from .http import HttpServer

log = logging.getLogger(__name__)

# While the store cannot be reached at start: wait this long, doubling up to the second.
STORE_RETRY_FIRST = 1.0
STORE_RETRY_MAX = 30.0


def http_reasons(config: Config, channel_names: Sequence[str]) -> list[str]:
    """Why the HTTP server (and its port) is needed; empty: it is not started.

    A channel says when it needs it (``ChannelSpec.http_reason``: webhooks, Telegram's
    webhook mode, Slack's Events API); Telegram polling does not, so /healthz and
    /metrics alone are asked for with ``[http] enabled = true``.
    """
    reasons = []
    for name in channel_names:
        section = channel_section(config, name)
        reason = registry()[name].http_reason(section) if section is not None else None
        if reason:
            reasons.append(reason)
    if config.http.enabled:
        reasons.append("[http] enabled")
    if config.console.enabled:
        reasons.append("[console] enabled")
    return reasons


def load_channel_class(name: str) -> type[Channel]:
    """The channel's class, its module imported now (``plugins.load_class``). A library
    the channel needs that is not installed is a ``ConfigError`` saying how to install it
    (``run`` and ``check-config`` exit 2 with that line)."""
    found: type[Channel] = load_class(name)
    return found


class Daemon:
    """``echo-bot run`` and ``echo-bot chat``: one process that holds the state dir and
    runs what ``build`` made."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        channel_names: list[str],
        channel_options: Mapping[str, Mapping[str, Any]] | None = None,
        banner: bool = True,
        extra_channels: Sequence[Channel] = (),
        freeze_heap: bool = False,
        wait_for_mcp: bool = False,
    ) -> None:
        self.runtime = runtime
        self.channel_names = channel_names
        self.channel_options = channel_options or {}
        self.environ = runtime.environ  # the channels' (a reload adds route secrets)
        self.banner = banner
        # Only a process of its own (the CLI) sets it: it affects the whole interpreter.
        self.freeze_heap = freeze_heap
        self.extra_channels = list(extra_channels)
        # A piped chat: its first line may call an MCP tool, and nobody types it again
        # later. Wait for each server's first attempt, as long as that may take.
        self.wait_for_mcp = wait_for_mcp
        self.channels: list[Channel] = []  # the started ones, in start order
        self.bus: Bus | None = None
        self.http: HttpServer | None = None
        self.console: Console | None = None
        self.notifier = Notifier(self.environ)
        self._reload_lock = asyncio.Lock()
        self._reloads: set[asyncio.Task[list[str]]] = set()
        self._started = asyncio.Event()
        self._stop = asyncio.Event()
        self._signals = 0
        self.exit_code = 0
        self.started_at = runtime.started_at

    @property
    def scheduler(self) -> Scheduler:
        return self.runtime.scheduler

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
        rt = self.runtime
        config = rt.loaded.config
        lock = StateLock(rt.state_dir)
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
                await self.runtime.store.open()
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
            if any(not registry()[name].local for name in self.channel_names):
                log.info(  # a channel that polls its peer needs no port of its own
                    "no HTTP server and no port ([http] enabled = true serves /healthz"
                    " and /metrics)"
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
                await self.runtime.store.close()
                return self.exit_code
            parts = Parts(stack)
            await parts.start("the store", stop=self.runtime.store.close)
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
        rt = self.runtime
        await rt.start(
            parts, http=http, status=self.notifier.status, wait_for_mcp=self.wait_for_mcp
        )
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
        console = self._console(config, rt, http)
        if http is not None:
            await parts.start("the HTTP server", http.start, http.stop)
            self.http = http
        if console is not None:  # after the server: it ends its live pages first at stop
            await parts.start("the console", console.start, console.stop)
        running = frozenset(c.name for c in self.channels)
        warn_unreachable(config, running)
        rt.outlet.connect(rt.bus.send, running)
        self.bus = rt.bus
        self._started.set()
        await self._announce(rt, config)
        await show_when_ready(self.channels)
        log.info(
            "echo-bot %s started as %s (state dir %s)",
            __version__,
            rt.membership.label,
            rt.state_dir,
        )

    def _console(self, config: Config, rt: Runtime, http: HttpServer | None) -> Console | None:
        """The web console's routes, on the server before it starts (``[console] enabled``)."""
        if http is None or not config.console.enabled:
            return None
        from .console.web import Console

        console = Console(live=rt.live, store=rt.store, gate=rt.gate, http=http)
        console.mount()
        console.mount_last()
        self.console = console
        return console

    def _make_channels(self, config: Config, rt: Runtime, http: HttpServer | None) -> list[Channel]:
        """Every configured channel, made before any starts (a bad token fails them all)."""
        host = DaemonHost(
            bus=rt.bus,
            store=rt.store,
            access=rt.access,
            gate=rt.gate,
            masker=rt.masker,
            environ=self.environ,
            commands=[(c.name, c.help) for c in rt.commands.all()],
            started_at=self.started_at,
            http=http,
            cluster=rt.cluster,
            delivery=rt.delivery,
            previews=rt.previews,
            timezone_for=rt.reminders.timezone_for,
            argv_args=rt.argv_args,
            request_stop=self.request_stop,
            state_dir=rt.state_dir,
        )
        return [
            load_channel_class(name)(
                channel_section(config, name), self.channel_options.get(name, {}), host
            )
            for name in self.channel_names
        ]

    async def _announce(self, rt: Runtime, config: Config) -> None:
        """Up: the daemon's facts in the store, READY to systemd, the banner."""
        label = brain_label(rt.brain, config)
        info = {
            "pid": os.getpid(),
            "started_at": time.time(),
            "version": __version__,
            "channels": [c.name for c in self.channels],
            "brain": label,
            "instance": rt.membership.label,
        }
        await rt.store.run(lambda tx: self._started_here(tx, info, rt.membership.label))
        if rt.mcp.hub is not None:
            self._record_mcp(info)
            rt.mcp.hub.on_state = partial(self._record_mcp, info)
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
        exposure = console_exposure(config)
        if exposure is not None:
            log.warning("%s", exposure)
        if self.banner:
            self._print_banner(label)

    def _argv_args(self, tool: str) -> tuple[str, ...]:
        return self.runtime.argv_args(tool)

    def _record_mcp(self, info: dict[str, Any]) -> None:
        """Keep the MCP servers' states with the daemon's facts in the store (`status`
        reads them there; state changes are rare)."""
        slot = self.runtime.mcp
        hub = slot.hub
        if hub is None or slot.stopping:
            return

        async def write() -> None:
            info["mcp"] = hub.summary()  # the newest, whichever write runs last
            try:
                await self.runtime.store.run(lambda tx: tx.meta.set_daemon_info(info))
            except Exception:  # it is written again at the next change
                log_retrying(log, "recording the MCP servers' states failed")

        task = asyncio.create_task(write())
        slot.writes.add(task)
        task.add_done_callback(slot.writes.discard)

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
        rt = self.runtime
        path = rt.loaded.path
        if path is None:
            log.info("SIGHUP: running on embedded defaults; there is no file to reload")
            return []
        if not self._started.is_set():
            log.info("SIGHUP while starting: ignored; send it again once started")
            return []
        try:
            loaded = load_config(path)
            environ = with_credentials(loaded.config, self.environ)
            settings = rt.check(loaded, environ)  # opens no store, starts nothing
        except ConfigError as exc:
            log.error("SIGHUP: the config was not reloaded, the running one stays:\n%s", exc)
            self.notifier.status("config reload failed; running on the previous config")
            return []
        restart = await rt.reload(settings, environ, channels=self.channels)
        log.info(
            "SIGHUP: config reloaded (routes, cron jobs, allowlists, approvers, approval policy)%s",
            f"; needs restart to apply: {', '.join(restart)}" if restart else "",
        )
        self.notifier.status(
            "config reloaded" + (" (some changes need a restart)" if restart else "")
        )
        return restart

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
        rt = self.runtime
        channels = ", ".join(self.channel_names) or "none (no terminal attached)"
        source = rt.loaded.path or "embedded defaults"
        local = any(registry()[name].local for name in self.channel_names)
        chat = "; /help lists commands" if local else ""
        config = rt.loaded.config
        console = (
            f"console: {console_base(config)}/console/ (sign in: `echo-bot console link`)\n"
            if config.console.enabled
            else ""
        )
        print(
            f"echo-bot {__version__} — config: {source}; brain: {brain}; channels: {channels}\n"
            f"state: {rt.store.describe()}\n{console}"
            f"stop with Ctrl+C or `kill {os.getpid()}`{chat}",
            file=sys.stderr,
            flush=True,
        )
