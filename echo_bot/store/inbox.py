"""The inbox: every inbound committed (deduplicated) before anyone acknowledges it.

Group commit: ``SqliteInbox.add`` queues the message with a future; one writer task
takes everything queued at that moment (at least one message, never a sleep window) and
commits it in one transaction, then resolves each future with that message's own
outcome. Under load many deliveries share one commit; alone, a message is committed at
once. No future is resolved before the commit, and a failed batch fails every future in
it (a channel then answers "retry later", never "accepted").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlite_utils import Database as SqlDb

from ..bus import Published
from ..errors import StoreError
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


# At most this many inbound in one group commit (keeps each transaction short).
MAX_BATCH = 256

log = logging.getLogger(__name__)


class SqliteInbox:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._queued: list[tuple[InboundMessage, asyncio.Future[Published]]] = []
        self._writer: asyncio.Task[None] | None = None
        # Told about every new (non-duplicate) message right after its commit, before
        # anyone is told it was accepted: the dispatcher takes it from here, in memory.
        self.on_committed: Callable[[list[InboundMessage]], None] | None = None

    async def add(self, message: InboundMessage) -> Published:
        """Commit ``message`` (with whatever else is queued); its own outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Published] = loop.create_future()
        self._queued.append((message, future))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_queued(), name="inbox-writer")
        return await future

    async def _write_queued(self) -> None:
        """Commit what is queued, batch after batch, until the queue is empty."""
        while self._queued:
            batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
            try:
                await self._commit(batch)
            except BaseException:  # cancelled: what is still queued fails too
                for _message, future in self._queued:
                    if not future.done():
                        future.cancel()
                self._queued = []
                raise

    async def _commit(self, batch: list[tuple[InboundMessage, asyncio.Future[Published]]]) -> None:
        messages = [message for message, _future in batch]
        try:
            results = await self._db.run(lambda db: add_inbound_batch(db, messages))
        except BaseException as exc:
            # Nothing of the batch is committed: the transaction rolled back.
            if isinstance(exc, Exception) and not isinstance(exc, StoreError) and len(batch) > 1:
                # Not the store: one message could not be stored (a bug, say). Commit
                # the others one by one rather than fail them with it.
                for item in batch:
                    await self._commit([item])
                return
            for _message, future in batch:
                if future.done():
                    continue
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
            return
        if self.on_committed is not None:
            fresh = [m for m, p in zip(messages, results, strict=True) if not p.duplicate]
            if fresh:
                try:
                    self.on_committed(fresh)
                except Exception:  # committed all the same; the inbox poll finds them
                    log.exception("handing new inbound to the dispatcher failed")
        for (_message, future), published in zip(batch, results, strict=True):
            if not future.done():  # the caller may have given up (cancelled)
                future.set_result(published)

    async def accepted_after(
        self, seq: int, known: frozenset[str], limit: int = 500
    ) -> tuple[list[InboxRow], list[str], int, bool]:
        """Rows after ``seq`` still accepted and not ``known`` (read in full), the known
        ids met on the way, the newest seq looked at (``seq`` if none), and whether
        ``limit`` cut the look short."""
        return await self._db.run(lambda db: accepted_rows_after(db, seq, known, limit))

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
        return await self._db.run(lambda db: inbound_status(db, inbound_id))

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


_INSERT = (
    "INSERT INTO inbox (id, kind, channel, session_key, external_id, payload, status,"
    " received_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def add_inbound_batch(db: SqlDb, messages: Sequence[InboundMessage]) -> list[Published]:
    """``add_inbound`` for each message in order, in the caller's transaction.

    The common case — no message's id or (channel, external_id) is in the store or
    repeated in the batch — is one look-up and one ``executemany`` insert. Anything else
    (a retried delivery, a key to retire after its dedup window, two equal keys in one
    batch) takes the one-by-one path, so the outcome is exactly the sequential one."""
    if not messages:
        return []
    ids = [m.id for m in messages]
    keys = [(m.address.channel, m.external_id) for m in messages if m.external_id is not None]
    if len(set(ids)) < len(ids) or len(set(keys)) < len(keys) or _any_stored(db, ids, keys):
        return [add_inbound(db, message) for message in messages]
    now = time.time()
    db.conn.executemany(
        _INSERT,
        [
            (
                m.id,
                m.kind,
                m.address.channel,
                m.session_key,
                m.external_id,
                m.model_dump_json(),
                InboundStatus.ACCEPTED,
                m.received_at.timestamp(),
                now,
            )
            for m in messages
        ],
    )
    return [Published(inbound_id=m.id, duplicate=False) for m in messages]


def _any_stored(db: SqlDb, ids: list[str], keys: list[tuple[str, str | None]]) -> bool:
    """Whether any of these ids or (channel, external_id) keys is in the inbox (old
    rows included: those past their window are retired on the one-by-one path)."""
    found = db.execute(
        "SELECT 1 FROM inbox WHERE id IN (SELECT value FROM json_each(?)) LIMIT 1",
        [json.dumps(ids)],
    ).fetchone()
    if found:
        return True
    by_channel: dict[str, list[str | None]] = {}
    for channel, external_id in keys:
        by_channel.setdefault(channel, []).append(external_id)
    for channel, external_ids in by_channel.items():
        found = db.execute(
            "SELECT 1 FROM inbox WHERE channel = ?"
            " AND external_id IN (SELECT value FROM json_each(?)) LIMIT 1",
            [channel, json.dumps(external_ids)],
        ).fetchone()
        if found:
            return True
    return False


def accepted_rows_after(
    db: SqlDb, seq: int, known: frozenset[str], limit: int
) -> tuple[list[InboxRow], list[str], int, bool]:
    heads = db.execute(
        "SELECT seq, id, status FROM inbox WHERE seq > ? ORDER BY seq LIMIT ?", [seq, limit]
    ).fetchall()
    met = [h[1] for h in heads if h[1] in known]
    wanted = [h[1] for h in heads if h[1] not in known and h[2] == InboundStatus.ACCEPTED]
    rows = []
    if wanted:
        cursor = db.execute(
            "SELECT * FROM inbox WHERE id IN (SELECT value FROM json_each(?)) ORDER BY seq",
            [json.dumps(wanted)],
        )
        rows = [_row(dict(r)) for r in cursor.fetchall()]
    return rows, met, heads[-1][0] if heads else seq, len(heads) >= limit


def inbound_status(db: SqlDb, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
    row = db.execute("SELECT status, error FROM inbox WHERE id = ?", [inbound_id]).fetchone()
    return (InboundStatus(row[0]), row[1]) if row else None


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


@dataclass(frozen=True, slots=True)
class InboundSummary:
    """One inbound as a listing shows it (`echo-bot webhook deliveries`)."""

    id: str
    session_key: str
    status: str
    received_at: float
    outcome: str  # its error, else its result, else ""


def recent_of_channel(
    db: SqlDb, channel: str, session_key: str | None, limit: int
) -> list[InboundSummary]:
    """The newest ``limit`` inbound of ``channel`` (of one session, if given), newest first."""
    sql = (
        "SELECT id, session_key, status, received_at, COALESCE(error, result, '')"
        " FROM inbox WHERE channel = ?"
    )
    args: list[object] = [channel]
    if session_key is not None:
        sql += " AND session_key = ?"
        args.append(session_key)
    sql += " ORDER BY seq DESC LIMIT ?"
    return [InboundSummary(*row) for row in db.execute(sql, [*args, limit]).fetchall()]
