"""``echo-bot mcp list``: each configured server, its state, and its tools with their
risk and where the risk came from (owner / annotation / default)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..config import LoadedConfig, McpServerConfig
from ..tools.registry import ToolRegistry
from .hub import FIRST_TRY, McpHub, ServerStatus
from .limits import API_MAX_TOOLS
from .tool import McpTool


def mcp_list_command(loaded: LoadedConfig, environ: Mapping[str, str]) -> int:
    """Connect to every server (their own processes, not the daemon's), print, stop.
    Exit status 1 when a server is not ready."""
    servers = loaded.config.mcp.servers
    if not servers:
        print("no MCP servers configured (add [[mcp.servers]] to the config)")
        return 0
    lines, ready = asyncio.run(_listing(loaded, environ))
    print("\n".join(lines))
    return 0 if ready else 1


async def snapshot(
    servers: Sequence[McpServerConfig],
    environ: Mapping[str, str],
    max_tools: int = API_MAX_TOOLS,
) -> list[ServerStatus]:
    """Start each server (its own process or session, not the daemon's), take its
    state and tools once it has answered or failed, stop it."""
    hub = McpHub(servers, ToolRegistry(), environ, max_tools=max_tools)
    try:
        await hub.start(bound=FIRST_TRY)
        # Copies: stopping the hub marks its servers stopped.
        return [
            replace(s.status, tools=list(s.status.tools), problems=list(s.status.problems))
            for s in hub.servers.values()
        ]
    finally:
        await hub.stop()


async def _listing(loaded: LoadedConfig, environ: Mapping[str, str]) -> tuple[list[str], bool]:
    mcp = loaded.config.mcp
    statuses = await snapshot(mcp.servers, environ, mcp.max_tools)
    lines: list[str] = []
    for status in statuses:
        state = status.state if status.state != "starting" else "not answering"
        why = f" — {status.error}" if status.error else ""
        why += f" — degraded: {status.limited}" if status.limited else ""
        count = f", {len(status.tools)} tools" if status.state == "ready" else ""
        lines.append(f"{status.name} ({status.transport}): {state}{count}{why}")
        tools: list[McpTool] = sorted(status.tools, key=lambda t: t.name)
        width = max((len(t.name) for t in tools), default=0)
        for tool in tools:
            lines.append(f"  {tool.name:<{width}}  {tool.risk.value:<9}  {tool.risk_source}")
        lines += [f"  left out: {problem}" for problem in status.problems]
    return lines, all(s.state == "ready" for s in statuses)
