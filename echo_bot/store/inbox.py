"""The inbox: every inbound committed (deduplicated) before anyone acknowledges it.

``tx.inbox.add`` is one unit of work on the store: the engine group-commits it with
whatever else is queued, and a message that cannot be stored fails its own add alone (a
channel then answers "retry later", never "accepted"). Each row records which process
wrote it (``instance``; NULL for management commands): the dispatcher takes its own
process's rows from the ``InboundCommitted`` event and polls only for the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..bus import Published
from ..events import DIRECT, INBOUND, InboundKind, InboundMessage, InboundStatus
from ..plugins import registry
from .committed import InboundCommitted
from .sql import SqlDb, db_clock, expect_change, expect_row, json_text

if TYPE_CHECKING:
    from .tx import Tx


@dataclass(frozen=True, slots=True)
class InboxRow:
    seq: int
    message: InboundMessage
    status: InboundStatus
    error: str | None


def _row(raw: dict[str, Any]) -> InboxRow:
    return InboxRow(
        seq=raw["seq"],
        message=INBOUND.validate_json(raw["payload"]),
        status=InboundStatus(raw["status"]),
        error=raw["error"],
    )


UNFINISHED = (InboundStatus.ACCEPTED, InboundStatus.RUNNING, InboundStatus.WAITING_APPROVAL)


# How long (channel, external_id) stays a duplicate: 7 days (webhook senders retry for
# days), or the channel's own (``ChannelSpec.dedupe_window``: Telegram's at least 48 h
# but under a week, as it may hand out an update_id again after a week of silence).
DEDUP_WINDOW = 7 * 86400.0


def dedupe_window(channel: str) -> float:
    spec = registry().get(channel)
    window = spec.dedupe_window if spec is not None else None
    return DEDUP_WINDOW if window is None else window


_INSERT_NEW = (
    "INSERT INTO inbox (id, kind, channel, session_key, external_id, payload, status,"
    " received_at, updated_at, instance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)


def _insert_row(message: InboundMessage, now: float, instance: str | None) -> tuple[object, ...]:
    return (
        message.id,
        message.kind,
        message.address.channel,
        message.session_key,
        message.external_id,
        message.model_dump_json(),
        InboundStatus.ACCEPTED,
        message.received_at.timestamp(),
        now,
        instance,
    )


def _after_conflict(
    db: SqlDb, message: InboundMessage, row: tuple[object, ...], now: float
) -> Published:
    if message.external_id is not None:
        # An old row with the same key is history, not a duplicate: retire its key.
        retired = db.conn.execute(
            "UPDATE inbox SET external_id = external_id || '#' || seq"
            " WHERE channel = ? AND external_id = ? AND received_at < ?",
            [
                message.address.channel,
                message.external_id,
                now - dedupe_window(message.address.channel),
            ],
        )
        if retired.rowcount and db.conn.execute(_INSERT_NEW, row).rowcount == 1:
            return Published(inbound_id=message.id, duplicate=False)
    existing = db.conn.execute(
        "SELECT id FROM inbox WHERE (channel = ? AND external_id = ?) OR id = ?",
        [message.address.channel, message.external_id, message.id],
    ).fetchone()
    return Published(inbound_id=existing[0] if existing else message.id, duplicate=True)


def _work_to_do(columns: str, where: str, params: Sequence[object]) -> tuple[str, list[object]]:
    """The rows some daemon has to move on — new, running (on a daemon that may have
    died), or waiting for approvals that are all decided now — that also match
    ``where``: two ranges of the inbox_status index, not one OR over the whole inbox."""
    sql = (
        f"SELECT {columns} FROM inbox i WHERE i.status IN (?, ?) AND {where}"
        f" UNION ALL SELECT {columns} FROM inbox i WHERE i.status = ? AND {where}"
        " AND EXISTS (SELECT 1 FROM approvals a WHERE a.turn_id = i.id)"
        " AND NOT EXISTS ("
        " SELECT 1 FROM approvals a WHERE a.turn_id = i.id AND a.status = 'pending')"
    )
    args = [InboundStatus.ACCEPTED, InboundStatus.RUNNING, *params]
    return sql, [*args, InboundStatus.WAITING_APPROVAL, *params]


@dataclass(frozen=True, slots=True)
class InboundSummary:
    """One inbound as a listing shows it (`echo-bot webhook deliveries`)."""

    id: str
    session_key: str
    status: str
    received_at: float
    outcome: str  # its error, else its result, else ""


class InboxRepo:
    """Inbound, each row marked with the process that wrote it (``instance``)."""

    __slots__ = ("_db", "_instance", "_tx")

    def __init__(self, db: SqlDb, tx: Tx, instance: str | None = None) -> None:
        self._db, self._tx, self._instance = db, tx, instance

    def add(self, message: InboundMessage) -> Published:
        """Store ``message`` unless its id, or its (channel, external_id) within the
        channel's dedup window, is stored already.

        The common case — a new message — is one statement: the INSERT, which conflicts
        with any stored row of the same id or key (the unique indexes). Only a conflict
        looks further: a key older than its window is history, not a duplicate (retired,
        then the insert is tried again); else the message is a duplicate of the row found."""
        now = time.time()
        row = _insert_row(message, now, self._instance)
        if self._db.conn.execute(_INSERT_NEW, row).rowcount == 1:
            published = Published(inbound_id=message.id, duplicate=False)
        else:
            published = _after_conflict(self._db, message, row, now)
        if not published.duplicate:
            self._tx.announce(InboundCommitted((message,)))
        return published

    def get(self, inbound_id: str) -> InboxRow | None:
        raw = self._db.execute("SELECT * FROM inbox WHERE id = ?", [inbound_id]).fetchone()
        return _row(dict(raw)) if raw else None

    def claimable(self, instance: str, lease: float, limit: int) -> list[InboundMessage]:
        """With several daemons on one store: the rows with work to do, oldest first, whose
        session no other live instance holds (``store/leases.py``) — new work of sessions
        nobody drives or this instance drives, the turns of an instance that died, and turns
        waiting for approvals that are all decided now (the decision may have reached a
        daemon that could not take the turn's session then)."""
        sql, args = _work_to_do(
            "*",
            "NOT EXISTS (SELECT 1 FROM leases l JOIN instances n ON n.name = l.instance"
            " WHERE l.name = 'session:' || i.session_key AND l.instance <> ?"
            f" AND n.seen_at >= {db_clock(self._db)} - ?)",
            [instance, lease],
        )
        cursor = self._db.execute(f"{sql} ORDER BY seq LIMIT ?", [*args, limit])
        return [_row(dict(r)).message for r in cursor.fetchall()]

    def earlier_turns(self, session_key: str, inbound_id: str) -> Callable[[], list[str]]:
        """The session's turns with work to do that arrived before ``inbound_id``, oldest
        first: what a daemon that has just taken the session runs before it (another daemon
        committed them, or drove them and died), so the session's turns keep their order.
        The read is issued now, its answer given when the returned function is called (on
        PostgreSQL what is issued before that goes in the same round trip)."""
        sql, args = self._earlier("i.seq, i.id", session_key, inbound_id)
        cursor = self._db.execute(f"{sql} ORDER BY 1", args)
        return lambda: [str(r[1]) for r in cursor.fetchall()]

    def expect_first(self, session_key: str, inbound_id: str, error: Exception) -> None:
        """Raise ``error`` if a turn of the session with work to do arrived before
        ``inbound_id`` (``earlier_turns`` would name one) — on PostgreSQL at the unit of
        work's next wait, the server checking it (``sql.expect_row``)."""
        sql, args = self._earlier("1", session_key, inbound_id)
        expect_row(self._db, f"SELECT 1 WHERE NOT EXISTS ({sql})", args, error)

    def _earlier(self, columns: str, session_key: str, inbound_id: str) -> tuple[str, list[object]]:
        return _work_to_do(
            columns,
            "i.session_key = ? AND i.kind <> ? AND i.seq < (SELECT seq FROM inbox WHERE id = ?)",
            [session_key, InboundKind.APPROVAL_DECISION, inbound_id],
        )

    def has_accepted(self, session_key: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM inbox WHERE status = ? AND session_key = ? LIMIT 1",
            [InboundStatus.ACCEPTED, session_key],
        ).fetchone()
        return row is not None

    def unfinished(self) -> tuple[list[InboundMessage], int]:
        """Every unfinished inbound in arrival order, and the newest seq."""
        marks = ",".join("?" for _ in UNFINISHED)
        cursor = self._db.execute(
            f"SELECT * FROM inbox WHERE status IN ({marks}) ORDER BY seq", list(UNFINISHED)
        )
        messages = [_row(dict(r)).message for r in cursor.fetchall()]
        last = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbox").fetchone()[0]
        return messages, last

    def accepted_from_others(self, seq: int, limit: int) -> tuple[list[InboundMessage], int, bool]:
        """Accepted inbound after ``seq`` that another process wrote (a management
        command's decision, say); this process's own come with ``InboundCommitted``."""
        # Accepted rows after ``seq`` not written by this process (NULL rows included), the
        # newest seq looked at, and whether ``limit`` cut the look short. Seqs are handed
        # out under SQLite's write lock, so a row below a seen seq is never committed later.
        cursor = self._db.execute(
            "SELECT * FROM inbox WHERE status = ? AND seq > ?"
            " AND (instance IS NULL OR instance != ?) ORDER BY seq LIMIT ?",
            [InboundStatus.ACCEPTED, seq, self._instance, limit],
        )
        rows = [_row(dict(r)) for r in cursor.fetchall()]
        if len(rows) >= limit:
            return [r.message for r in rows], rows[-1].seq, True
        newest = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbox").fetchone()[0]
        return [r.message for r in rows], max(seq, newest), False

    def status_of(self, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
        row = self._db.execute(
            "SELECT status, error FROM inbox WHERE id = ?", [inbound_id]
        ).fetchone()
        return (InboundStatus(row[0]), row[1]) if row else None

    def describe(self, inbound_id: str) -> dict[str, object] | None:
        row = self._db.execute(
            "SELECT id, kind, channel, session_key, status, error, result, received_at, updated_at"
            " FROM inbox WHERE id = ?",
            [inbound_id],
        ).fetchone()
        if row is None:
            return None
        keys = ("id", "kind", "channel", "session", "status", "error", "result", "received_at",
                "updated_at")  # fmt: skip
        return dict(zip(keys, row, strict=True))

    def ids_beginning(self, channel: str, prefix: str) -> list[str]:
        """The ids of ``channel``'s inbound that begin with ``prefix``, oldest first."""
        rows = self._db.execute(
            "SELECT id FROM inbox WHERE channel = ? AND substr(id, 1, ?) = ? ORDER BY seq",
            [channel, len(prefix), prefix],
        ).fetchall()
        return [row[0] for row in rows]

    def direct_with(self, session_key: str) -> str | None:
        """Whose direct chat with the bot ``session_key`` is, as its channel said of the
        messages there (``metadata.direct``); None when none said so."""
        sender = json_text(self._db, "payload", "sender", "id")
        direct = json_text(self._db, "payload", "metadata", DIRECT)
        rows = self._db.execute(
            f"SELECT {sender}, {direct} FROM inbox WHERE session_key = ? AND kind = 'message'"
            " ORDER BY seq DESC LIMIT 20",
            [session_key],
        ).fetchall()
        for who, said in rows:
            if str(said).lower() in ("1", "true") and who is not None:
                return str(who)
        return None

    def chats_of(self, channel: str, user_id: str, limit: int = 1000) -> list[str]:
        """The session keys of ``channel`` where ``user_id`` wrote (a chat message)."""
        sender = json_text(self._db, "payload", "sender", "id")
        rows = self._db.execute(
            f"SELECT DISTINCT session_key FROM inbox WHERE channel = ? AND kind = 'message'"
            f" AND {sender} = ? LIMIT ?",
            [channel, user_id, limit],
        ).fetchall()
        return sorted(str(row[0]) for row in rows)

    def recent(
        self, channel: str, *, session_key: str | None = None, limit: int = 20
    ) -> list[InboundSummary]:
        """The newest inbound of ``channel`` (of one session, if given), newest first."""
        sql = (
            "SELECT id, session_key, status, received_at, COALESCE(error, result, '')"
            " FROM inbox WHERE channel = ?"
        )
        args: list[object] = [channel]
        if session_key is not None:
            sql += " AND session_key = ?"
            args.append(session_key)
        sql += " ORDER BY seq DESC LIMIT ?"
        return [InboundSummary(*row) for row in self._db.execute(sql, [*args, limit]).fetchall()]

    def start(self, inbound_id: str, error: Exception) -> None:
        """Mark the inbound running; raise ``error`` when it is finished (or gone) — on
        PostgreSQL at the unit of work's next wait (``sql.expect_change``)."""
        expect_change(
            self._db,
            "UPDATE inbox SET status = ?, error = NULL, updated_at = ?"
            " WHERE id = ? AND status IN (?, ?, ?)",
            [InboundStatus.RUNNING, time.time(), inbound_id, *UNFINISHED],
            error,
        )

    def set_status(
        self,
        inbound_id: str,
        status: InboundStatus,
        error: str | None = None,
        result: str | None = None,
    ) -> None:
        self._db.execute(
            "UPDATE inbox SET status = ?, error = ?, result = COALESCE(?, result), updated_at = ?"
            " WHERE id = ?",
            [status, error, result[:2000] if result else None, time.time(), inbound_id],
        )
