"""/remind, /reminders, /cancel and /timezone, in every chat channel.

/remind, /reminders and /cancel become calls of the reminder tools, so they go
through the same policy, audit and replies as anything the brain decides.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..conversation import BrainReply, ToolCall
from ..dates import zone_of
from ..events import new_id
from ..scheduling.reminders import ReminderService
from ..scheduling.timeparse import Recurrence, When, parse_recurrence, parse_when
from .registry import Command, CommandContext, CommandRegistry

USAGE = (
    "Usage: /remind WHEN TEXT — e.g. /remind in 10 minutes stretch, "
    "/remind tomorrow 9:00 call the bank"
)
MAX_WHEN_WORDS = 7


def split_when(text: str, zone_name: str, languages: list[str], now: datetime) -> dict[str, str]:
    """The longest leading words that read as a time (or a repetition); the rest is text."""
    words = text.split()
    zone = zone_of(zone_name) or zone_of("UTC")
    assert zone is not None
    if words and words[0].lower() == "every":
        for k in range(min(MAX_WHEN_WORDS, len(words) - 1), 1, -1):
            phrase = " ".join(words[:k])
            if isinstance(parse_recurrence(phrase), Recurrence):
                return {"recurrence": phrase, "text": " ".join(words[k:])}
        return {"recurrence": " ".join(words[:4]), "text": " ".join(words[4:]) or text}
    for k in range(min(MAX_WHEN_WORDS, len(words) - 1), 0, -1):
        phrase = " ".join(words[:k])
        if isinstance(parse_when(phrase, zone, now, languages), When):
            return {"when": phrase, "text": " ".join(words[k:])}
    # Nothing read as a time: let the tool ask its question about the first words.
    k = min(3, max(1, len(words) - 1))
    return {"when": " ".join(words[:k]), "text": " ".join(words[k:]) or text}


def register_reminder_commands(commands: CommandRegistry, service: ReminderService) -> None:
    async def remind(rest: str, ctx: CommandContext) -> BrainReply:
        if len(rest.split()) < 2:
            return BrainReply(text=USAGE)
        chat = ctx.brain.origin
        zone = await service.timezone_for(chat)
        now = datetime.fromtimestamp(service.clock(), UTC)
        args = split_when(rest, zone, service.languages, now)
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name="reminder_create", args=args)],
            route_reason="rules: command /remind",
        )

    async def reminders(rest: str, ctx: CommandContext) -> BrainReply:
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name="reminder_list", args={})],
            route_reason="rules: command /reminders",
        )

    async def cancel(rest: str, ctx: CommandContext) -> BrainReply:
        if not rest:
            return BrainReply(text="Usage: /cancel ID (see /reminders for the ids)")
        return BrainReply(
            tool_calls=[
                ToolCall(id=new_id(), name="reminder_cancel", args={"id": rest.split()[0]})
            ],
            route_reason="rules: command /cancel",
        )

    async def timezone(rest: str, ctx: CommandContext) -> BrainReply:
        chat = ctx.brain.origin
        if not rest:
            current = await service.timezone_for(chat)
            return BrainReply(
                text=f"This chat uses {current}. Change it with /timezone Europe/Berlin."
            )
        outcome = await service.set_timezone(chat, rest.split()[0])
        return BrainReply(text=outcome.message)

    commands.register(Command("remind", "set a reminder", remind, usage="WHEN TEXT"))
    commands.register(Command("reminders", "list this chat's reminders", reminders))
    commands.register(Command("cancel", "cancel a reminder", cancel, usage="ID"))
    commands.register(
        Command("timezone", "show or set this chat's timezone", timezone, usage="[ZONE]")
    )
