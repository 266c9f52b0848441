"""/history: what the model reads of this chat now (the runtime says, through ``view``:
the commands never read the brains)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..conversation import BrainReply
from .registry import Command, CommandContext, CommandRegistry

# The text of the view of a session (its key), its newest lines only when given.
HistoryView = Callable[[str, int | None], Awaitable[str]]
SHOWN_LINES = 20  # lines of the view a chat message shows


def register_history_command(commands: CommandRegistry, view: HistoryView) -> None:
    async def history(rest: str, ctx: CommandContext) -> BrainReply:
        return BrainReply(text=await view(ctx.brain.session_key, SHOWN_LINES))

    commands.register(Command("history", "what the model reads of this chat now", history))
