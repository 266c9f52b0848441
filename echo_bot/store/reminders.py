"""Reminders in SQLite. Firing an occurrence is compare-and-set on a fire marker."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..statuses import ReminderStatus
from .committed import ChatTimezoneChanged, ReminderChanged
from .sql import SqlDb

if TYPE_CHECKING:
    from .tx import Tx

_COLUMNS = (
    "id, chat, owner, text, timezone, recurrence, next_at, status, created_at, fired_count,"
    " last_fired_at, trace_id"
)


@dataclass(frozen=True, slots=True)
class ReminderRow:
    id: str
    chat: str
    owner: str
    text: str
    timezone: str
    recurrence: str | None
    next_at: float
    status: ReminderStatus
    created_at: float
    fired_count: int
    last_fired_at: float | None
    trace_id: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ReminderStatus(self.status))


class ReminderRepo:
    __slots__ = ("_db", "_tx")

    def __init__(self, db: SqlDb, tx: Tx) -> None:
        self._db, self._tx = db, tx

    def insert(self, row: ReminderRow) -> None:
        self._db.execute(
            f"INSERT INTO reminders ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                row.id, row.chat, row.owner, row.text, row.timezone, row.recurrence, row.next_at,
                row.status, row.created_at, row.fired_count, row.last_fired_at, row.trace_id,
            ],
        )  # fmt: skip
        self._tx.announce(ReminderChanged(row.id))

    def get(self, reminder_id: str) -> ReminderRow | None:
        raw = self._db.execute(
            f"SELECT {_COLUMNS} FROM reminders WHERE id = ?", [reminder_id]
        ).fetchone()
        return ReminderRow(*raw) if raw else None

    def active(self, chat: str | None = None) -> list[ReminderRow]:
        if chat is None:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM reminders WHERE status = ? ORDER BY next_at",
                [ReminderStatus.ACTIVE],
            ).fetchall()
        else:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM reminders WHERE status = ? AND chat = ? ORDER BY next_at",
                [ReminderStatus.ACTIVE, chat],
            ).fetchall()
        return [ReminderRow(*r) for r in rows]

    def count_active(self, chat: str) -> int:
        return int(
            self._db.execute(
                "SELECT COUNT(*) FROM reminders WHERE status = ? AND chat = ?",
                [ReminderStatus.ACTIVE, chat],
            ).fetchone()[0]
        )

    def set_status(
        self,
        reminder_id: str,
        status: ReminderStatus,
        *,
        only_if: ReminderStatus = ReminderStatus.ACTIVE,
    ) -> bool:
        cursor = self._db.execute(
            "UPDATE reminders SET status = ? WHERE id = ? AND status = ?",
            [status, reminder_id, only_if],
        )
        changed = cursor.rowcount == 1
        if changed:
            self._tx.announce(ReminderChanged(reminder_id))
        return changed

    def mark_fired(
        self, row: ReminderRow, occurrence: float, *, late_by: float, outcome: str
    ) -> bool:
        """Record that ``occurrence`` fired; False when it already had (never twice)."""
        cursor = self._db.execute(
            "INSERT INTO reminder_fires (reminder_id, occurrence, fired_at, late_by, outcome)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [row.id, occurrence, time.time(), late_by, outcome],
        )
        if cursor.rowcount != 1:
            return False
        self._db.execute(
            "UPDATE reminders SET fired_count = fired_count + 1, last_fired_at = ? WHERE id = ?",
            [time.time(), row.id],
        )
        return True

    def advance(self, reminder_id: str, next_at: float) -> None:
        self._db.execute("UPDATE reminders SET next_at = ? WHERE id = ?", [next_at, reminder_id])

    def chat_timezone(self, session_key: str) -> str | None:
        row = self._db.execute(
            "SELECT timezone FROM chat_settings WHERE session_key = ?", [session_key]
        ).fetchone()
        return row[0] if row else None

    def set_chat_timezone(self, session_key: str, timezone: str) -> None:
        self._db.execute(
            "INSERT INTO chat_settings (session_key, timezone) VALUES (?, ?)"
            " ON CONFLICT(session_key) DO UPDATE SET timezone = excluded.timezone",
            [session_key, timezone],
        )
        self._tx.announce(ChatTimezoneChanged(session_key, timezone))

    def chat_model(self, session_key: str) -> str | None:
        """The model the chat chose with /model (None: the default)."""
        row = self._db.execute(
            "SELECT model FROM chat_settings WHERE session_key = ?", [session_key]
        ).fetchone()
        return row[0] if row else None

    def set_chat_model(self, session_key: str, model: str | None) -> None:
        self._db.execute(
            "INSERT INTO chat_settings (session_key, model) VALUES (?, ?)"
            " ON CONFLICT(session_key) DO UPDATE SET model = excluded.model",
            [session_key, model],
        )

    def cron_last(self, job: str) -> float | None:
        row = self._db.execute(
            "SELECT last_occurrence FROM cron_state WHERE job = ?", [job]
        ).fetchone()
        return row[0] if row else None

    def set_cron_last(self, job: str, occurrence: float) -> None:
        self._db.execute(
            "INSERT INTO cron_state (job, last_occurrence) VALUES (?, ?)"
            " ON CONFLICT(job) DO UPDATE SET"
            " last_occurrence = CASE WHEN excluded.last_occurrence > cron_state.last_occurrence"
            " THEN excluded.last_occurrence ELSE cron_state.last_occurrence END",
            [job, occurrence],
        )

    def fire_outcomes(self) -> list[str]:
        """The outcome of every fire recorded (of any reminder), in the order they fired."""
        rows = self._db.execute(
            "SELECT outcome FROM reminder_fires ORDER BY fired_at, reminder_id, occurrence"
        ).fetchall()
        return [row[0] for row in rows]
