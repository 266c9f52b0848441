"""The store's one way in: ``await store.run(fn)`` with ``fn(tx)`` doing its work through
the repositories on ``tx``, all in one transaction.

Nothing outside ``store/`` writes SQL, names a table or imports the driver: the core asks
``tx.turns.get(turn_id)``, ``tx.outbox.add(message)`` and so on
(``tests/store/test_store_boundary.py`` holds that line). A repository that writes work someone
waits for records what it wrote (``store.committed``); ``Store`` hands that to its
subscribers right after the COMMIT, before any caller resumes, also when the caller was
cancelled meanwhile, and never for work that was rolled back.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from ..bus import Published
from ..conversation import ChatMessage, ToolCall
from ..events import InboundMessage, InboundStatus, OutboundMessage, Receipt
from ..secrets import Masker
from ..statuses import ApprovalStatus, CallStatus, ReminderStatus, TurnStatus
from . import access as access_sql
from . import approvals as approval_sql
from . import audit as audit_sql
from . import inbox as inbox_sql
from . import leases as lease_sql
from . import meta as meta_sql
from . import outbox as outbox_sql
from . import reminders as reminder_sql
from . import retention
from . import turns as turn_sql
from .committed import (
    ChatTimezoneChanged,
    Committed,
    InboundCommitted,
    OutboundCommitted,
    ReminderChanged,
)
from .engine import ThreadedEngine
from .sql import POSTGRES, SqlDb, dialect

T = TypeVar("T")
E = TypeVar("E", bound=Committed)
R = TypeVar("R")

log = logging.getLogger(__name__)


class _Repo(Generic[R]):
    """A repository of ``Tx``, made on first use: a job touches two or three of them,
    and making all of them for each job was a measurable part of a turn. Only
    ``__get__`` (a non-data descriptor): once made, the repository is an attribute of
    the ``Tx`` and later uses do not come here."""

    __slots__ = ("make", "name")

    def __init__(self, make: Callable[[Tx], R]) -> None:
        self.make = make
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, tx: None, owner: type) -> _Repo[R]: ...

    @overload
    def __get__(self, tx: Tx, owner: type) -> R: ...

    def __get__(self, tx: Tx | None, owner: type) -> R | _Repo[R]:
        if tx is None:
            return self
        repo = self.make(tx)
        tx.__dict__[self.name] = repo
        return repo


class Tx:
    """One unit of work: the repositories, all on the same transaction.

    ``Store`` calls ``flush`` when the work is done, still inside the transaction: what
    the repositories hold back to write at once (the audit rows) is written then."""

    def __init__(self, db: SqlDb, masker: Masker, instance: str | None = None) -> None:
        self.committed: list[Committed] = []
        self.after_commit: list[Callable[[], None]] = []
        self._db, self._masker, self._instance = db, masker, instance

    inbox = _Repo(lambda tx: InboxRepo(tx._db, tx, tx._instance))
    outbox = _Repo(lambda tx: OutboxRepo(tx._db, tx))
    turns = _Repo(lambda tx: TurnRepo(tx._db))
    approvals = _Repo(lambda tx: ApprovalRepo(tx._db))
    grants = _Repo(lambda tx: GrantRepo(tx._db))
    reminders = _Repo(lambda tx: ReminderRepo(tx._db, tx))
    audit = _Repo(lambda tx: AuditRepo(tx._db, tx._masker))
    access = _Repo(lambda tx: AccessRepo(tx._db))
    meta = _Repo(lambda tx: MetaRepo(tx._db))
    leases = _Repo(lambda tx: LeaseRepo(tx._db))

    def announce(self, event: Committed) -> None:
        self.committed.append(event)

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once this work is committed; never if it is rolled back.

        A unit of work may run more than once before it commits (the engine retries a
        batch when one of its jobs fails), so whatever it changes outside the store — a
        cache, a metric — goes here, not in ``fn`` itself."""
        self.after_commit.append(callback)

    def flush(self) -> None:
        """Write what was held back (the audit rows), in the transaction still open; on
        PostgreSQL, wake the other daemons for what it commits (``Store.on_wake``)."""
        audit: AuditRepo | None = self.__dict__.get("audit")  # only if it was used
        if audit is not None:
            audit.flush()
        if self.committed and dialect(self._db) == POSTGRES:
            kinds = {_WAKES[type(event)] for event in self.committed}
            meta_sql.notify(self._db, ",".join(sorted(kinds)))


# What a committed event wakes in the other daemons (dispatcher, delivery, scheduler).
_WAKES: dict[type[Committed], str] = {
    InboundCommitted: "inbound",
    OutboundCommitted: "outbound",
    ReminderChanged: "reminder",
    ChatTimezoneChanged: "timezone",
}


class InboxRepo:
    """Inbound, each row marked with the process that wrote it (``instance``)."""

    __slots__ = ("_db", "_instance", "_tx")

    def __init__(self, db: SqlDb, tx: Tx, instance: str | None = None) -> None:
        self._db, self._tx, self._instance = db, tx, instance

    def add(self, message: InboundMessage) -> Published:
        """Store ``message`` unless (channel, external_id) was seen within the window."""
        published = inbox_sql.add_inbound(self._db, message, self._instance)
        if not published.duplicate:
            self._tx.announce(InboundCommitted((message,)))
        return published

    def add_many(self, messages: Sequence[InboundMessage]) -> list[Published]:
        published = inbox_sql.add_inbound_batch(self._db, messages, self._instance)
        fresh = tuple(m for m, p in zip(messages, published, strict=True) if not p.duplicate)
        if fresh:
            self._tx.announce(InboundCommitted(fresh))
        return published

    def get(self, inbound_id: str) -> inbox_sql.InboxRow | None:
        return inbox_sql.get_inbound(self._db, inbound_id)

    def claimable(self, instance: str, lease: float, limit: int) -> list[InboundMessage]:
        return inbox_sql.claimable(self._db, instance, lease, limit)

    def earlier_turns(self, session_key: str, inbound_id: str) -> list[str]:
        return inbox_sql.earlier_turns(self._db, session_key, inbound_id)

    def has_accepted(self, session_key: str) -> bool:
        return inbox_sql.has_accepted(self._db, session_key)

    def unfinished(self) -> tuple[list[InboundMessage], int]:
        """Every unfinished inbound in arrival order, and the newest seq."""
        return inbox_sql.unfinished_rows(self._db)

    def accepted_from_others(self, seq: int, limit: int) -> tuple[list[InboundMessage], int, bool]:
        """Accepted inbound after ``seq`` that another process wrote (a management
        command's decision, say); this process's own come with ``InboundCommitted``."""
        return inbox_sql.accepted_from_others(self._db, seq, self._instance, limit)

    def status_of(self, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
        return inbox_sql.inbound_status(self._db, inbound_id)

    def describe(self, inbound_id: str) -> dict[str, object] | None:
        return inbox_sql.describe_inbound(self._db, inbound_id)

    def ids_beginning(self, channel: str, prefix: str) -> list[str]:
        """The ids of ``channel``'s inbound that begin with ``prefix``, oldest first."""
        return inbox_sql.ids_beginning(self._db, channel, prefix)

    def recent(
        self, channel: str, *, session_key: str | None = None, limit: int = 20
    ) -> list[inbox_sql.InboundSummary]:
        """The newest inbound of ``channel`` (of one session, if given), newest first."""
        return inbox_sql.recent_of_channel(self._db, channel, session_key, limit)

    def set_status(
        self,
        inbound_id: str,
        status: InboundStatus,
        error: str | None = None,
        result: str | None = None,
    ) -> None:
        inbox_sql.set_inbound_status(self._db, inbound_id, status, error, result)


class OutboxRepo:
    __slots__ = ("_db", "_tx")

    def __init__(self, db: SqlDb, tx: Tx) -> None:
        self._db, self._tx = db, tx

    def add(self, message: OutboundMessage) -> None:
        """Queue ``message`` for delivery (per-chat FIFO); the worker is told on COMMIT."""
        head = outbox_sql.enqueue_outbound(self._db, message)
        self._tx.announce(OutboundCommitted(frozenset((str(message.to),)), head))

    def due(
        self, channels: list[str], now: float, limit: int, busy: list[str]
    ) -> tuple[list[outbox_sql.OutboxRow], float | None]:
        """Each chat's head due by ``now`` (not the ``busy`` chats) and the next due time."""
        return outbox_sql.due_heads(self._db, channels, now, limit, busy)

    def receipt_of(self, outbound_id: str) -> str | None:
        return outbox_sql.receipt_of(self._db, outbound_id)

    def mark_sent(self, message: OutboundMessage, receipt: Receipt) -> None:
        """Record the delivery (and its receipt, for edits of it)."""
        outbox_sql.mark_sent(self._db, message, receipt)

    def mark_retry(self, outbound_id: str, error: str, next_attempt_at: float) -> None:
        outbox_sql.mark_retry(self._db, outbound_id, error, next_attempt_at)

    def note_error(self, outbound_id: str, error: str) -> None:
        outbox_sql.note_error(self._db, outbound_id, error)

    def mark_failed(self, outbound_id: str, error: str) -> None:
        outbox_sql.mark_failed(self._db, outbound_id, error)

    def pending_count(self, chat_key: str | None = None) -> int:
        return outbox_sql.pending_count(self._db, chat_key)

    def deliveries(self, status: str | None = None) -> list[outbox_sql.Delivery]:
        """Every outbound (with ``status``, if given) and where it stands, oldest first."""
        return outbox_sql.deliveries(self._db, status)

    def queued_by_channel(self) -> dict[str, int]:
        return meta_sql.queued_by_channel(self._db)


class TurnRepo:
    """Turns, their history (messages) and their tool calls: the checkpoint."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def get(self, turn_id: str) -> turn_sql.TurnRow | None:
        return turn_sql.get_turn(self._db, turn_id)

    def of_inbound(self, inbound_id: str) -> tuple[InboundStatus, turn_sql.TurnRow | None] | None:
        """The inbound's status and its turn (None before it has one) in one read; None
        when there is no such inbound."""
        found = turn_sql.turn_of_inbound(self._db, inbound_id)
        return None if found is None else (InboundStatus(found[0]), found[1])

    def create(self, turn_id: str, session_key: str, trace_id: str) -> turn_sql.TurnRow:
        return turn_sql.create_turn(self._db, turn_id, session_key, trace_id)

    def set(
        self, turn_id: str, *, step: int | None = None, status: TurnStatus | None = None
    ) -> None:
        turn_sql.set_turn(self._db, turn_id, step=step, status=status)

    def append_message(self, session_key: str, turn_id: str, message: ChatMessage) -> None:
        turn_sql.append_message(self._db, session_key, turn_id, message)

    def reset_session(self, session_key: str) -> None:
        turn_sql.reset_session(self._db, session_key)

    def history(self, session_key: str, limit: int = 200) -> list[ChatMessage]:
        return turn_sql.history(self._db, session_key, limit)

    def reset_mark(self, session_key: str) -> tuple[int, str]:
        return turn_sql.reset_mark(self._db, session_key)

    def history_rows(
        self, session_key: str, limit: int, mark: tuple[int, str] | None = None
    ) -> list[tuple[int, ChatMessage]]:
        return turn_sql.history_rows(self._db, session_key, limit, mark)

    def newest_seq(self, session_key: str) -> int:
        return turn_sql.newest_seq(self._db, session_key)

    def messages_after(self, session_key: str, seq: int) -> list[tuple[int, ChatMessage]]:
        return turn_sql.messages_after(self._db, session_key, seq)

    def add_calls(
        self, turn_id: str, step: int, calls: list[tuple[ToolCall, str]]
    ) -> list[turn_sql.CallRow]:
        """Store the step's calls (planned); the rows as ``calls_of_step`` reads them."""
        return turn_sql.add_calls(self._db, turn_id, step, calls)

    def calls_of_step(self, turn_id: str, step: int) -> list[turn_sql.CallRow]:
        return turn_sql.calls_of_step(self._db, turn_id, step)

    def set_call(
        self,
        call_id: str,
        status: CallStatus,
        *,
        result: dict[str, Any] | None = None,
        approval_id: str | None = None,
    ) -> None:
        turn_sql.set_call(self._db, call_id, status, result=result, approval_id=approval_id)

    def taken_call_ids(self, ids: list[str]) -> builtins.set[str]:
        return turn_sql.taken_call_ids(self._db, ids)

    def repeats(self, turn_id: str, hashes: list[str]) -> int:
        return turn_sql.repeats(self._db, turn_id, hashes)

    def taken_and_repeats(
        self, turn_id: str, ids: list[str], hashes: list[str]
    ) -> tuple[builtins.set[str], int]:
        """``taken_call_ids`` and ``repeats`` in one read."""
        return turn_sql.taken_and_repeats(self._db, turn_id, ids, hashes)

    def waiting_on(self, approval_id: str) -> list[str]:
        return turn_sql.turns_waiting_on(self._db, approval_id)


class ApprovalRepo:
    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def insert(
        self,
        *,
        approval_id: str,
        turn_id: str,
        session_key: str,
        trace_id: str,
        tool: str,
        args: dict[str, Any],
        args_hash: str,
        risk: str,
        requested_by: dict[str, Any],
        origin: str,
        prompt_to: str,
        prompt_outbound_id: str | None,
        expires_at: float,
        grant_scope: str | None,
    ) -> None:
        approval_sql.insert_approval(
            self._db,
            approval_id=approval_id,
            turn_id=turn_id,
            session_key=session_key,
            trace_id=trace_id,
            tool=tool,
            args=args,
            args_hash=args_hash,
            risk=risk,
            requested_by=requested_by,
            origin=origin,
            prompt_to=prompt_to,
            prompt_outbound_id=prompt_outbound_id,
            expires_at=expires_at,
            grant_scope=grant_scope,
        )

    def get(self, approval_id: str) -> approval_sql.ApprovalRow | None:
        return approval_sql.get_approval(self._db, approval_id)

    def list(
        self, status: ApprovalStatus | None = ApprovalStatus.PENDING, limit: int = 100
    ) -> list[approval_sql.ApprovalRow]:
        return approval_sql.list_approvals(self._db, status, limit)

    def pending_for(self, prompt_to: str) -> builtins.list[approval_sql.ApprovalRow]:
        return approval_sql.pending_for(self._db, prompt_to)

    def ids_beginning(self, prefix: str) -> builtins.list[str]:
        """The ids of every request that begins with ``prefix``, oldest first."""
        return approval_sql.ids_beginning(self._db, prefix)

    def decide(
        self,
        approval_id: str,
        status: ApprovalStatus,
        *,
        verb: str | None,
        decided_by: dict[str, Any] | None,
    ) -> bool:
        """Compare-and-set from pending; False when someone (or expiry) got there first."""
        return approval_sql.decide(self._db, approval_id, status, verb=verb, decided_by=decided_by)

    def due_for_expiry(self, now: float) -> builtins.list[str]:
        return approval_sql.due_for_expiry(self._db, now)

    def next_expiry(self) -> float | None:
        return approval_sql.next_expiry(self._db)


class GrantRepo:
    """ "Allow for N minutes": a chat's time-boxed permission for one tool, within one
    scope (the deciding arguments the approver saw, as the tool states them)."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def add(self, session_key: str, tool: str, scope: str, until: float, approval_id: str) -> None:
        approval_sql.add_grant(self._db, session_key, tool, scope, until, approval_id)

    def all(self) -> list[approval_sql.GrantRow]:
        return approval_sql.list_grants(self._db)

    def holds(self, session_key: str, tool: str, scope: str, now: float) -> bool:
        return approval_sql.has_grant(self._db, session_key, tool, scope, now)


class ReminderRepo:
    __slots__ = ("_db", "_tx")

    def __init__(self, db: SqlDb, tx: Tx) -> None:
        self._db, self._tx = db, tx

    def insert(self, row: reminder_sql.ReminderRow) -> None:
        reminder_sql.insert_reminder(self._db, row)
        self._tx.announce(ReminderChanged(row.id))

    def get(self, reminder_id: str) -> reminder_sql.ReminderRow | None:
        return reminder_sql.get_reminder(self._db, reminder_id)

    def active(self, chat: str | None = None) -> list[reminder_sql.ReminderRow]:
        return reminder_sql.active_reminders(self._db, chat)

    def count_active(self, chat: str) -> int:
        return reminder_sql.count_active(self._db, chat)

    def set_status(
        self,
        reminder_id: str,
        status: ReminderStatus,
        *,
        only_if: ReminderStatus = ReminderStatus.ACTIVE,
    ) -> bool:
        changed = reminder_sql.set_status(self._db, reminder_id, status, only_if=only_if)
        if changed:
            self._tx.announce(ReminderChanged(reminder_id))
        return changed

    def mark_fired(
        self, row: reminder_sql.ReminderRow, occurrence: float, *, late_by: float, outcome: str
    ) -> bool:
        """Record that ``occurrence`` fired; False when it already had (never twice)."""
        return reminder_sql.mark_fired(self._db, row, occurrence, late_by=late_by, outcome=outcome)

    def advance(self, reminder_id: str, next_at: float) -> None:
        reminder_sql.advance(self._db, reminder_id, next_at)

    def chat_timezone(self, session_key: str) -> str | None:
        return reminder_sql.chat_timezone(self._db, session_key)

    def set_chat_timezone(self, session_key: str, timezone: str) -> None:
        reminder_sql.set_chat_timezone(self._db, session_key, timezone)
        self._tx.announce(ChatTimezoneChanged(session_key, timezone))

    def cron_last(self, job: str) -> float | None:
        return reminder_sql.cron_last(self._db, job)

    def set_cron_last(self, job: str, occurrence: float) -> None:
        reminder_sql.set_cron_last(self._db, job, occurrence)


class AuditRepo:
    """The audit log: every row masked when it is written. The rows of one unit of work
    are inserted together when it is done (``Tx.flush``: one statement, still in its
    transaction), in the order they were written; a read writes them first."""

    __slots__ = ("_db", "_rows", "_writer")

    def __init__(self, db: SqlDb, masker: Masker) -> None:
        self._db = db
        self._writer = audit_sql.AuditWriter(masker)
        self._rows: list[audit_sql.AuditValues] = []

    def write(
        self, event: str, *, trace_id: str | None, session_key: str | None, **data: Any
    ) -> None:
        self._rows.append(
            self._writer.row(event, trace_id=trace_id, session_key=session_key, **data)
        )

    def flush(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            audit_sql.write_rows(self._db, rows)

    def read(self, *, tail: int = 50, trace_id: str | None = None) -> list[audit_sql.AuditRow]:
        self.flush()
        return audit_sql.read_audit(self._db, tail=tail, trace_id=trace_id)

    def tokens_since(self, ts: float) -> int:
        self.flush()
        return audit_sql.tokens_since(self._db, ts)

    def usage_by_day(self) -> list[audit_sql.UsageRow]:
        self.flush()
        return audit_sql.usage_by_day(self._db)


class AccessRepo:
    """Users added by pairing, and the pairing codes."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def new_pairing_code(self, now: float | None = None) -> str:
        return access_sql.new_pairing_code(self._db, now)

    def is_paired(self, channel: str, user_id: str) -> bool:
        return access_sql.is_paired(self._db, channel, user_id)

    def paired_users(self) -> list[access_sql.PairedUser]:
        return access_sql.paired_users(self._db)

    def revoke(self, channel: str, user_id: str) -> bool:
        return access_sql.revoke(self._db, channel, user_id)

    def try_pair(self, channel: str, user_id: str, code: str, now: float | None = None) -> str:
        return access_sql.try_pair(self._db, channel, user_id, code, now)


class MetaRepo:
    """Facts about the running daemon and the queues, for `echo-bot status`; pruning."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def set_daemon_info(self, info: dict[str, Any]) -> None:
        meta_sql.set_daemon_info(self._db, info)

    def daemon_info(self) -> dict[str, Any]:
        return meta_sql.daemon_info(self._db)

    def queue_counts(self) -> dict[str, int]:
        return meta_sql.queue_counts(self._db)

    def instance_seen(self, row: meta_sql.InstanceRow) -> None:
        """This daemon is alive (its row made or refreshed)."""
        meta_sql.instance_seen(self._db, row)

    def instance_gone(self, name: str) -> None:
        meta_sql.instance_gone(self._db, name)

    def position(self, name: str) -> tuple[int, float] | None:
        return meta_sql.position(self._db, name)

    def set_position(self, name: str, value: int) -> None:
        meta_sql.set_position(self._db, name, value, time.time())

    def now(self) -> float:
        """The store's clock: the one every daemon's ``seen_at`` is judged by."""
        return meta_sql.now(self._db)

    def instances(self) -> list[meta_sql.InstanceRow]:
        """Every daemon that has used the store and not left, the most recently seen
        first (one whose ``seen_at`` is old died without saying so)."""
        return meta_sql.instances(self._db)

    def prune(self, before: float) -> dict[str, int]:
        """Delete finished rows last touched before ``before``; counts per table."""
        return retention.prune(self._db, before)


class LeaseRepo:
    """Leases among the daemons sharing the store (``store/leases.py``)."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def take(self, name: str, instance: str, lease: float) -> bool:
        return lease_sql.take(self._db, name, instance, lease)

    def held(self, name: str, instance: str) -> bool:
        return lease_sql.held(self._db, name, instance)

    def release(self, name: str, instance: str) -> bool:
        return lease_sql.release(self._db, name, instance)

    def holders(self, lease: float) -> dict[str, list[str]]:
        return lease_sql.holders(self._db, lease)


class Store:
    """The store as the core sees it: units of work and what they committed."""

    def __init__(
        self, database: ThreadedEngine, masker: Masker, *, instance: str | None = None
    ) -> None:
        self.database = database
        self.masker = masker
        # Which process this is, written on each inbound it adds: a daemon's own rows
        # reach its dispatcher by InboundCommitted, the rest (None: a management
        # command) by its poll.
        self.instance = instance
        self._subscribers: dict[type[Any], list[Callable[[Any], None]]] = {}

    def describe(self) -> str:
        """Where the store is, for people (never a password)."""
        return self.database.describe()

    def health(self) -> dict[str, object]:
        return self.database.health()

    def on_wake(self, callback: Callable[[str], None]) -> None:
        """On PostgreSQL, call ``callback(kinds)`` on this loop whenever any daemon
        commits work ("inbound", "outbound", "reminder", "timezone", comma-separated;
        "*" after the listener (re)connected: something may have been missed)."""
        listen = getattr(self.database, "listen", None)
        if listen is None:
            return
        loop = asyncio.get_running_loop()

        def wake(kinds: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(callback, kinds)

        listen(wake)

    @property
    def shared(self) -> bool:
        """Whether several daemons may use this store at once (PostgreSQL)."""
        return self.database.engine == "postgres"

    @property
    def path(self) -> Path | None:
        """SQLite's file; None on PostgreSQL."""
        return self.database.path

    async def open(self) -> None:
        await self.database.open()

    async def close(self) -> None:
        await self.database.close()

    def open_sync(self, *, create: bool = True) -> None:
        self.database.open_sync(create=create)

    def close_sync(self) -> None:
        self.database.close_sync()

    def unsubscribe(self, kind: type[E], listener: Callable[[E], None]) -> None:
        """Stop calling ``listener`` for ``kind`` (a part that stopped); no-op if it was not."""
        listeners = self._subscribers.get(kind, [])
        if listener in listeners:
            listeners.remove(listener)

    def subscribe(self, kind: type[E], listener: Callable[[E], None]) -> None:
        """Call ``listener(event)`` after each COMMIT that announced a ``kind`` event."""
        self._subscribers.setdefault(kind, []).append(listener)

    async def run(self, fn: Callable[[Tx], T], *, slow: bool = False) -> T:
        """Run ``fn(tx)`` in a transaction; its result once committed (StoreError when the
        store could not take it). ``slow``: work that may take more than about a
        millisecond (pruning, big reads), run where it cannot hold up the event loop.

        What the job committed is announced right after the COMMIT, before any caller
        resumes — also when this caller was cancelled while it waited (a publisher that
        gave up: its message is stored all the same and must run)."""
        masker, instance = self.masker, self.instance

        def job(db: SqlDb) -> tuple[T, Tx]:
            tx = Tx(db, masker, instance)
            value = fn(tx)
            tx.flush()
            return value, tx

        value, _tx = await self.database.run(job, slow=slow, after_commit=self._committed)
        return value

    def run_sync(self, fn: Callable[[Tx], T]) -> T:
        """``run`` for management commands (no event loop, nobody subscribed)."""
        masker, instance = self.masker, self.instance

        def job(db: SqlDb) -> tuple[T, Tx]:
            tx = Tx(db, masker, instance)
            value = fn(tx)
            tx.flush()
            return value, tx

        value, tx = self.database.run_sync(job)
        _call_after_commit(tx)
        return value

    def _committed(self, done: tuple[Any, Tx]) -> None:
        tx = done[1]
        if tx.after_commit:
            _call_after_commit(tx)
        if tx.committed:
            self._announce(tx.committed)

    def _announce(self, events: list[Committed]) -> None:
        for event in events:
            for listener in self._subscribers.get(type(event), ()):
                try:
                    listener(event)
                except Exception:
                    # Committed all the same: it waits in the store for its part's
                    # recovery (the dispatcher's at the next start; the delivery worker's
                    # and the scheduler's next look).
                    log.exception("telling %r about committed work failed", listener)


def _call_after_commit(tx: Tx) -> None:
    for callback in tx.after_commit:
        try:
            callback()
        except Exception:  # committed all the same; the others still run
            log.exception("an after-commit callback failed")
