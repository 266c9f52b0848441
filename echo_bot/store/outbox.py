"""The outbox: outbound committed first, delivered per chat in order, retried."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..events import OutboundMessage, Receipt
from .committed import OutboundCommitted
from .sql import Cursor, SqlDb, read_later

if TYPE_CHECKING:
    from .tx import Tx

QUEUED, SENT, FAILED = "queued", "sent", "failed"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    seq: int
    message: OutboundMessage
    attempts: int
    # Messages queued behind this one for its chat when it was read.
    behind: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One outbound as stored: where its delivery stands."""

    id: str
    chat_key: str
    status: str  # QUEUED, SENT or FAILED
    attempts: int
    last_error: str | None
    next_attempt_at: float
    created_at: float
    message: OutboundMessage


class OutboxRepo:
    """The outbox: what the delivery worker sends, per chat in order, and its receipts."""

    __slots__ = ("_db", "_tx")

    def __init__(self, db: SqlDb, tx: Tx) -> None:
        self._db, self._tx = db, tx

    def add(self, message: OutboundMessage) -> None:
        """Queue ``message`` for delivery (per-chat FIFO); the worker is told on COMMIT,
        with the message itself when nothing else is queued for its chat (it is due now,
        nothing ahead of it: the worker sends it without reading it back)."""
        now = time.time()
        chat_key, payload = str(message.to), message.model_dump_json()
        # Its seq, and whether anything queued for its chat is ahead of it, in one go,
        # read once committed (only the worker, told then, needs them).
        cursor = self._db.conn.execute(
            # Due at once by any daemon's clock (0): the one delivering may run behind
            # the one that queued it, and a reply would wait out the difference.
            "INSERT INTO outbox (id, channel, chat_key, payload, status, next_attempt_at,"
            " created_at) VALUES (?, ?, ?, ?, 'queued', 0, ?) ON CONFLICT(id) DO NOTHING"
            " RETURNING seq, EXISTS (SELECT 1 FROM outbox o WHERE o.status = 'queued'"
            " AND o.channel = ? AND o.chat_key = ? AND o.seq < outbox.seq)",
            [message.id, message.to.channel, chat_key, payload, now,
             message.to.channel, chat_key],
        )  # fmt: skip
        event = OutboundCommitted(frozenset((chat_key,)))
        self._tx.announce(event)

        def with_head(cursor: Cursor) -> None:
            stored = cursor.fetchone()
            if stored is not None and not stored[1]:
                # As ``due`` would read it back: what is sent is what was stored.
                head = OutboxRow(stored[0], OutboundMessage.model_validate_json(payload), 0)
                self._tx.replace(event, OutboundCommitted(event.chat_keys, head))

        read_later(self._db, cursor, with_head)

    def due(
        self, channels: list[str], now: float, limit: int, busy: list[str]
    ) -> tuple[list[OutboxRow], float | None]:
        """Each chat's head due by ``now`` (not the ``busy`` chats; ``channels`` not
        empty) and when the next of the other heads is due, in one read: every chat's
        head (only a chat's head can be due: a message behind one waiting out a retry is
        not), with its payload when it is due."""
        marks = ",".join("?" for _ in channels)
        not_busy = f"AND chat_key NOT IN ({','.join('?' for _ in busy)})" if busy else ""
        heads = self._db.execute(
            f"""
            SELECT o.seq, CASE WHEN o.next_attempt_at <= ? THEN o.payload END, o.attempts,
                   o.next_attempt_at, h.queued
            FROM outbox o
            JOIN (SELECT MIN(seq) AS head, COUNT(*) AS queued FROM outbox
                  WHERE status = 'queued' AND channel IN ({marks}) {not_busy}
                  GROUP BY chat_key) h
              ON o.seq = h.head
            ORDER BY o.seq
            """,
            [now, *channels, *busy],
        ).fetchall()
        rows: list[OutboxRow] = []
        next_at: float | None = None  # of the heads not returned
        for seq, payload, attempts, at, queued in heads:
            if payload is not None and len(rows) < limit:
                message = OutboundMessage.model_validate_json(payload)
                rows.append(OutboxRow(seq, message, attempts, queued - 1))
            elif next_at is None or at < next_at:
                next_at = at
        return rows, next_at

    def receipt_of(self, outbound_id: str) -> str | None:
        row = self._db.execute(
            "SELECT channel_message_id FROM receipts WHERE outbound_id = ?", [outbound_id]
        ).fetchone()
        return row[0] if row else None

    def mark_sent(self, message: OutboundMessage, receipt: Receipt) -> None:
        """Record the delivery (and its receipt, for edits of it)."""
        now = time.time()
        self._db.execute(
            "UPDATE outbox SET status = 'sent', attempts = attempts + 1, finished_at = ?"
            " WHERE id = ?",
            [now, message.id],
        )
        self._db.execute(
            "INSERT INTO receipts (outbound_id, channel, channel_message_id, delivered_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (outbound_id) DO UPDATE SET"
            " channel = excluded.channel, channel_message_id = excluded.channel_message_id,"
            " delivered_at = excluded.delivered_at",
            [message.id, message.to.channel, receipt.channel_message_id, now],
        )

    def mark_retry(
        self, outbound_id: str, error: str, next_attempt_at: float, *, counted: bool = True
    ) -> None:
        """Tried again at ``next_attempt_at``; ``counted=False``: a try that does not
        count against the attempts (its channel could not reach its network)."""
        self._db.execute(
            "UPDATE outbox SET attempts = attempts + ?, last_error = ?, next_attempt_at = ?"
            " WHERE id = ? AND status = 'queued'",
            [1 if counted else 0, error, next_attempt_at, outbound_id],
        )

    def note_error(self, outbound_id: str, error: str) -> None:
        self._db.execute(
            "UPDATE outbox SET last_error = ? WHERE id = ? AND status = 'queued'",
            [error, outbound_id],
        )

    def mark_failed(self, outbound_id: str, error: str) -> None:
        self._db.execute(
            "UPDATE outbox SET status = 'failed', attempts = attempts + 1, last_error = ?,"
            " finished_at = ? WHERE id = ? AND status = 'queued'",  # never over a sent one
            [error, time.time(), outbound_id],
        )

    def pending_count(self, chat_key: str | None = None) -> int:
        if chat_key is None:
            found = self._db.execute("SELECT COUNT(*) FROM outbox WHERE status = 'queued'")
            return int(found.fetchone()[0])
        return int(
            self._db.execute(
                "SELECT COUNT(*) FROM outbox WHERE status = 'queued' AND chat_key = ?", [chat_key]
            ).fetchone()[0]
        )

    def deliveries(self, status: str | None = None) -> list[Delivery]:
        """Every outbound (with ``status``, if given) and where it stands, oldest first."""
        sql = (
            "SELECT id, chat_key, status, attempts, last_error, next_attempt_at, created_at,"
            " payload FROM outbox"
        )
        args: list[object] = []
        if status is not None:
            sql, args = sql + " WHERE status = ?", [status]
        return [
            Delivery(
                id=row[0],
                chat_key=row[1],
                status=row[2],
                attempts=row[3],
                last_error=row[4],
                next_attempt_at=row[5],
                created_at=row[6],
                message=OutboundMessage.model_validate_json(row[7]),
            )
            for row in self._db.execute(sql + " ORDER BY seq", args).fetchall()
        ]

    def receipted(self) -> list[OutboundMessage]:
        """Every outbound whose delivery has a receipt recorded, oldest first."""
        rows = self._db.execute(
            "SELECT o.payload FROM outbox o JOIN receipts r ON r.outbound_id = o.id ORDER BY o.seq"
        ).fetchall()
        return [OutboundMessage.model_validate_json(row[0]) for row in rows]
