"""One session with one MCP server, over stdio or streamable HTTP — the one module that
imports the ``mcp`` SDK (imported only when ``[[mcp.servers]]`` is configured).

The SDK's transports and session are anyio task groups: they must be entered and left
in one task. So one task owns them (``_own``) and parks while the session lives; calls
come from the turns' tasks. A fault of the transport stays inside the owner (the SDK
raises it there, wrapped in exception groups); callers see ``ServerGone``. The owner
notices a server that went away — a stdio process that exited, an HTTP server that
stopped answering — by a ping every ``PING_EVERY`` seconds, and by calls that failed so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from .. import __version__
from ..config import MCP_MAX_TOOLS, McpServerConfig
from ..errors import EchoBotError
from .tool import CallTimedOut, LostDuringCall, NotConnected

log = logging.getLogger(__name__)

PING_EVERY = 2.0  # seconds between liveness pings of a connected server
PING_TIMEOUT = 10.0
LIST_TIMEOUT = 30.0
STDERR_LINE = 1000  # characters of a line a server writes to stderr that are logged
STDERR_LINES = 120  # lines of its stderr logged a minute at most; the rest are counted
LIST_MAX = 4 * MCP_MAX_TOOLS  # tools of a listing read at most (a server offers 128 at most)
NAME_MAX = 128  # characters of a tool's name on its server
CLIENT = types.Implementation(name="echo-bot", version=__version__)


class ServerGone(EchoBotError):
    """The server is not connected, or went away during the request."""


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool as the server lists it (its words: untrusted)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallAnswer:
    is_error: bool
    content: list[dict[str, Any]]  # each item as on the wire (type, text | data, mimeType…)


def stdio_environment(config: McpServerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's own variables: its ``env`` and ``secret_env`` (values from ours). The
    SDK adds only HOME, LOGNAME, PATH, SHELL, TERM and USER of ours; nothing else of our
    environment (tokens, keys) reaches the server."""
    env = dict(config.env)
    for inner, outer in config.secret_env.items():
        env[inner] = environ.get(outer, "")
    return env


class Connection:
    def __init__(
        self,
        config: McpServerConfig,
        environ: Mapping[str, str],
        *,
        on_tools_changed: Callable[[], None],
        on_alive: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.environ = environ
        self.on_tools_changed = on_tools_changed
        self.on_alive = on_alive  # a ping answered after a call found the session broken
        self.closed = asyncio.Event()  # set once the session is over, for whatever reason
        self.error: str | None = None  # why it ended (or never began), in one line
        self.server_name = ""
        self._session: ClientSession | None = None
        self._dispatcher: JSONRPCDispatcher | None = None
        self._stop = asyncio.Event()
        self._broken = asyncio.Event()
        self._calls = 0  # tool calls in flight
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self, timeout: float) -> None:
        """Connect and initialize; ServerGone (with the reason) if that fails in time.
        After a failure as after a session, the caller closes it (a hung stdio server
        takes seconds to stop: its reason is known before that)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready), name=f"mcp-{self.config.name}")
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            raise ServerGone(f"no answer to initialize within {timeout:g} s") from None

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            # A stubborn stdio server takes the SDK ~4 s to stop (stdin closed, then
            # SIGTERM, then SIGKILL to its process group).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.gather(self._task, return_exceptions=True)
            if not self._task.done():
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        self.closed.set()

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                dispatcher = JSONRPCDispatcher(read, write)
                session = await stack.enter_async_context(
                    ClientSession(
                        dispatcher=dispatcher,
                        message_handler=self._on_message,
                        sampling_callback=self._decline_sampling,
                        elicitation_callback=self._decline_elicitation,
                        client_info=CLIENT,
                    )
                )
                init = await session.initialize()
                self.server_name = init.server_info.name if init.server_info else ""
                self._session, self._dispatcher = session, dispatcher
                ready.set_result(None)
                await self._watch(session)
        except asyncio.CancelledError:
            self.error = self.error or "closed"
            if not ready.done():
                ready.set_exception(ServerGone(self.error))
            raise
        except (Exception, BaseExceptionGroup) as exc:  # the SDK's faults, in groups
            self.error = self.error or _one_line(exc)
            if not ready.done():
                ready.set_exception(ServerGone(self.error))
        finally:
            self._session = self._dispatcher = None
            self.closed.set()

    def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.command is not None:
            params = StdioServerParameters(
                command=config.command[0],
                args=config.command[1:],
                env=stdio_environment(config, self.environ),
            )
            return stdio_client(params, errlog=self._stderr_relay(stack))
        assert config.url is not None
        headers = {header: self.environ.get(var, "") for header, var in config.headers_env.items()}
        http = create_mcp_http_client(headers=headers)
        stack.push_async_callback(http.aclose)
        return streamable_http_client(config.url, http_client=http)

    def _stderr_relay(self, stack: AsyncExitStack) -> Any:
        """The server's stderr, for the SDK to give the process: a pipe whose lines a
        thread logs as ours (``echo_bot.mcp.server.<name>``, so masked like every log
        line: a server may print a secret it was given)."""
        read_fd, write_fd = os.pipe()
        writer = os.fdopen(write_fd, "w")
        reader = os.fdopen(read_fd, "rb")
        stack.callback(_close_quietly, writer)  # the child has its own copy
        logger = logging.getLogger(f"echo_bot.mcp.server.{self.config.name}")

        def relay() -> None:
            """Each line logged, at most STDERR_LINES a minute: a chatty or hostile
            server must not fill the disk or use up journald's burst for ours."""
            since, logged, dropped = time.monotonic(), 0, 0
            with reader:
                while raw := reader.readline(STDERR_LINE):  # bounded: a line may never end
                    now = time.monotonic()
                    if now - since >= 60:
                        if dropped:
                            logger.warning("%d lines of its stderr not logged", dropped)
                        since, logged, dropped = now, 0, 0
                    line = raw.decode("utf-8", "replace").rstrip()
                    if not line:
                        continue
                    if logged < STDERR_LINES:
                        logged += 1
                        logger.info("%s", line)
                    else:
                        dropped += 1

        threading.Thread(target=relay, name=f"mcp-{self.config.name}-stderr", daemon=True).start()
        return writer

    async def _watch(self, session: ClientSession) -> None:
        """Park until asked to stop, or until the server is found gone."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_EVERY):
                    await _first(self._stop.wait(), self._broken.wait())
            if self._stop.is_set():
                return
            try:
                async with asyncio.timeout(PING_TIMEOUT):  # the session's own is off
                    await session.send_ping()
            except MCPError as exc:
                self.error = f"the server went away: {exc.message}"
                return
            except TimeoutError:
                if self._calls:  # a server may answer nothing while a tool works: the
                    continue  # call's own timeout bounds it, and a dead pipe ends it
                self.error = f"the server stopped answering (no pong within {PING_TIMEOUT:g} s)"
                return
            if self._broken.is_set():  # a call failed, yet the session lives
                self._broken.clear()
                self.on_alive()

    # -- what the server sends us ---------------------------------------------------------
    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.on_tools_changed()
        elif isinstance(message, Exception):
            log.warning("mcp %s: %s", self.config.name, _one_line(message))

    async def _decline_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.ErrorData:
        log.warning("mcp %s asked for sampling: declined (not supported yet)", self.config.name)
        return types.ErrorData(
            code=types.INVALID_REQUEST, message="echo-bot does not support sampling yet"
        )

    async def _decline_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ErrorData:
        log.warning("mcp %s asked for elicitation: declined (not supported yet)", self.config.name)
        return types.ErrorData(
            code=types.INVALID_REQUEST, message="echo-bot does not support elicitation yet"
        )

    # -- requests -------------------------------------------------------------------------
    async def list_tools(self) -> tuple[list[RemoteTool], list[str]]:
        """Every tool the server lists (all pages), and one line per tool that is not
        one (no name, a schema that is not an object): those are left out, not the
        server."""
        dispatcher = self._dispatcher
        if dispatcher is None:
            raise ServerGone(self.error or "not connected")
        tools: list[RemoteTool] = []
        problems: list[str] = []
        cursor: str | None = None
        for _page in range(1000):
            try:
                page = await dispatcher.send_raw_request(
                    "tools/list", {"cursor": cursor} if cursor else None, {"timeout": LIST_TIMEOUT}
                )
            except MCPError as exc:
                self._gone_if_closed(exc)
                raise ServerGone(f"tools/list failed: {exc.message}") from None
            for item in page.get("tools") or []:
                tool, problem = _remote_tool(item)
                if tool is not None:
                    tools.append(tool)
                else:
                    problems.append(problem)
            cursor = page.get("nextCursor")
            if len(tools) + len(problems) >= LIST_MAX:
                problems.append(f"it lists more than {LIST_MAX} tools: the rest were not read")
                break
            if not cursor:
                break
        return tools, problems

    async def call(self, tool: str, args: dict[str, Any], timeout: float) -> CallAnswer:
        session = self._session
        if session is None or self.closed.is_set():
            raise NotConnected(self.error or "not connected")
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool, arguments=args)
        )
        self._calls += 1
        try:
            result = await session.send_request(
                request, types.CallToolResult, request_read_timeout_seconds=timeout
            )
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                raise CallTimedOut(f"no answer within {timeout:g} s") from None
            self._gone_if_closed(exc)
            if exc.code == types.CONNECTION_CLOSED:
                raise LostDuringCall(exc.message) from None
            text = f"MCP error {exc.code}: {exc.message}"
            return CallAnswer(True, [{"type": "text", "text": text}])
        finally:
            self._calls -= 1
        wire = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        return CallAnswer(bool(wire.get("isError")), list(wire.get("content") or []))

    def _gone_if_closed(self, exc: MCPError) -> None:
        if exc.code == types.CONNECTION_CLOSED:
            self._broken.set()


def _close_quietly(file: Any) -> None:
    with contextlib.suppress(OSError):
        file.close()


def _remote_tool(item: Any) -> tuple[RemoteTool | None, str]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None, "a tool without a name"
    name = item["name"]
    if len(name) > NAME_MAX or not name.isprintable():  # it reaches logs and prompts
        return None, f"a tool named {name[:60]!r}: not a name (printable, {NAME_MAX} at most)"
    schema = item.get("inputSchema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None, f"{name}: its inputSchema is not a JSON-Schema object"
    description = item.get("description")
    annotations = item.get("annotations")
    return RemoteTool(
        name=name,
        description=description if isinstance(description, str) else "",
        input_schema=schema,
        annotations=annotations if isinstance(annotations, dict) else {},
    ), ""


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _one_line(exc: BaseException) -> str:
    """The innermost reason of an exception (the SDK nests them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {exc.filename or 'the command'}: no such file"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
