"""The inbox: every inbound committed (deduplicated) before anyone acknowledges it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlite_utils import Database as SqlDb

from ..bus import Published
from ..events import InboundMessage, InboundStatus
from .db import Database


@dataclass(frozen=True, slots=True)
class InboxRow:
    seq: int
    message: InboundMessage
    status: InboundStatus
    error: str | None


def _row(raw: dict) -> InboxRow:  # type: ignore[type-arg]
    return InboxRow(
        seq=raw["seq"],
        message=InboundMessage.model_validate_json(raw["payload"]),
        status=InboundStatus(raw["status"]),
        error=raw["error"],
    )


class SqliteInbox:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, message: InboundMessage) -> Published:
        return await self._db.run(lambda db: add_inbound(db, message))

    async def after(self, seq: int, limit: int = 500) -> list[InboxRow]:
        """Rows committed after ``seq`` (also by other processes), oldest first."""
        return await self._db.run(lambda db: rows_after(db, seq, limit))

    async def unfinished(self) -> tuple[list[InboxRow], int]:
        """Every row not yet finished, and the newest seq — from one snapshot, so a row
        committed meanwhile is either in the list or after the seq, never both."""

        def query(db: SqlDb) -> tuple[list[InboxRow], int]:
            cursor = db.execute(
                "SELECT * FROM inbox WHERE status IN (?, ?, ?) ORDER BY seq",
                [InboundStatus.ACCEPTED, InboundStatus.RUNNING, InboundStatus.WAITING_APPROVAL],
            )
            rows = [_row(dict(r)) for r in cursor.fetchall()]
            last = db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbox").fetchone()[0]
            return rows, last

        return await self._db.run(query)

    async def get(self, inbound_id: str) -> InboxRow | None:
        return await self._db.run(lambda db: get_inbound(db, inbound_id))

    async def status_of(self, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
        def query(db: SqlDb) -> tuple[InboundStatus, str | None] | None:
            row = db.execute(
                "SELECT status, error FROM inbox WHERE id = ?", [inbound_id]
            ).fetchone()
            return (InboundStatus(row[0]), row[1]) if row else None

        return await self._db.run(query)

    async def describe(self, inbound_id: str) -> dict[str, object] | None:
        return await self._db.run(lambda db: describe_inbound(db, inbound_id))

    async def set_status(
        self, inbound_id: str, status: InboundStatus, error: str | None = None
    ) -> None:
        await self._db.run(lambda db: set_inbound_status(db, inbound_id, status, error))


# How long (channel, external_id) stays a duplicate: 7 days (webhook senders retry for
# days); Telegram's at least 48 h but under a week, as it may hand out an update_id
# again after a week of silence.
DEDUP_WINDOW = 7 * 86400.0
DEDUP_WINDOWS = {"telegram": 72 * 3600.0}


def add_inbound(db: SqlDb, message: InboundMessage) -> Published:
    now = time.time()
    if message.external_id is not None:
        # An old row with the same key is history, not a duplicate: retire its key.
        db.execute(
            "UPDATE inbox SET external_id = external_id || '#' || seq"
            " WHERE channel = ? AND external_id = ? AND received_at < ?",
            [
                message.address.channel,
                message.external_id,
                now - DEDUP_WINDOWS.get(message.address.channel, DEDUP_WINDOW),
            ],
        )
    cursor = db.execute(
        "INSERT INTO inbox (id, kind, channel, session_key, external_id, payload, status,"
        " received_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        [
            message.id,
            message.kind,
            message.address.channel,
            message.session_key,
            message.external_id,
            message.model_dump_json(),
            InboundStatus.ACCEPTED,
            message.received_at.timestamp(),
            now,
        ],
    )
    if cursor.rowcount == 1:
        return Published(inbound_id=message.id, duplicate=False)
    existing = db.execute(
        "SELECT id FROM inbox WHERE (channel = ? AND external_id = ?) OR id = ?",
        [message.address.channel, message.external_id, message.id],
    ).fetchone()
    return Published(inbound_id=existing[0] if existing else message.id, duplicate=True)


def rows_after(db: SqlDb, seq: int, limit: int) -> list[InboxRow]:
    cursor = db.execute("SELECT * FROM inbox WHERE seq > ? ORDER BY seq LIMIT ?", [seq, limit])
    return [_row(dict(r)) for r in cursor.fetchall()]


def get_inbound(db: SqlDb, inbound_id: str) -> InboxRow | None:
    raw = db.execute("SELECT * FROM inbox WHERE id = ?", [inbound_id]).fetchone()
    return _row(dict(raw)) if raw else None


def set_inbound_status(
    db: SqlDb,
    inbound_id: str,
    status: InboundStatus,
    error: str | None = None,
    result: str | None = None,
) -> None:
    db.execute(
        "UPDATE inbox SET status = ?, error = ?, result = COALESCE(?, result), updated_at = ?"
        " WHERE id = ?",
        [status, error, result[:2000] if result else None, time.time(), inbound_id],
    )


def describe_inbound(db: SqlDb, inbound_id: str) -> dict[str, object] | None:
    row = db.execute(
        "SELECT id, kind, channel, session_key, status, error, result, received_at, updated_at"
        " FROM inbox WHERE id = ?",
        [inbound_id],
    ).fetchone()
    if row is None:
        return None
    keys = ("id", "kind", "channel", "session", "status", "error", "result", "received_at",
            "updated_at")  # fmt: skip
    return dict(zip(keys, row, strict=True))
