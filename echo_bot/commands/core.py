"""The core's commands: /help, /tools, /approvals, /tool, /run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..approvals.display import escape_text
from ..conversation import BrainReply, ToolCall
from ..dates import clock_text
from ..events import Address, OutboundMessage, new_id
from ..plugins import command_prefix, is_local
from ..store.approvals import ApprovalRow
from .registry import Command, CommandContext, CommandRegistry

PendingApprovals = Callable[[], Awaitable[list[ApprovalRow]]]
Reprompt = Callable[[ApprovalRow], Awaitable[OutboundMessage]]
TimezoneFor = Callable[[Address], Awaitable[str]]
ResetSession = Callable[[str], Awaitable[None]]


def register_core_commands(
    commands: CommandRegistry,
    pending: PendingApprovals,
    reprompt: Reprompt | None = None,
    reset: ResetSession | None = None,
    timezone_for: TimezoneFor | None = None,
) -> None:
    async def help_(rest: str, ctx: CommandContext) -> BrainReply:
        return BrainReply(
            text=commands.help_text(command_prefix(ctx.brain.origin.channel))
            + '\n\nOr just ask, e.g. "what time is it?". Risky actions wait for your approval.'
        )

    async def tools(rest: str, ctx: CommandContext) -> BrainReply:
        if not ctx.tools:
            return BrainReply(text="No tools are enabled.")
        lines = ["Tools:"]
        for tool in sorted(ctx.tools, key=lambda t: t.name):
            lines.append(f"• {tool.name} ({tool.risk.value}) — {tool.description}")
        return BrainReply(text="\n".join(lines))

    async def approvals(rest: str, ctx: CommandContext) -> BrainReply:
        rows = await pending()
        if not rows:
            return BrainReply(text="No approvals are pending.")
        lines = [f"{len(rows)} pending approval(s):"]
        zone = await timezone_for(ctx.brain.origin) if timezone_for is not None else None
        for row in rows:
            expires = clock_text(row.expires_at, zone)
            lines.append(f"• {row.id} — {escape_text(row.tool)} ({row.risk}), expires {expires}")
        here = str(ctx.brain.origin)
        again = [await reprompt(row) for row in rows if reprompt and row.prompt_to == here]
        if again:
            lines.append(
                f"The {len(again)} waiting for a decision here follow: answer each as it says."
            )
        lines.append("Or decide with: echo-bot approvals approve|deny ID")
        return BrainReply(text="\n".join(lines), attachments=again)

    async def tool(rest: str, ctx: CommandContext) -> BrainReply:
        name, _, raw_args = rest.partition(" ")
        if not name:
            return BrainReply(text="Usage: /tool NAME {json arguments}")
        raw_args = raw_args.strip() or "{}"
        if raw_args.startswith("@"):  # the arguments from a file: the terminal's owner only
            read = await _arguments_file(raw_args[1:].strip(), ctx)
            if isinstance(read, BrainReply):
                return read
            raw_args = read
        try:
            args = json.loads(raw_args)
        except json.JSONDecodeError as exc:
            return BrainReply(text=f"The arguments are not valid JSON: {exc.msg} (at {exc.pos}).")
        if not isinstance(args, dict):
            return BrainReply(text='The arguments must be a JSON object, like {"path": "x"}.')
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name=name, args=args)],
            route_reason=f"rules: command /tool {name}",
        )

    async def run(rest: str, ctx: CommandContext) -> BrainReply:
        if not rest:
            return BrainReply(text="Usage: /run COMMAND (runs without a shell; risky ones ask)")
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name="shell_exec", args={"command": rest})],
            route_reason="rules: command /run",
        )

    async def reset_(rest: str, ctx: CommandContext) -> BrainReply:
        if reset is None:
            return BrainReply(text="Resetting is not available here.")
        await reset(ctx.brain.session_key)
        return BrainReply(
            text="Started a fresh conversation. The earlier one stays in this chat's"
            " history: ask me about it and I search it (history_search)."
        )

    commands.register(Command("help", "show this help", help_))
    commands.register(Command("tools", "list the tools I can use", tools))
    commands.register(Command("approvals", "list pending approvals", approvals))
    commands.register(
        Command("tool", "run a tool explicitly", tool, usage="NAME {json} or NAME @FILE")
    )
    commands.register(Command("run", "run a shell command (no shell syntax)", run, usage="COMMAND"))
    commands.register(Command("new", "start a fresh conversation (the old one is kept)", reset_))
    commands.register(Command("reset", "start a fresh conversation in this chat", reset_))


ARGUMENTS_FILE_MAX = 1024 * 1024  # bytes of a /tool NAME @FILE file


async def _arguments_file(path: str, ctx: CommandContext) -> str | BrainReply:
    """The text of ``/tool NAME @FILE``'s file: for a call too long to type (a terminal
    passes at most 4095 bytes in one line). Only in the terminal, whose person is the
    daemon's owner at its machine: a chat never names files there."""
    if not is_local(ctx.brain.origin.channel):
        return BrainReply(
            text="/tool NAME @FILE reads a file of the daemon's machine: only in the terminal."
        )
    if not path:
        return BrainReply(text="Usage: /tool NAME @FILE (a file holding the JSON arguments)")

    def read() -> str:
        target = Path(path).expanduser()
        with target.open("rb") as handle:
            data = handle.read(ARGUMENTS_FILE_MAX + 1)
        if len(data) > ARGUMENTS_FILE_MAX:
            raise ValueError(f"it is over {ARGUMENTS_FILE_MAX // 1024} KB")
        return data.decode("utf-8")

    try:
        return await asyncio.to_thread(read)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return BrainReply(text=f"Cannot read the arguments from {path}: {why}.")
