"""The core's commands: /help, /tools, /approvals, /tool, /run."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from ..approvals.display import escape_text
from ..conversation import BrainReply, ToolCall
from ..dates import clock_text
from ..events import Address, OutboundMessage, new_id
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
            text=commands.help_text()
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
        return BrainReply(text="Started a fresh conversation: earlier messages are forgotten.")

    commands.register(Command("help", "show this help", help_))
    commands.register(Command("tools", "list the tools I can use", tools))
    commands.register(Command("approvals", "list pending approvals", approvals))
    commands.register(Command("tool", "run a tool explicitly", tool, usage="NAME {json}"))
    commands.register(Command("run", "run a shell command (no shell syntax)", run, usage="COMMAND"))
    commands.register(Command("reset", "start a fresh conversation in this chat", reset_))
