"""Every configured MCP server, kept connected, its tools kept in the registry.

Each server has a supervisor task: connect (bounded), list its tools, register the ones
its ``tools`` patterns expose, then wait — re-listing on ``notifications/tools/
list_changed`` — until the session ends; then it is down (its tools answer
TOOL_UNAVAILABLE at once) and connected again after a backoff (1 s doubling to 60 s).
The SDK is imported by the first connection, never by a daemon with no server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from ..config import McpServerConfig
from ..tools.registry import ToolRegistry
from . import naming
from .tool import Answer, LostDuringCall, McpTool, NotConnected, make_tool

log = logging.getLogger(__name__)

OPEN_TIMEOUT = 20.0  # connect and initialize
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0
STEADY = 60.0  # a session that lasted this long resets the backoff

State = Literal["starting", "ready", "down", "stopped"]


@dataclass
class ServerStatus:
    """What `/healthz`, `status`, `doctor` and `mcp list` show of a server."""

    name: str
    transport: str
    state: State = "starting"
    error: str | None = None
    problems: list[str] = field(default_factory=list)  # tools left out, and why
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
        from .connection import Connection, ServerGone  # the SDK, first used here

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
                error = connection.error or "the session ended"
            except ServerGone as exc:
                error = str(exc)
            except asyncio.CancelledError:
                await connection.close()
                raise
            except Exception as exc:  # a supervisor must go on: report, back off, retry
                log.exception("mcp %s: unexpected failure", self.config.name)
                error = f"{type(exc).__name__}: {exc}"
            await connection.close()
            self._connection = None
            if time.monotonic() - began >= STEADY:
                pause = BACKOFF_FIRST
            self._set("down", error)
            log.warning(
                "mcp %s: down (%s); connecting again in %.0f s", self.config.name, error, pause
            )
            self.tried.set()
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
    ) -> None:
        self.registry = registry
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

    async def reload(self, servers: Sequence[McpServerConfig]) -> list[str]:
        """SIGHUP: start the servers added, stop the ones removed, restart the ones whose
        config changed (their tools go and come back as they are listed). What changed,
        one word each."""
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
        """Make ``server``'s tools in the registry what it lists now: new ones added,
        gone ones removed, changed ones replaced. A tool whose name another tool has
        already, or whose schema is not one, is left out with its reason."""
        config = server.config
        for old in server.status.tools:
            self.registry.unregister(old.name)
        installed: list[McpTool] = []
        for item in remote:
            name = naming.tool_name(config.name, item.name)
            if self.registry.get(name) is not None:
                owner = self.registry.get(name)
                other = getattr(owner, "remote_name", name)
                where = getattr(owner, "server", "echo-bot")
                problem = (
                    f"{item.name}: its name {name} collides with {other} of {where}"
                    " (rename one, or leave one out with `tools`)"
                )
                log.error("mcp %s: %s", config.name, problem)
                server.status.problems.append(problem)
                continue
            risk, source = naming.risk_of(
                item.name, config.risk, item.annotations, trust_annotations=config.trust_annotations
            )
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
            )
            try:
                self.registry.register(tool)
            except ValueError as exc:
                problem = f"{item.name}: {exc}"
                log.warning("mcp %s: tool left out: %s", config.name, problem)
                server.status.problems.append(problem)
                continue
            installed.append(tool)
        server.status.tools = installed
        self.on_change()

    def summary(self) -> dict[str, dict[str, object]]:
        """Each server's state, error and tool count (what `status` prints)."""
        return {
            name: {"state": s.status.state, "error": s.status.error, "tools": len(s.status.tools)}
            for name, s in self.servers.items()
        }

    def health(self) -> dict[str, object]:
        servers = {
            name: {"state": s.status.state, **({"error": s.status.error} if s.status.error else {}),
                   "tools": len(s.status.tools)}
            for name, s in self.servers.items()
        }  # fmt: skip
        ready = all(s.status.state == "ready" for s in self.servers.values())
        return {"status": "ok" if ready else "degraded", "servers": servers}
