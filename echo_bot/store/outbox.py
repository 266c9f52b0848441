"""The outbox: outbound committed first, delivered per chat in order, retried."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlite_utils import Database as SqlDb

from ..events import OutboundMessage, Receipt
from .db import Database

QUEUED, SENT, FAILED = "queued", "sent", "failed"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    seq: int
    message: OutboundMessage
    attempts: int


class SqliteOutbox:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def enqueue(self, message: OutboundMessage) -> None:
        await self._db.run(lambda db: enqueue_outbound(db, message))

    async def due(
        self,
        channels: Iterable[str],
        now: float,
        limit: int = 100,
        busy: Iterable[str] = (),
    ) -> tuple[list[OutboxRow], float | None]:
        """The head of each chat's queue whose next attempt is due, and when the next
        message of any other chat is due — both from one read, leaving out the ``busy``
        chats (chat keys with a send in flight: their head is that send)."""
        names = sorted(set(channels))
        if not names:
            return [], None
        marks = ",".join("?" for _ in names)
        skip = json.dumps(sorted(set(busy)))

        def query(db: SqlDb) -> tuple[list[OutboxRow], float | None]:
            cursor = db.execute(
                f"""
                SELECT o.seq, o.payload, o.attempts FROM outbox o
                JOIN (SELECT chat_key, MIN(seq) AS head FROM outbox
                      WHERE status = 'queued' AND channel IN ({marks})
                        AND chat_key NOT IN (SELECT value FROM json_each(?))
                      GROUP BY chat_key) h
                  ON o.seq = h.head
                WHERE o.next_attempt_at <= ? ORDER BY o.seq LIMIT ?
                """,
                [*names, skip, now, limit],
            )
            rows = [
                OutboxRow(r[0], OutboundMessage.model_validate_json(r[1]), r[2])
                for r in cursor.fetchall()
            ]
            # The chats of these rows are about to be busy too.
            taken = json.dumps([*json.loads(skip), *(str(r.message.to) for r in rows)])
            # Only a chat's head can be due: a message behind one waiting out a retry is not.
            next_at = db.execute(
                f"""
                SELECT MIN(o.next_attempt_at) FROM outbox o
                JOIN (SELECT MIN(seq) AS head FROM outbox
                      WHERE status = 'queued' AND channel IN ({marks})
                        AND chat_key NOT IN (SELECT value FROM json_each(?))
                      GROUP BY chat_key) h
                  ON o.seq = h.head
                """,
                [*names, taken],
            ).fetchone()[0]
            return rows, next_at

        return await self._db.run(query)

    async def receipt_of(self, outbound_id: str) -> str | None:
        def query(db: SqlDb) -> str | None:
            row = db.execute(
                "SELECT channel_message_id FROM receipts WHERE outbound_id = ?", [outbound_id]
            ).fetchone()
            return row[0] if row else None

        return await self._db.run(query)

    async def mark_sent(self, message: OutboundMessage, receipt: Receipt) -> bool:
        """Record the delivery; True when more messages wait for the same chat."""

        def write(db: SqlDb) -> bool:
            now = time.time()
            db.execute(
                "UPDATE outbox SET status = 'sent', attempts = attempts + 1, finished_at = ?"
                " WHERE id = ?",
                [now, message.id],
            )
            db.execute(
                "INSERT OR REPLACE INTO receipts VALUES (?, ?, ?, ?)",
                [message.id, message.to.channel, receipt.channel_message_id, now],
            )
            more = db.execute(
                "SELECT 1 FROM outbox WHERE status = 'queued' AND channel = ? AND chat_key = ?"
                " LIMIT 1",
                [message.to.channel, str(message.to)],
            ).fetchone()
            return more is not None

        return await self._db.run(write)

    async def mark_retry(self, outbound_id: str, error: str, next_attempt_at: float) -> None:
        await self._db.run(
            lambda db: db.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ?"
                " WHERE id = ?",
                [error, next_attempt_at, outbound_id],
            )
        )

    async def note_error(self, outbound_id: str, error: str) -> None:
        """Why a queued message is still queued, without counting an attempt."""
        await self._db.run(
            lambda db: db.execute(
                "UPDATE outbox SET last_error = ? WHERE id = ? AND status = 'queued'",
                [error, outbound_id],
            )
        )

    async def mark_failed(self, outbound_id: str, error: str) -> None:
        await self._db.run(
            lambda db: db.execute(
                "UPDATE outbox SET status = 'failed', attempts = attempts + 1, last_error = ?,"
                " finished_at = ? WHERE id = ?",
                [error, time.time(), outbound_id],
            )
        )

    async def pending_count(self, chat_key: str | None = None) -> int:
        def query(db: SqlDb) -> int:
            if chat_key is None:
                sql, args = "SELECT COUNT(*) FROM outbox WHERE status = 'queued'", []
            else:
                sql = "SELECT COUNT(*) FROM outbox WHERE status = 'queued' AND chat_key = ?"
                args = [chat_key]
            return db.execute(sql, args).fetchone()[0]

        return await self._db.run(query)


def head_of_chat(db: SqlDb, message: OutboundMessage) -> OutboxRow | None:
    """``message`` as an outbox row when it is the next to send in its chat (nothing
    queued before it), else None."""
    row = db.execute(
        "SELECT seq, id, attempts FROM outbox WHERE status = 'queued' AND channel = ?"
        " AND chat_key = ? ORDER BY seq LIMIT 1",
        [message.to.channel, str(message.to)],
    ).fetchone()
    if row is None or row[1] != message.id:
        return None
    return OutboxRow(row[0], message, row[2])


def enqueue_outbound(db: SqlDb, message: OutboundMessage) -> None:
    now = time.time()
    db.execute(
        "INSERT INTO outbox (id, channel, chat_key, payload, status, next_attempt_at,"
        " created_at) VALUES (?, ?, ?, ?, 'queued', ?, ?) ON CONFLICT(id) DO NOTHING",
        [message.id, message.to.channel, str(message.to), message.model_dump_json(), now, now],
    )
