"""A tool of an MCP server, as a tool of ours: the registry checks its arguments against
the server's schema, the gate asks by its risk, the executor runs it at most once."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

from ..errors import EchoBotError
from ..tools.base import Effect, ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult
from .limits import bounded_schema, marked
from .naming import RiskSource

MAX_DESCRIPTION = 1024  # characters of the server's description the model sees, by default
MAX_NESTED_DESCRIPTION = 300  # of each description or title inside its schema, by default
KEEP_CONTENT_BYTES = 256 * 1024  # non-text content kept whole in the call's stored result
KEEP_OUTPUT_CHARS = 64 * 1024  # of a result's text, as shell_exec's max_output
# The registry's own timeout is the last resort: the call's own (the server's `timeout`)
# ends first, so that the server is told to cancel.
TIMEOUT_MARGIN = 5.0


class NotConnected(EchoBotError):
    """The server is not connected: nothing was sent."""


class LostDuringCall(EchoBotError):
    """The server went away after the call was sent: what it did is unknown."""


class CallTimedOut(EchoBotError):
    """No answer in time (the server was told to cancel): what it did is unknown."""


class Answer(Protocol):
    is_error: bool
    content: list[dict[str, Any]]


class McpTool(Tool):
    """Subclassed per tool by ``make_tool`` (a tool's declaration is class attributes)."""

    group: ClassVar[ToolGroup] = "mcp"
    server: ClassVar[str]
    remote_name: ClassVar[str]  # its name on the server
    risk_source: ClassVar[RiskSource]
    call_timeout: ClassVar[float]
    annotations: ClassVar[dict[str, Any]]
    # call(remote_name, args, timeout): the server's answer, or one of the errors above.
    call: Callable[[str, dict[str, Any], float], Awaitable[Answer]]

    def __init__(self, call: Callable[[str, dict[str, Any], float], Awaitable[Answer]]) -> None:
        self.call = call

    def effect(self, args: dict[str, Any], ctx: ToolContext) -> Effect:
        """What a server answers may be the owner's data (notes, mail, files): it is
        handed to approvers only, unless the owner lists the tool in approvals.never."""
        return Effect(discloses=f"what the MCP server {self.server} answers")

    def grant_scope(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Exactly these arguments, all of them: ``key_args`` (the arguments that become a
        command line, which the server may declare with ``x-argv``) only order the
        prompt. Nobody rated what the others do, and a server marking a harmless one
        must not widen a grant to every value of the rest."""
        return json.dumps(args, sort_keys=True, separators=(",", ":"))

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        error: Exception
        try:
            # Bounded here too: a transport stuck writing (a full pipe) is no answer.
            async with asyncio.timeout(self.call_timeout + 1):
                answer = await self.call(self.remote_name, args, self.call_timeout)
        except TimeoutError:
            error = CallTimedOut(f"no answer within {self.call_timeout:g} s")
        except (NotConnected, LostDuringCall, CallTimedOut) as exc:
            error = exc
        except Exception as exc:  # a malformed answer, a transport fault: it was sent
            error = LostDuringCall(f"{type(exc).__name__}: {exc}")
        else:
            text, kept = render_content(answer.content)
            data: dict[str, Any] = {"server": self.server, "tool": self.remote_name}
            if kept:
                data["content"] = kept
            if answer.is_error:
                return ToolResult.failure(ErrorCode.TOOL_ERROR, text or "(the tool failed)", **data)
            return ToolResult.success(text or "(no output)", **data)
        return self._failed(error)

    def _failed(self, error: Exception) -> ToolResult:
        where = f"{self.name} on the MCP server {self.server}"
        unknown = self.risk != Risk.READ  # a call that may have changed something
        if isinstance(error, NotConnected):
            return ToolResult.failure(
                ErrorCode.TOOL_UNAVAILABLE, f"{where} is not available: {error}", server=self.server
            )
        if isinstance(error, LostDuringCall):
            if unknown:
                return ToolResult.failure(
                    ErrorCode.OUTCOME_UNKNOWN,
                    f"{where}: the server went away during the call ({error}); whether it"
                    " acted is unknown, so it is not run again",
                    server=self.server,
                )
            return ToolResult.failure(
                ErrorCode.TOOL_UNAVAILABLE, f"{where}: the server went away ({error})"
            )
        if unknown:
            return ToolResult.failure(
                ErrorCode.OUTCOME_UNKNOWN,
                f"{where}: {error} (the server was told to cancel); whether it acted is"
                " unknown, so it is not run again",
                server=self.server,
            )
        return ToolResult.failure(ErrorCode.TIMEOUT, f"{where}: {error}")


def make_tool(
    *,
    name: str,
    server: str,
    remote_name: str,
    description: str,
    parameters: dict[str, Any],
    annotations: dict[str, Any],
    risk: Risk,
    risk_source: RiskSource,
    timeout: float,
    call: Callable[[str, dict[str, Any], float], Awaitable[Answer]],
    argv_args: tuple[str, ...] = (),
    max_description: int = MAX_DESCRIPTION,
    max_nested_description: int = MAX_NESTED_DESCRIPTION,
) -> McpTool:
    """The tool as the model sees it: the server's words, at every depth of its schema,
    cut and marked as the server's (they are not ours, and never instructions). A
    schema nested too deeply is a ValueError."""
    attributes = {
        "name": name,
        "description": marked(description, name, server, max_description),
        "parameters": bounded_schema(parameters, name, server, max_nested_description),
        # Arguments that become a command line decide what a call does: an approval
        # prompt shows them first.
        "argv_args": argv_args,
        "key_args": argv_args,
        "annotations": annotations,
        "risk": risk,
        "risk_source": risk_source,
        "server": server,
        "remote_name": remote_name,
        "call_timeout": timeout,
        "timeout": timeout + TIMEOUT_MARGIN,
    }
    cls = type(f"McpTool[{name}]", (McpTool,), attributes)
    tool: McpTool = cls(call)
    return tool


def render_content(content: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Text items joined as the output; every other item described in it (type, MIME
    type, size) and kept, whole up to KEEP_CONTENT_BYTES, for the store."""
    lines: list[str] = []
    kept: list[dict[str, Any]] = []
    for item in content:
        kind = str(item.get("type", "unknown"))
        if kind == "text":
            lines.append(str(item.get("text", "")))
            continue
        size = _size(item)
        mime = item.get("mimeType") or (item.get("resource") or {}).get("mimeType") or "?"
        uri = item.get("uri") or (item.get("resource") or {}).get("uri")
        where = f", {uri}" if uri else ""
        lines.append(f"[{kind}: {mime}, {size:,} bytes{where}]")
        resource = item.get("resource") if isinstance(item.get("resource"), dict) else None
        if resource is not None and isinstance(resource.get("text"), str):
            lines.append(resource["text"])  # in the output: not kept twice
            item = {**item, "resource": {k: v for k, v in resource.items() if k != "text"}}
        if size > KEEP_CONTENT_BYTES:  # described, not kept
            item = {k: v for k, v in item.items() if k != "data"}
            if isinstance(item.get("resource"), dict):
                item["resource"] = {k: v for k, v in item["resource"].items() if k != "blob"}
        kept.append(item)
    output = "\n".join(lines)
    if len(output) > KEEP_OUTPUT_CHARS:  # the model reads far less; the store keeps this
        more = len(output) - KEEP_OUTPUT_CHARS
        output = f"{output[:KEEP_OUTPUT_CHARS]}\n[… {more:,} characters more, not kept]"
    return output, kept


def _size(item: dict[str, Any]) -> int:
    encoded = item.get("data") or (item.get("resource") or {}).get("blob")
    if isinstance(encoded, str):
        try:
            return len(base64.b64decode(encoded, validate=False))
        except (binascii.Error, ValueError):
            return len(encoded)
    text = (item.get("resource") or {}).get("text")
    return len(text.encode()) if isinstance(text, str) else 0
