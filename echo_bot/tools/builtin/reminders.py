"""reminder_create, reminder_list, reminder_cancel: reminders that belong to their chat.

Creating or cancelling a reminder affects only the requester's own chat, so it does
not ask for approval there. Reminders made by webhooks and cron go to their deliver_to.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from ...events import Address
from ...scheduling.reminders import ReminderService, render_list
from ..base import ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult

_RECURRING_FIRST = re.compile(
    r"^(?P<rec>every\s+.+?)[\s,]+remind me\s+(?:to\s+)?(?P<text>.+)$", re.I | re.S
)
_RECURRING_INSIDE = re.compile(
    r"remind me\s+(?P<rec>every\s+\S+\s+at\s+\d{1,2}(?::\d{2})?\s*(?:[ap]m)?)"
    r"\s+(?:to\s+)?(?P<text>.+)$",
    re.I | re.S,
)
_WHEN_FIRST = re.compile(r"remind me\s+(?P<when>.+?)\s+to\s+(?P<text>.+)$", re.I | re.S)
_WHEN_LAST = re.compile(
    r"remind me\s+to\s+(?P<text>.+?)\s+(?P<when>(?:in|at|on|tomorrow|next|this)\b.+)$", re.I | re.S
)


def _chat(ctx: ToolContext) -> Address:
    return ctx.answer_to or ctx.origin


class ReminderCreateTool(Tool):
    name: ClassVar[str] = "reminder_create"
    description: ClassVar[str] = (
        "Set a reminder in this chat: a one-off `when` (e.g. 'in 10 minutes', 'tomorrow at "
        "9am', 'friday at noon') or a `recurrence` ('every weekday at 8:30', 'every day at "
        "21:00', or a 5-field cron line). The answer repeats the absolute time and timezone."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 1000},
            "when": {"type": "string", "minLength": 1, "maxLength": 200},
            "recurrence": {"type": "string", "minLength": 1, "maxLength": 100},
            "timezone": {"type": "string", "minLength": 1, "maxLength": 64},
        },
        "required": ["text"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("when", "recurrence", "timezone")
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "messaging"
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "origin_chat"
    timeout: ClassVar[float] = 15.0
    triggers: ClassVar[tuple[str, ...]] = ("remind me", "set a reminder", "reminder to")
    negative_triggers: ClassVar[tuple[str, ...]] = (
        "my reminders", "list reminders", "cancel reminder", "cancel the reminder",
    )  # fmt: skip

    def __init__(self, service: ReminderService) -> None:
        self.service = service

    def extract_args(self, text: str) -> dict[str, Any] | None:
        text = text.strip().rstrip(".!")
        for pattern, key in (
            (_RECURRING_FIRST, "recurrence"),
            (_RECURRING_INSIDE, "recurrence"),
            (_WHEN_LAST, "when"),
            (_WHEN_FIRST, "when"),
        ):
            match = pattern.search(text)
            if match:
                value = match.group("rec" if key == "recurrence" else "when").strip(" ,")
                return {"text": match.group("text").strip(), key: value}
        return None

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not args.get("when") and not args.get("recurrence"):
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                "When should I remind you? Give `when` (e.g. 'in 10 minutes') or `recurrence`.",
            )
        outcome = await self.service.create(
            _chat(ctx),
            ctx.user.id,
            args["text"],
            when=args.get("when"),
            recurrence=args.get("recurrence"),
            timezone=args.get("timezone"),
            trace_id=ctx.trace_id,
        )
        if not outcome.ok:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, outcome.message)
        row = outcome.reminder
        assert row is not None
        return ToolResult.success(outcome.message, id=row.id, next_at=row.next_at)


class ReminderListTool(Tool):
    name: ClassVar[str] = "reminder_list"
    description: ClassVar[str] = "List this chat's active reminders with their ids and times."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "messaging"
    idempotent: ClassVar[bool] = True
    triggers: ClassVar[tuple[str, ...]] = ("my reminders", "list reminders", "what reminders")

    def __init__(self, service: ReminderService) -> None:
        self.service = service

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        rows = await self.service.list(_chat(ctx))
        return ToolResult.success(render_list(rows), count=len(rows))


class ReminderCancelTool(Tool):
    name: ClassVar[str] = "reminder_cancel"
    description: ClassVar[str] = "Cancel one of this chat's reminders by its id."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"id": {"type": "string", "minLength": 1, "maxLength": 64}},
        "required": ["id"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("id",)
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "messaging"
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "origin_chat"
    triggers: ClassVar[tuple[str, ...]] = (
        "cancel reminder",
        "cancel the reminder",
        "delete reminder",
    )

    def __init__(self, service: ReminderService) -> None:
        self.service = service

    def extract_args(self, text: str) -> dict[str, Any] | None:
        match = re.search(r"\b([0-9a-f]{8})\b", text.lower())
        return {"id": match.group(1)} if match else None

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        outcome = await self.service.cancel(_chat(ctx), args["id"])
        if not outcome.ok:
            return ToolResult.failure(ErrorCode.NOT_FOUND, outcome.message)
        return ToolResult.success(outcome.message)
