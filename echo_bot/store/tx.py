"""The store's one way in: ``await store.run(fn)`` with ``fn(tx)`` doing its work through
the repositories on ``tx``, all in one transaction. Each repository is defined in its
table's module, beside its SQL (``InboxRepo`` in ``store/inbox.py``, ``OutboxRepo`` in
``store/outbox.py``, …); ``Tx`` only holds them.

Nothing outside ``store/`` writes SQL, names a table or imports the driver: the core asks
``tx.turns.get(turn_id)``, ``tx.outbox.add(message)`` and so on
(``tests/store/test_store_boundary.py`` holds that line). A repository that writes work someone
waits for records what it wrote (``store.committed``); ``Store`` hands that to its
subscribers right after the COMMIT, before any caller resumes, also when the caller was
cancelled meanwhile, and never for work that was rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from ..secrets import Masker
from .access import AccessRepo
from .approvals import ApprovalRepo, GrantRepo
from .audit import AuditRepo
from .committed import (
    ApprovalDecided,
    ApprovalRequested,
    ChatTimezoneChanged,
    Committed,
    InboundCommitted,
    OutboundCommitted,
    ReminderChanged,
)
from .console import ConsoleRepo
from .engine import ThreadedEngine
from .inbox import InboxRepo
from .leases import LeaseRepo
from .memory import MemoryRepo
from .meta import MetaRepo, notify
from .outbox import OutboxRepo
from .recall import RecallRepo
from .reminders import ReminderRepo
from .sql import POSTGRES, SqlDb, dialect
from .summaries import SummaryRepo
from .turns import TurnRepo

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
    turns = _Repo(lambda tx: TurnRepo(tx._db, tx))
    approvals = _Repo(lambda tx: ApprovalRepo(tx._db, tx))
    grants = _Repo(lambda tx: GrantRepo(tx._db))
    reminders = _Repo(lambda tx: ReminderRepo(tx._db, tx))
    audit = _Repo(lambda tx: AuditRepo(tx._db, tx._masker))
    access = _Repo(lambda tx: AccessRepo(tx._db))
    meta = _Repo(lambda tx: MetaRepo(tx._db))
    leases = _Repo(lambda tx: LeaseRepo(tx._db))
    console = _Repo(lambda tx: ConsoleRepo(tx._db))
    memory = _Repo(lambda tx: MemoryRepo(tx._db))
    recall = _Repo(lambda tx: RecallRepo(tx._db))
    summaries = _Repo(lambda tx: SummaryRepo(tx._db))

    def announce(self, event: Committed) -> None:
        self.committed.append(event)

    def replace(self, event: Committed, by: Committed) -> None:
        """Announce ``by`` instead of ``event`` (the same work, with what was read of it
        once committed: ``sql.read_later``)."""
        for i, announced in enumerate(self.committed):
            if announced is event:
                self.committed[i] = by
                return

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once this work is committed; never if it is rolled back.

        A unit of work may run more than once before it commits (the engine retries a
        batch when one of its jobs fails), so whatever it changes outside the store — a
        cache, a metric — goes here, not in ``fn`` itself."""
        self.after_commit.append(callback)

    def flush(self) -> None:
        """Write what was held back (the step's calls, the audit rows), in the transaction
        still open; on PostgreSQL, wake the other daemons for what it commits
        (``Store.on_wake``)."""
        turns: TurnRepo | None = self.__dict__.get("turns")  # only if it was used
        if turns is not None:
            turns.flush()
        audit: AuditRepo | None = self.__dict__.get("audit")
        if audit is not None:
            audit.flush()
        if self.committed and dialect(self._db) == POSTGRES:
            kinds = {_WAKES[type(event)] for event in self.committed if type(event) in _WAKES}
            if kinds:
                notify(self._db, kinds)


# What a committed event wakes in the other daemons (dispatcher, delivery, scheduler,
# the console's live queue: "approval").
_WAKES: dict[type[Committed], str] = {
    InboundCommitted: "inbound",
    OutboundCommitted: "outbound",
    ReminderChanged: "reminder",
    ChatTimezoneChanged: "timezone",
    ApprovalRequested: "approval",
    ApprovalDecided: "approval",
}


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
        self._woken: list[Callable[[str], None]] = []

    def describe(self) -> str:
        """Where the store is, for people (never a password)."""
        return self.database.describe()

    def health(self) -> dict[str, object]:
        return self.database.health()

    def on_wake(self, callback: Callable[[str], None]) -> None:
        """On PostgreSQL, call ``callback(kinds)`` on this loop whenever another daemon (or
        a management command) commits work ("inbound", "outbound", "reminder",
        "timezone", "approval", comma-separated; "*" after the listener (re)connected:
        something may have been missed). This store's own commits are announced to its
        subscribers instead. Any number of parts may ask; one listener serves them all."""
        listen = getattr(self.database, "listen", None)
        if listen is None:
            return
        self._woken.append(callback)
        if len(self._woken) > 1:  # one listener serves every callback
            return
        loop = asyncio.get_running_loop()

        def wake(kinds: str) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(self._wake_all, kinds)

        listen(wake)

    def off_wake(self, callback: Callable[[str], None]) -> None:
        """Stop calling ``callback`` (a part that stopped); no-op if it was not."""
        if callback in self._woken:
            self._woken.remove(callback)

    def _wake_all(self, kinds: str) -> None:
        for callback in list(self._woken):
            try:
                callback(kinds)
            except Exception:
                log.exception("a wake-up callback failed")

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
