"""The tool registry: declarations checked at registration, arguments checked before
running, timeouts enforced, exceptions contained, huge output truncated for the model."""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ..errors import ConfigError
from .base import ErrorCode, Tool, ToolContext, ToolResult

log = logging.getLogger(__name__)

PROFILES: dict[str, frozenset[str]] = {
    "minimal": frozenset({"basic"}),
    "messaging": frozenset({"basic", "messaging"}),
    "coding": frozenset({"basic", "messaging", "coding"}),
}


# Valid arguments remembered per tool, at most (then forgotten all at once).
VALID_ARGS_KEPT = 1024
VALID_ARGS_MAX_CHARS = 2048  # longer arguments are checked each time, not kept


class ToolRegistry:
    def __init__(self, *, output_limit: int = 8_000) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Draft202012Validator] = {}
        # Arguments found valid, per tool, by their repr (which tells a list from a
        # tuple and 1 from True): a call is checked when it is settled and again
        # when it runs, and a schema check is the larger part of a cheap tool's run.
        self._valid: dict[str, set[str]] = {}
        self.output_limit = output_limit
        # Name prefixes whose tools come and go while the daemon runs (an MCP server's
        # ``<server>__``), with why such a tool is not here now: config may name them
        # before they are listed.
        self._reserved: dict[str, Callable[[], str]] = {}

    def reserve(self, prefix: str, why_missing: Callable[[], str]) -> None:
        self._reserved[prefix] = why_missing

    def unreserve(self, prefix: str) -> None:
        self._reserved.pop(prefix, None)

    def reserved(self, name: str) -> bool:
        return any(name.startswith(prefix) for prefix in self._reserved)

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)
        self._validators.pop(name, None)
        self._valid.pop(name, None)

    def check(self, tool: Tool) -> None:
        """Whether ``tool`` could be registered now; ValueError, saying why, if not."""
        name = tool.name
        if name in self._tools:
            raise ValueError(f"tool {name!r} is registered twice")
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            raise ValueError(f"tool {name!r}: invalid parameter schema: {exc.message}") from None
        except RecursionError:
            raise ValueError(f"tool {name!r}: its parameter schema nests too deeply") from None
        except Exception as exc:  # a schema no check can walk: not one
            raise ValueError(
                f"tool {name!r}: its parameter schema cannot be checked: {type(exc).__name__}"
            ) from None
        if not isinstance(tool.parameters, dict) or tool.parameters.get("type") != "object":
            raise ValueError(f"tool {name!r}: parameters must be a JSON-Schema object")
        if tool.retries and not tool.idempotent:
            raise ValueError(f"tool {name!r}: retries are only allowed for idempotent tools")

    def register(self, tool: Tool) -> None:
        """Add ``tool``, or raise ValueError (and add nothing)."""
        self.check(tool)
        name = tool.name
        self._tools[name] = tool
        self._validators[name] = Draft202012Validator(tool.parameters)
        self._valid[name] = set()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def argv_args(self, name: str) -> tuple[str, ...]:
        """The arguments of the tool ``name`` that become a command line (none for a
        tool not registered now)."""
        tool = self._tools.get(name)
        return tool.argv_args if tool is not None else ()

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def closest(self, name: str, candidates: Iterable[str] | None = None) -> list[str]:
        pool = list(candidates) if candidates is not None else self.names()
        return difflib.get_close_matches(name, pool, n=3, cutoff=0.4)

    def not_found(self, name: str, candidates: Iterable[str] | None = None) -> ToolResult:
        for prefix, why_missing in self._reserved.items():
            if name.startswith(prefix):
                return ToolResult.failure(
                    ErrorCode.TOOL_UNAVAILABLE, f"the tool {name} is not available: {why_missing()}"
                )
        close = self.closest(name, candidates)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return ToolResult.failure(
            ErrorCode.TOOL_NOT_FOUND, f"There is no tool named {name!r}.{hint}", closest=close
        )

    def validate(self, name: str, args: Any) -> ToolResult | None:
        """None when ``args`` fit the tool's schema, else an INVALID_PARAMETER result."""
        if not isinstance(args, dict):
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER, f"arguments for {name} must be a JSON object"
            )
        valid, validator = self._valid.get(name), self._validators.get(name)
        if valid is None or validator is None:  # unregistered meanwhile (an MCP server's)
            return self.not_found(name)
        key = repr(args)
        if key in valid:
            return None
        try:
            errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
        except Exception as exc:  # a schema that checks out but cannot be applied
            # (a dangling $ref from an MCP server): no call, an error the model can read
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                f"the schema of {name} cannot be applied: {type(exc).__name__}",
            )
        if not errors:
            if len(key) <= VALID_ARGS_MAX_CHARS:
                if len(valid) >= VALID_ARGS_KEPT:
                    valid.clear()
                valid.add(key)
            return None
        problems = []
        for error in errors[:5]:
            where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
            problems.append(f"{where}: {error.message[:200]}")
        return ToolResult.failure(
            ErrorCode.INVALID_PARAMETER,
            f"invalid arguments for {name}: " + "; ".join(problems),
            problems=problems,
        )

    async def execute(self, name: str, args: Any, ctx: ToolContext) -> ToolResult:
        """Run a tool. Never raises: every failure is a ToolResult."""
        tool = self._tools.get(name)
        if tool is None:
            return self.not_found(name)
        if not tool.available():
            return ToolResult.failure(
                ErrorCode.PERMISSION_DENIED, f"the tool {name} is switched off in the config"
            )
        invalid = self.validate(name, args)
        if invalid is not None:
            return invalid
        started = time.perf_counter()
        attempts = 1 + (tool.retries if tool.idempotent else 0)
        result = ToolResult.failure(ErrorCode.TOOL_ERROR, "not run")
        for attempt in range(1, attempts + 1):
            result = await self._run_once(tool, args, ctx, attempt)
            if result.ok or result.error_code not in (ErrorCode.TIMEOUT, ErrorCode.UPSTREAM_ERROR):
                break
        result.latency_ms = (time.perf_counter() - started) * 1000
        return result

    async def _run_once(
        self, tool: Tool, args: dict[str, Any], ctx: ToolContext, attempt: int
    ) -> ToolResult:
        try:
            async with asyncio.timeout(tool.timeout):
                result = await tool.run(args, ctx)
        except TimeoutError:
            return ToolResult.failure(
                ErrorCode.TIMEOUT, f"{tool.name} did not finish within {tool.timeout:g} s"
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool must never take the loop down
            log.exception("tool %s raised (attempt %d)", tool.name, attempt)
            return ToolResult.failure(
                ErrorCode.TOOL_ERROR, f"{tool.name} failed: {type(exc).__name__}: {exc}"
            )
        if not isinstance(result, ToolResult):
            return ToolResult.failure(
                ErrorCode.TOOL_ERROR, f"{tool.name} returned {type(result).__name__}"
            )
        return result

    def for_model(self, result: ToolResult, call_id: str) -> str:
        """The output as the model sees it: capped, with a pointer to the full text."""
        text = result.output
        if len(text) <= self.output_limit:
            return text
        cut = len(text) - self.output_limit
        return (
            text[: self.output_limit]
            + f"\n[… {cut} more characters truncated; the full output is kept as call {call_id}]"
        )

    def exposed(
        self, profile: str, allow: Iterable[str] = (), deny: Iterable[str] = ()
    ) -> list[Tool]:
        """The tools a profile exposes, plus ``allow``, minus ``deny``."""
        groups = PROFILES.get(profile)
        allowed, denied = set(allow), set(deny)
        chosen = []
        for tool in self._tools.values():
            # An MCP server's tools are exposed as its ``tools`` patterns say, in every
            # profile: the owner chose them by configuring the server.
            in_profile = groups is None or tool.group in groups or tool.group == "mcp"
            if not tool.available() or tool.name in denied:
                continue
            if in_profile or tool.name in allowed:
                chosen.append(tool)
        return chosen

    def check_names(self, names: Iterable[str], key: str, source: str) -> None:
        unknown = [n for n in names if n not in self._tools and not self.reserved(n)]
        if unknown:
            raise ConfigError(
                f"{source}: {key}: unknown tool(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(self.names())})"
            )
