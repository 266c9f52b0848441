"""Creating, listing and cancelling reminders: validation and the words users see.

The store is the source of truth: creating or cancelling a reminder announces
``ReminderChanged`` once committed, and the scheduler (when one runs in this process)
sets or clears its timer.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..dates import day_text, zone_of
from ..events import Address
from ..statuses import ReminderStatus
from ..store import ChatTimezoneChanged, Store, Tx
from ..store.reminders import ReminderRow
from .crontab import next_after
from .timeparse import MAX_AHEAD, Recurrence, Unclear, When, describe, parse_recurrence, parse_when

MAX_TEXT = 1000
ZONES_KEPT = 4096  # chats whose time zone is kept in memory (the oldest read is dropped)


@dataclass(frozen=True, slots=True)
class ReminderAnswer:
    """What a reminder request came to, in words for the asker (ok: it was done)."""

    ok: bool
    message: str
    reminder: ReminderRow | None = None


class ReminderService:
    def __init__(
        self,
        store: Store,
        *,
        timezone: str,
        languages: list[str],
        max_active: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.default_timezone = timezone
        self.languages = languages
        self.max_active = max_active
        self.clock = clock
        # Each chat's chosen zone (None: the default), read once: every current_time call
        # and reminder asks, and a store round trip cost 5 % of a turn. Kept true by the
        # committed change, which also voids a read that was under way meanwhile.
        self._zones: dict[str, str | None] = {}
        self._zone_changes = 0
        store.subscribe(ChatTimezoneChanged, self._zone_changed)

    async def timezone_for(self, chat: Address) -> str:
        key = str(chat)
        if key in self._zones:
            return self._zones[key] or self.default_timezone
        changes = self._zone_changes
        chosen = await self.store.run(lambda tx: tx.reminders.chat_timezone(key))
        if changes == self._zone_changes:
            if len(self._zones) >= ZONES_KEPT:
                del self._zones[next(iter(self._zones))]
            self._zones[key] = chosen
        return chosen or self.default_timezone

    def _zone_changed(self, event: ChatTimezoneChanged) -> None:
        self._zone_changes += 1
        self._zones[event.session_key] = event.timezone

    def forget_zones(self) -> None:
        """Another daemon on the shared store changed a chat's zone (which one, its
        notification does not say): read each again when next asked."""
        self._zone_changes += 1
        self._zones.clear()

    async def set_timezone(self, chat: Address, name: str) -> ReminderAnswer:
        zone = zone_of(name.strip())
        if zone is None or not name.strip():
            return ReminderAnswer(
                False, f"Unknown timezone “{name}”. Use an IANA name like Europe/Berlin."
            )
        await self.store.run(lambda tx: tx.reminders.set_chat_timezone(str(chat), zone.key))
        return ReminderAnswer(True, f"This chat now uses {zone.key} for times.")

    async def create(
        self,
        chat: Address,
        owner: str,
        text: str,
        *,
        when: str | None = None,
        recurrence: str | None = None,
        timezone: str | None = None,
        trace_id: str | None = None,
    ) -> ReminderAnswer:
        text = " ".join(text.split())
        if not text:
            return ReminderAnswer(False, "What should I remind you of? The text is empty.")
        if len(text) > MAX_TEXT:
            return ReminderAnswer(False, f"That reminder text is too long (at most {MAX_TEXT}).")
        zone_name = timezone or await self.timezone_for(chat)
        zone = zone_of(zone_name)
        if zone is None:
            return ReminderAnswer(False, f"Unknown timezone “{zone_name}”. Use e.g. Europe/Berlin.")
        now = datetime.fromtimestamp(self.clock(), UTC)
        cron: str | None = None
        described: str
        if recurrence:
            rule = parse_recurrence(recurrence)
            if isinstance(rule, Unclear):
                return ReminderAnswer(False, rule.question)
            assert isinstance(rule, Recurrence)
            try:  # off the loop: a schedule that never fires is searched to year 9999
                first = await asyncio.to_thread(next_after, rule.cron, zone, now.astimezone(zone))
            except ValueError as exc:
                return ReminderAnswer(False, f"That schedule is not valid: {exc}.")
            if first is None:
                return ReminderAnswer(False, "That schedule never fires.")
            cron, due = rule.cron, first
            described = f"{rule.description} ({zone.key}); first on {describe(first)}"
        elif when:
            parsed = parse_when(when, zone, now, self.languages)
            if isinstance(parsed, Unclear):
                return ReminderAnswer(False, parsed.question)
            assert isinstance(parsed, When)
            due = parsed.at
            described = describe(due)
        else:
            return ReminderAnswer(False, "When should I remind you? Give a time or a repetition.")
        if due - now > MAX_AHEAD:
            return ReminderAnswer(False, "That is more than 5 years away.")
        row = ReminderRow(
            id=secrets.token_hex(4),
            chat=str(chat),
            owner=owner,
            text=text,
            timezone=zone.key,
            recurrence=cron,
            next_at=due.timestamp(),
            status=ReminderStatus.ACTIVE,
            created_at=self.clock(),
            fired_count=0,
            last_fired_at=None,
            trace_id=trace_id,
        )

        def write(tx: Tx) -> bool:
            if tx.reminders.count_active(row.chat) >= self.max_active:
                return False
            tx.reminders.insert(row)
            return True

        if not await self.store.run(write):
            return ReminderAnswer(
                False,
                f"This chat already has {self.max_active} active reminders, the most I keep. "
                "Cancel some with /cancel ID first.",
            )
        said = f"OK, I will remind you {described}: “{text}” (id {row.id})."
        return ReminderAnswer(True, said, row)

    async def list(self, chat: Address | None) -> list[ReminderRow]:
        key = str(chat) if chat is not None else None
        return await self.store.run(lambda tx: tx.reminders.active(key))

    async def cancel(self, chat: Address | None, reminder_id: str) -> ReminderAnswer:
        """Cancel ``reminder_id``; from a chat, only that chat's own reminders."""
        reminder_id = reminder_id.strip().lower()

        def write(tx: Tx) -> ReminderRow | None:
            row = tx.reminders.get(reminder_id)
            if row is None or (chat is not None and row.chat != str(chat)):
                return None  # someone else's reminders are not even acknowledged
            if row.status != ReminderStatus.ACTIVE:
                return row
            tx.reminders.set_status(reminder_id, ReminderStatus.CANCELLED)
            return row

        row = await self.store.run(write)
        if row is None:
            return ReminderAnswer(False, f"There is no reminder {reminder_id} in this chat.")
        if row.status != ReminderStatus.ACTIVE:
            return ReminderAnswer(False, f"Reminder {reminder_id} is already {row.status}.")
        return ReminderAnswer(True, f"Cancelled reminder {reminder_id}: “{row.text}”.", row)


def render_list(rows: list[ReminderRow]) -> str:
    if not rows:
        return "No reminders are set here."
    lines = [f"{len(rows)} reminder(s):"]
    for row in rows:
        zone = zone_of(row.timezone) or UTC
        due = datetime.fromtimestamp(row.next_at, zone)
        repeat = f", repeats ({row.recurrence})" if row.recurrence else ""
        lines.append(f"• {row.id} — {day_text(due)} {due:%H:%M} {row.timezone}{repeat}: {row.text}")
    return "\n".join(lines)
