"""Every configured MCP server, kept connected, its tools kept in the registry.

Each server has a supervisor task: connect (bounded), list its tools, register the ones
its ``tools`` patterns expose, then wait — re-listing on ``notifications/tools/
list_changed`` — until the session ends; then it is down (its tools answer
TOOL_UNAVAILABLE at once) and connected again after a backoff (1 s doubling to 60 s).
The SDK is imported by the first connection, never by a daemon with no server. Without
it (the ``mcp`` extra not installed) every server is down at once, its reason one line
that names the extra (``sdk_missing``); nothing is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from ..config import McpServerConfig
from ..tools.registry import ToolRegistry
from . import naming
from .limits import API_MAX_TOOLS, declared_argv, schema_bytes
from .tool import Answer, LostDuringCall, McpTool, NotConnected, make_tool

log = logging.getLogger(__name__)

OPEN_TIMEOUT = 20.0  # connect and initialize
# A first attempt (connect, initialize, list) is over by then, whatever its outcome:
# how long `mcp list`, `doctor` and a piped chat wait for the servers.
FIRST_TRY = OPEN_TIMEOUT + 5.0
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0
STEADY = 60.0  # a session that lasted this long resets the backoff
RELIST_PAUSE = 2.0  # seconds between two listings of a server that says its tools changed

State = Literal["starting", "ready", "down", "stopped"]


def sdk_missing() -> str | None:
    """Why the mcp SDK cannot be used, in one line naming the extra that installs it (as
    the PostgreSQL engine says its driver is missing); None when it imports."""
    try:
        importlib.import_module(f"{__package__}.connection")  # the one module that imports it
    except ImportError as exc:
        return (
            "[[mcp.servers]] needs the MCP SDK: pip install 'echo-bot[mcp]', or pip install"
            f" '.[mcp]' in a checkout ({exc})"
        )
    return None


@dataclass
class ServerStatus:
    """What `/healthz`, `status`, `doctor` and `mcp list` show of a server."""

    name: str
    transport: str
    state: State = "starting"
    error: str | None = None
    problems: list[str] = field(default_factory=list)  # tools left out, and why
    # The cap on its tools it is over (its own max_tools, or what [mcp] max_tools
    # leaves it): it is degraded, only the first tools by name are offered.
    limited: str | None = None
    tools: list[McpTool] = field(default_factory=list)
    since: float = field(default_factory=time.time)


class McpServer:
    def __init__(
        self,
        config: McpServerConfig,
        environ: Mapping[str, str],
        hub: McpHub,
    ) -> None:
        self.config = config
        self.environ = environ
        self.hub = hub
        transport = "stdio" if config.command is not None else "http"
        self.status = ServerStatus(config.name, transport)
        self.tried = asyncio.Event()  # the first connection attempt is over
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._connection: Any = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp-server-{self.config.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._connection is not None:
            await self._connection.close()
        self._set("stopped", None)

    async def call(self, tool: str, args: dict[str, Any], timeout: float) -> Answer:
        connection = self._connection
        if connection is None or self.status.state != "ready":
            raise NotConnected(self._why_down())
        try:
            answer: Answer = await connection.call(tool, args, timeout)
        except LostDuringCall as exc:
            # Down from now on: the next call is not sent to it (the supervisor, told by
            # the connection, ends the session and connects again).
            if self._connection is connection:
                self._set("down", f"the server went away ({exc})")
            raise
        return answer

    def _alive(self, connection: Any) -> None:
        """A call found the session broken, yet it answers pings: ready again."""
        if self._connection is connection and not connection.closed.is_set():
            self._set("ready", None)

    def _why_down(self) -> str:
        state = self.status.state
        if state == "starting":
            return f"the MCP server {self.config.name} is still starting"
        reason = f": {self.status.error}" if self.status.error else ""
        return f"the MCP server {self.config.name} is {state}{reason}"

    def why_missing(self) -> str:
        if self.status.state == "ready":
            return f"the MCP server {self.config.name} does not list it"
        return self._why_down()

    async def _supervise(self) -> None:
        missing = sdk_missing()  # the SDK, first imported here
        if missing is not None:  # installing it needs a restart: nothing to retry
            log.error("mcp %s: %s", self.config.name, missing)
            self._set("down", missing)
            self.tried.set()
            return
        from .connection import Connection, ServerGone

        pause = BACKOFF_FIRST
        while True:
            began = time.monotonic()
            connection = Connection(self.config, self.environ, on_tools_changed=self._changed.set)
            connection.on_alive = partial(self._alive, connection)
            self._connection = connection
            try:
                await connection.open(OPEN_TIMEOUT)
                await self._list(connection)
                self._set("ready", None)
                log.info("mcp %s: connected (%d tools)", self.config.name, len(self.status.tools))
                self.tried.set()
                while not connection.closed.is_set():
                    closed = asyncio.ensure_future(connection.closed.wait())
                    changed = asyncio.ensure_future(self._changed.wait())
                    try:
                        await asyncio.wait({closed, changed}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        closed.cancel()
                        changed.cancel()
                    if self._changed.is_set() and not connection.closed.is_set():
                        self._changed.clear()
                        await self._list(connection)
                        # At most one listing a RELIST_PAUSE: the changes said meanwhile
                        # are one (a server saying it after every listing kept a core busy).
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(connection.closed.wait(), RELIST_PAUSE)
                error = connection.error or "the session ended"
            except ServerGone as exc:
                error = str(exc)
            except asyncio.CancelledError:
                await connection.close()
                raise
            except Exception as exc:  # a supervisor must go on: report, back off, retry
                log.exception("mcp %s: unexpected failure", self.config.name)
                error = f"{type(exc).__name__}: {exc}"
            # Down from now on (no call is sent to it, a late pong does not make it ready),
            # said before it is closed: a hung stdio server takes seconds to stop.
            self._connection = None
            if time.monotonic() - began >= STEADY:
                pause = BACKOFF_FIRST
            self._set("down", error)
            log.warning(
                "mcp %s: down (%s); connecting again in %.0f s", self.config.name, error, pause
            )
            self.tried.set()
            try:
                await connection.close()
            except asyncio.CancelledError:  # stopped meanwhile: still closed, then out
                await connection.close()
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, BACKOFF_MAX)

    async def _list(self, connection: Any) -> None:
        from .connection import ServerGone

        try:
            remote, problems = await connection.list_tools()
        except ServerGone:
            raise
        self.status.problems = list(problems)
        for problem in problems:
            log.warning("mcp %s: tool left out: %s", self.config.name, problem)
        chosen = [t for t in remote if naming.exposed(self.config.tools, t.name)]
        self.hub.install(self, chosen)

    def _set(self, state: State, error: str | None) -> None:
        changed = (self.status.state, self.status.error) != (state, error)
        if self.status.state != state:
            self.status.since = time.time()
        self.status.state, self.status.error = state, error
        if changed:
            self.hub.on_state()


class McpHub:
    def __init__(
        self,
        servers: Sequence[McpServerConfig],
        registry: ToolRegistry,
        environ: Mapping[str, str],
        *,
        on_change: Callable[[], None] = lambda: None,
        max_tools: int = API_MAX_TOOLS,
    ) -> None:
        self.registry = registry
        # [mcp] max_tools: every server's tools together (with ours, never over the API's).
        self.max_tools = max_tools
        self.environ = environ
        self.on_change = on_change
        # Called when a server's state changes (the daemon records it for `status`).
        self.on_state: Callable[[], None] = lambda: None
        self.servers: dict[str, McpServer] = {}
        for config in servers:
            self._add(config)

    def _add(self, config: McpServerConfig) -> McpServer:
        server = McpServer(config, self.environ, self)
        self.servers[config.name] = server
        self.registry.reserve(naming.prefix(config.name), server.why_missing)
        return server

    async def start(self, bound: float) -> None:
        """Start every server; wait until each has tried once, at most ``bound`` seconds
        (the others go on connecting in the background: READY is not held back)."""
        for server in self.servers.values():
            server.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                await asyncio.gather(*(s.tried.wait() for s in self.servers.values()))

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers.values()), return_exceptions=True)

    async def reload(
        self, servers: Sequence[McpServerConfig], max_tools: int | None = None
    ) -> list[str]:
        """SIGHUP: start the servers added, stop the ones removed, restart the ones whose
        config changed (their tools go and come back as they are listed). What changed,
        one word each. A new [mcp] max_tools holds from each server's next listing."""
        if max_tools is not None:
            self.max_tools = max_tools
        wanted = {config.name: config for config in servers}
        changes: list[str] = []
        for name in list(self.servers):
            server = self.servers[name]
            if wanted.get(name) == server.config:
                continue
            await server.stop()
            self._remove(server)
            changes.append(f"{name} {'restarted' if name in wanted else 'removed'}")
        for name, config in wanted.items():
            if name not in self.servers:
                self._add(config).start()
                if not any(c.startswith(f"{name} ") for c in changes):
                    changes.append(f"{name} added")
        return changes

    def _remove(self, server: McpServer) -> None:
        for tool in server.status.tools:
            self.registry.unregister(tool.name)
        server.status.tools = []
        self.registry.unreserve(naming.prefix(server.config.name))
        del self.servers[server.config.name]
        self.on_change()

    def install(self, server: McpServer, remote: Sequence[Any]) -> None:
        """Make ``server``'s tools in the registry what it lists now, as one change: a
        tool whose name another tool has already, whose schema is not one (or too deep,
        or too large) is left out with its reason; of the rest the first by name, up to
        the caps on tools, are registered. Nothing else of the server's stays: a failure
        while registering leaves none of its tools registered."""
        config = server.config
        for old in server.status.tools:
            self.registry.unregister(old.name)
        server.status.tools = []
        server.status.limited = None
        chosen: list[McpTool] = []
        taken: dict[str, str] = {}  # our name → its name on the server, of those chosen
        for item in remote:  # in the server's order: of two that collide, the first stays
            try:
                tool = self._prepare(server, item, taken)
                chosen.append(tool)
                taken[tool.name] = tool.remote_name
            except Exception as exc:  # any fault of one tool leaves that tool out
                problem = f"{item.name}: {exc}" if isinstance(exc, ValueError) else (
                    f"{item.name}: {type(exc).__name__}: {exc}"
                )  # fmt: skip
                log.warning("mcp %s: tool left out: %s", config.name, problem)
                server.status.problems.append(problem)
        chosen.sort(key=lambda t: t.remote_name)  # a stable order, whatever the server's
        room, cap = self._room(server)
        if len(chosen) > room:
            left = chosen[room:]
            limited = (
                f"lists {len(chosen)} tools, over {cap}: the first {room} by name are"
                f" offered, {len(left)} left out (choose with `tools`)"
            )
            log.warning("mcp %s: degraded: %s", config.name, limited)
            server.status.limited = limited
            server.status.problems.append(
                f"{len(left)} tools over {cap}: " + ", ".join(t.remote_name for t in left[:5])
                + (", …" if len(left) > 5 else "")
            )  # fmt: skip
            chosen = chosen[:room]
        installed: list[McpTool] = []
        try:
            for tool in chosen:
                self.registry.register(tool)
                installed.append(tool)
        except BaseException:
            for tool in installed:
                self.registry.unregister(tool.name)
            self.on_change()
            raise
        server.status.tools = installed
        self.on_change()

    def _prepare(self, server: McpServer, item: Any, taken: Mapping[str, str]) -> McpTool:
        """``item`` as a tool of ours, checked as the registry would; ValueError (or any
        other error) saying why it cannot be one."""
        config = server.config
        name = naming.tool_name(config.name, item.name)
        owner = self.registry.get(name)
        if owner is not None or name in taken:
            other = getattr(owner, "remote_name", name) if owner is not None else taken[name]
            where = getattr(owner, "server", "echo-bot") if owner is not None else config.name
            raise ValueError(
                f"its name {name} collides with {other} of {where}"
                " (rename one, or leave one out with `tools`)"
            )
        risk, source = naming.risk_of(
            item.name, config.risk, item.annotations, trust_annotations=config.trust_annotations
        )
        # The owner's word and the server's: a server may add, never take away.
        argv = set(config.argv_args.get(item.name, ())) | declared_argv(item.input_schema)
        tool = make_tool(
            name=name,
            server=config.name,
            remote_name=item.name,
            description=item.description,
            parameters=item.input_schema,
            annotations=item.annotations,
            risk=risk,
            risk_source=source,
            timeout=config.timeout.total_seconds(),
            call=server.call,
            argv_args=tuple(sorted(argv)),
            max_description=config.max_description,
            max_nested_description=config.max_nested_description,
        )
        size = schema_bytes(tool.parameters)
        if size > config.max_schema_bytes:
            raise ValueError(
                f"its schema is {size} bytes, over max_schema_bytes = {config.max_schema_bytes}"
            )
        self.registry.check(tool)
        return tool

    def _room(self, server: McpServer) -> tuple[int, str]:
        """How many tools ``server`` may have now, and the cap that says so: its own
        max_tools, or what [mcp] max_tools (never more than the API takes with our own
        tools counted) leaves after the other servers' tools."""
        ours = sum(1 for t in self.registry if not isinstance(t, McpTool))
        total = min(self.max_tools, API_MAX_TOOLS - ours)
        others = sum(len(s.status.tools) for s in self.servers.values() if s is not server)
        left = max(0, total - others)
        own = server.config.max_tools
        if own <= left:
            return own, f"its max_tools = {own}"
        if total == self.max_tools:
            return left, f"[mcp] max_tools = {total} (the other servers have {others})"
        return left, (
            f"the API's {API_MAX_TOOLS} tools a request (ours take {ours},"
            f" the other servers' {others})"
        )

    def declared_argv(self, name: str) -> tuple[str, ...]:
        """What the config says of ``name``'s command-line arguments, for a tool of a
        server that has not listed it (yet): a server's own declaration needs its
        listing."""
        for server in self.servers.values():
            config = server.config
            for remote, args in config.argv_args.items():
                if naming.tool_name(config.name, remote) == name:
                    return tuple(sorted(args))
        return ()

    def summary(self) -> dict[str, dict[str, object]]:
        """Each server's state, error and tool count (what `status` prints)."""
        return {
            name: {
                "state": s.status.state,
                "error": s.status.error,
                "tools": len(s.status.tools),
                **({"limited": s.status.limited} if s.status.limited else {}),
            }
            for name, s in self.servers.items()
        }

    def health(self) -> dict[str, object]:
        servers = {
            name: {"state": s.status.state, **({"error": s.status.error} if s.status.error else {}),
                   "tools": len(s.status.tools),
                   **({"limited": s.status.limited} if s.status.limited else {})}
            for name, s in self.servers.items()
        }  # fmt: skip
        fine = all(
            s.status.state == "ready" and not s.status.limited for s in self.servers.values()
        )
        return {"status": "ok" if fine else "degraded", "servers": servers}
