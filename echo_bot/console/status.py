"""The console's Status page: what ``echo-bot status`` says (read the same way:
``overview.read``), this daemon's components' health, usage and budget per day, and the
active reminders, each with a Cancel button (``overview.cancel_reminder``, as
``echo-bot reminders cancel`` does). An approver sees the reminders and usage of the
chats they may see (``scope.Scope``); the owner all."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import overview
from ..approvals.display import clip
from ..events import Address, OutboundKind, OutboundMessage
from ..statuses import ReminderStatus
from ..store import Tx
from ..store.audit import UsageRow
from ..store.reminders import ReminderRow
from .scope import Scope

if TYPE_CHECKING:
    from aiohttp import web

    from .web import Console, Visitor

_REMINDER = re.compile(r"^[0-9a-f]{4,32}$")
# Days of usage shown, the newest.
USAGE_DAYS = 14
NOTES = {
    "cancelled": "Reminder {id} is cancelled.",
    "gone": "There is no active reminder {id} that you may cancel.",
}


@dataclass(frozen=True, slots=True)
class DayUsage:
    day: str
    calls: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    status: str
    details: list[tuple[str, str]]  # the rest of its state, masked: (key, value) pairs


def _value(value: object) -> str:
    """A health detail as a person reads it: text and numbers as they are, anything
    else as compact JSON."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def per_day(rows: list[UsageRow], scope: Scope) -> list[DayUsage]:
    days: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in rows:
        if scope.sees(None if row.session_key == "-" else row.session_key):
            total = days[row.day]
            total[0] += row.calls
            total[1] += row.prompt_tokens
            total[2] += row.completion_tokens
    newest = sorted(days, reverse=True)[:USAGE_DAYS]
    return [DayUsage(day, *days[day]) for day in newest]


class StatusPage:
    def __init__(self, console: Console) -> None:
        self.console = console

    async def handle(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        console = self.console
        user = visitor.user
        today = datetime.now(console.clock.zone).replace(hour=0, minute=0, second=0, microsecond=0)

        def read(tx: Tx) -> tuple[overview.Overview, list[UsageRow], int, Scope]:
            return (
                overview.read(tx),
                tx.audit.usage_by_day(),
                tx.audit.tokens_since(today.timestamp()),
                Scope.read(tx, user),
            )

        seen, usage, used_today, scope = await console.store.run(read)
        note = NOTES.get(request.query.get("note", ""), "")
        reminder_id = request.query.get("id", "")
        shown_note = note.format(id=reminder_id) if note and _REMINDER.match(reminder_id) else ""
        config = console.live.current.loaded.config
        owner = visitor.user.owner
        return console.render(
            request,
            "status.html",
            visitor,
            owner=owner,
            seen=seen,
            live=[(row, overview.holding(seen.held.get(row.name, []))) for row in seen.live],
            gone=seen.gone,
            mcp=[
                (name, self._mcp_state(server, owner)) for name, server in sorted(seen.mcp.items())
            ],
            components=self._components(details=owner),
            reminders=[r for r in seen.reminders if scope.sees(r.chat)],
            usage=per_day(usage, scope),
            used_today=used_today if owner else None,
            budget=config.openai.daily_token_budget,
            note=shown_note,
        )

    def _mcp_state(self, server: dict[str, Any], owner: bool) -> str:
        """For the owner, the state and why (masked); for an approver the state word only:
        an error text may name the server's URLs or hosts, as components' details may."""
        if not owner:
            return str(server.get("state"))
        return str(self.console.gate.masker.mask_data(overview.mcp_state(server)))

    def _components(self, *, details: bool) -> list[Component]:
        """The HTTP server's health checks (channels, MCP, the store…): their states,
        and (``details``: for the owner, as ``/healthz`` for an admin) the rest, masked."""
        _, body = self.console.http.health()
        masker = self.console.gate.masker
        found: list[Component] = []
        for name, state in sorted(body["components"].items()):
            rest = masker.mask_data({k: v for k, v in state.items() if k != "status"})
            pairs = [(str(k), _value(v)) for k, v in rest.items()] if details else []
            found.append(Component(str(name), str(state.get("status")), pairs))
        return found

    async def cancel(
        self, request: web.Request, visitor: Visitor, fields: dict[str, str]
    ) -> web.StreamResponse:
        from .web import see_other

        console = self.console
        reminder_id = request.match_info["id"]
        if not _REMINDER.match(reminder_id):
            return see_other("/console/status?note=gone")
        user = visitor.user
        confirmed = fields.get("confirm") == "yes"

        def cancel(tx: Tx) -> tuple[str, ReminderRow | None]:
            row: ReminderRow | None = tx.reminders.get(reminder_id)
            if row is None or row.status != ReminderStatus.ACTIVE:
                return "gone", None
            if not Scope.read(tx, user).sees(row.chat):
                return "gone", None
            if not confirmed:
                return "confirm", row
            if overview.cancel_reminder(tx, reminder_id):
                return "gone", None
            # The chat the reminder was for is told, in the same commit.
            tx.outbox.add(
                OutboundMessage(
                    to=Address.parse(row.chat),
                    text=f"⏰ Reminder {row.id} (“{clip(row.text, 80)}”) was cancelled by"
                    f" {user.label} in the console.",
                    kind=OutboundKind.NOTICE,
                )
            )
            return "cancelled", None

        note, row = await console.store.run(cancel)
        if note == "confirm" and row is not None:
            return console.render(request, "cancel.html", visitor, r=row)
        return see_other(f"/console/status?note={note}&id={reminder_id}")
