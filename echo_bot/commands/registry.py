"""The command registry every chat channel shares (``/help``, ``/tools``, …).

Telegram's ``setMyCommands`` and ``/help`` are generated from it; later features add
their commands here rather than in a channel. The turn runner asks it before any brain
(``answer``): a command answers for itself and never reaches a model.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..conversation import BrainContext, BrainReply, ChatMessage
from ..plugins import command_prefix
from ..tools.base import Tool


@dataclass(frozen=True, slots=True)
class CommandContext:
    brain: BrainContext
    tools: Sequence[Tool]


CommandHandler = Callable[[str, CommandContext], Awaitable[BrainReply]]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,32})(?:@[A-Za-z0-9_]+)?(?:\s+(.*))?$", re.S)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    handler: CommandHandler
    usage: str = ""


class CommandRegistry:
    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def register(self, command: Command) -> None:
        if not _NAME.match(command.name):
            raise ValueError(f"bad command name {command.name!r}")
        if command.name in self._commands:
            raise ValueError(f"command /{command.name} is registered twice")
        self._commands[command.name] = command

    def get(self, name: str) -> Command | None:
        return self._commands.get(name.lower())

    def all(self) -> list[Command]:
        return list(self._commands.values())

    @staticmethod
    def parse(text: str) -> tuple[str, str] | None:
        """``("name", "rest")`` for a slash command (``/cmd@bot args`` too), else None."""
        match = _COMMAND.match(text.strip())
        if not match:
            return None
        return match.group(1).lower(), (match.group(2) or "").strip()

    async def answer(
        self, text: str, context: BrainContext, tools: Sequence[Tool]
    ) -> BrainReply | None:
        """The reply of the command ``text`` is, or None when it is not a command."""
        parsed = self.parse(text)
        return None if parsed is None else await self.run(*parsed, context, tools)

    async def run(
        self, name: str, rest: str, context: BrainContext, tools: Sequence[Tool]
    ) -> BrainReply:
        """Command ``name``'s reply to ``rest`` (an unknown command is told so)."""
        command = self.get(name)
        if command is None:
            mark = command_prefix(context.origin.channel)
            return BrainReply(
                text=f"Unknown command {mark}{name}. Send {mark}help for the list.",
                route_reason=f"rules: unknown command /{name}",
            )
        reply = await command.handler(rest, CommandContext(brain=context, tools=tools))
        return BrainReply(
            text=reply.text,
            tool_calls=reply.tool_calls,
            route_reason=reply.route_reason or f"rules: command /{name}",
            attachments=reply.attachments,
            shown=reply.shown,
        )

    def help_text(self, prefix: str = "/") -> str:
        """The commands as people type them where ``prefix`` starts one (``!`` on Slack)."""
        lines = ["Commands:"]
        for command in self._commands.values():
            usage = f" {command.usage}" if command.usage else ""
            lines.append(f"{prefix}{command.name}{usage} — {command.help}")
        return "\n".join(lines)


def trailing_results(conversation: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The tool results the conversation ends with, oldest first (a step just closed)."""
    trailing: list[ChatMessage] = []
    for message in reversed(conversation):
        if message.role != "tool":
            break
        trailing.append(message)
    return list(reversed(trailing))


def summarise_results(results: Sequence[ChatMessage]) -> str:
    """Tool results as a reply: the one result's text, or each named."""
    parts = []
    for message in results:
        content = (message.content or "").strip() or "(no output)"
        parts.append(content if len(results) == 1 else f"{message.name}: {content}")
    return "\n\n".join(parts)
