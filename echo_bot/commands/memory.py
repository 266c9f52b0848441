"""/memory: this chat's memory notes, listed; ``/memory forget ID`` forgets one (a call
of the memory_forget tool, so it goes through the same policy and audit as the
model's)."""

from __future__ import annotations

from ..conversation import BrainReply, ToolCall
from ..events import new_id
from ..memory_notes import NOTES_MAX, MemoryNotes, listing
from ..plugins import command_prefix
from .registry import Command, CommandContext, CommandRegistry


def register_memory_commands(commands: CommandRegistry, notes: MemoryNotes) -> None:
    async def memory(rest: str, ctx: CommandContext) -> BrainReply:
        prefix = command_prefix(ctx.brain.origin.channel)
        words = rest.split()
        if words and words[0].lower() == "forget":
            if len(words) != 2:
                return BrainReply(text=f"Usage: {prefix}memory forget ID (the id in brackets)")
            call = ToolCall(id=new_id(), name="memory_forget", args={"id": words[1]})
            return BrainReply(tool_calls=[call], route_reason="rules: command /memory forget")
        if words:
            return BrainReply(text=f"Usage: {prefix}memory, or {prefix}memory forget ID")
        found = await notes.of(ctx.brain.session_key)
        if not found:
            return BrainReply(
                text="No memory notes in this chat. Ask me to remember something and I"
                " keep it here, for this chat only."
            )
        head = f"Memory notes of this chat ({len(found)} of {NOTES_MAX}):"
        tail = f"Forget one with {prefix}memory forget ID."
        return BrainReply(text=f"{head}\n{listing(found)}\n{tail}")

    usage = "[forget ID]"
    commands.register(Command("memory", "list this chat's memory notes, or forget one", memory,
                              usage=usage))  # fmt: skip
