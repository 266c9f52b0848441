"""The SQLite file: short transactions on the event loop, group-committed; slow ones on a
thread of their own. WAL, forward migrations.

The rule. A WAL commit at ``synchronous=NORMAL`` does not fsync: it costs tens of
microseconds, less than handing the work to a thread and the result back (two thread
wake-ups and GIL hand-offs). Measured on a 2-core machine (``bench/webhook_ingest.py
--reference``: bare aiohttp, 32 connections, one row per request): with ``wrk``, 12.8k
req/s with no store, 14.0k with group commit on the event-loop thread, 10.2k with the
same group commit on a worker thread, 3.6k with one commit per request through
``run_in_executor``; in server CPU per request, 40 µs, 60 µs, 70 µs and 115–135 µs. So:

- **On the loop** (``await db.run(fn)`` from the loop that opened the store, durability
  ``normal``): the job joins an in-memory list; one flush per loop iteration
  (``call_soon``) runs everything listed (up to ``MAX_BATCH``) in one ``BEGIN
  IMMEDIATE`` transaction, COMMITs, and only then sets each caller's future. The loop's
  connection never waits for a lock (``busy_timeout = 0``).
- **Off the loop**, on a second connection on the store thread (``busy_timeout`` 10 s),
  whatever may take longer than about a millisecond or must wait: every job at
  ``durability = "full"`` (each commit fsyncs), ``await db.run(fn, slow=True)``
  (pruning, integrity checks, large reads), ``run_sync`` (management commands, plain
  threads), jobs from any other thread or loop, and a loop batch whose ``BEGIN
  IMMEDIATE`` found the write lock taken (another process, or a slow job): the loop
  hands that batch to the store thread, which waits for the lock. Until the store
  thread has finished every job handed over so, new loop jobs follow them there, so
  jobs commit in the order they were submitted; then they run on the loop again.

Both paths group-commit the same way (``engine.run_begun``: the batch runs in one
transaction, again with a savepoint per job when one fails). SQLite's errors come back
as StoreError (``run_sync``: as they are). If SQLite abandons the whole transaction
(disk full, I/O error), a job raises something that is not an Exception, or the COMMIT
fails, every job of the batch fails — none of it was committed: the culprit gets its own
error, the others a StoreError saying they were rolled back with another job. No job's
exception ever leaves the flush into the event loop. A job whose caller was cancelled
before its batch ran is not run.

Checkpoints (copying the WAL back into the database file, with an fsync) run on a
third connection in a thread of their own, every ``CHECKPOINT_INTERVAL`` seconds, not
inside a commit: SQLite's automatic checkpoint would stall whichever commit crosses
1000 pages — and with it every store call queued behind it, on the loop: the loop
itself — for as long as the fsync takes (tens to hundreds of milliseconds on a busy
disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlite_utils import Database as SqliteUtilsDatabase

from ..errors import NoSchema, StoreError
from ..hardening import PRIVATE_FILE, make_private
from .engine import MAX_BATCH, Job, JobDone, Session, ThreadedEngine, run_begun, store_error
from .schema import SchemaBehind, SchemaTooNew, has_schema, migrate

T = TypeVar("T")

DB_FILENAME = "echo-bot.sqlite3"
CHECKPOINT_INTERVAL = 1.0  # seconds between WAL checkpoints (PASSIVE, off the commit path)
BUSY_TIMEOUT_MS = 10_000  # how long the store thread waits for another writer
# Past this, the checkpointer truncates the WAL (a PASSIVE checkpoint under steady writes
# never lets it restart, and nothing else would shrink it). Writers wait for the TRUNCATE
# (tens of ms, mostly its fsyncs): at 64 MB a saturated daemon (~90 MB of WAL a second)
# waited every 0.7 s, 5–10 % of its turns (bench/turns.py); at 256 MB every ~3 s.
WAL_LIMIT = 256 * 1024 * 1024
WAL_WARN_EVERY = 600.0  # seconds between two warnings that the WAL cannot be kept short
# What SQLite keeps of the WAL file when it starts over (journal_size_limit).
WAL_KEEP = 64 * 1024 * 1024

_LOCK_TAKEN = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
# What the file's disk says (by primary code: SQLITE_IOERR_* are IOERR): full, failing,
# or the file unreachable. Work failing so is not the work's fault.
_AWAY = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN)

log = logging.getLogger(__name__)


class SqliteSession:
    """One SQLite connection's transaction control, for ``engine.run_begun``."""

    __slots__ = ("conn", "execute", "handle")
    errors = sqlite3.Error

    def unavailable(self, exc: BaseException) -> bool:
        """The disk full, failing or gone (``_AWAY``): the work waits until it is back,
        and /healthz says so; anything else is the work's own failure."""
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _AWAY

    def __init__(self, conn: sqlite3.Connection, handle: SqliteUtilsDatabase) -> None:
        self.conn, self.handle, self.execute = conn, handle, conn.execute

    def alive(self) -> bool:
        return self.conn.in_transaction

    # A failed statement leaves an SQLite transaction as it was (or ends it).
    clean = alive


def is_empty_file(path: Path) -> bool:
    """A store file of 0 bytes with nothing in its ``-wal`` either (a running daemon's
    may hold all in it until a checkpoint): a copy made without its ``-wal``, a restore
    that failed. Opened, SQLite would make it a database, hiding that it was empty."""
    wal = path.with_name(path.name + "-wal")
    try:
        return path.stat().st_size == 0 and not (wal.exists() and wal.stat().st_size > 0)
    except OSError:
        return False


class Database(ThreadedEngine):
    """The SQLite engine (see the module doc)."""

    engine = "sqlite"
    path: Path  # never None here: SQLite is a file

    def __init__(self, path: Path, *, durability: str = "normal", reads_only: bool = False) -> None:
        super().__init__()
        self._thread_name = "echo-bot-sqlite"
        self.path = path
        self._durability = durability
        # A management command that only reads: its transactions take no write lock (a
        # long listing holding one made the daemon's writes wait past their timeout).
        self._reads_only = reads_only
        # The store thread's connection (slow jobs, run_sync, hand-offs, migrations).
        self._conn: sqlite3.Connection | None = None
        # sqlite-utils' wrapper of the connection, made once: making one runs a PRAGMA
        # and the plugin hooks, too much to do again for every transaction.
        self._wrapped: SqliteUtilsDatabase | None = None
        self._thread: threading.Thread | None = None
        # The event loop's connection and what only the loop's thread touches.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_conn: sqlite3.Connection | None = None
        self._loop_wrapped: SqliteUtilsDatabase | None = None
        self._session: SqliteSession | None = None
        self._loop_session: SqliteSession | None = None
        self._pending: list[Job] = []
        self._flush_scheduled = False
        self._closing = False
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        if is_empty_file(self.path):
            log.warning(
                "the store %s is empty (0 bytes): a new store begins in it; if it held"
                " your data, stop echo-bot and restore a backup (systemd/README.md)",
                self.path,
            )
        loop = asyncio.get_running_loop()
        on_loop = self._durability != "full"
        await self._submit(lambda: self._open(loop_connection=on_loop), in_transaction=False)
        self._loop = loop if on_loop else None

    def open_sync(self, *, create: bool = True) -> None:
        """For short-lived management commands that have no event loop."""
        if not create and not self.path.exists():
            raise NoSchema(f"no store at {self.path} yet; `echo-bot run` creates it")
        if not create and is_empty_file(self.path):  # read, it would be written
            raise NoSchema(
                f"{self.path} is empty (0 bytes): no echo-bot store in it; `echo-bot run`"
                " begins a new one there. If it held your data, restore a backup"
                " (systemd/README.md)"
            )
        self._submit_sync(
            lambda: self._open(loop_connection=False, create=create), in_transaction=False
        )

    def _connect(self) -> tuple[sqlite3.Connection, SqliteUtilsDatabase]:
        conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000,
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        sync = "FULL" if self._durability == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous = {sync}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_KEEP}")
        return conn, SqliteUtilsDatabase(conn)

    def _open(self, *, loop_connection: bool, create: bool = True) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._make_private()
            self._conn, self._wrapped = self._connect()
            self._session = SqliteSession(self._conn, self._wrapped)
            self._thread = threading.current_thread()
            with self.transaction() as db:
                if not create and not has_schema(db):
                    raise NoSchema(f"{self.path} holds no echo-bot store")
                migrate(db, only_check=not create)
            self._make_private()  # the -wal and -shm files exist now
            # Commits never checkpoint; the checkpointer thread does (see the module doc).
            self._conn.execute("PRAGMA wal_autocheckpoint = 0")
            if loop_connection:
                # Made here (it may wait for a lock while set up), used on the loop,
                # where it must never wait: a taken lock sends its batch here instead.
                conn, self._loop_wrapped = self._connect()
                conn.execute("PRAGMA wal_autocheckpoint = 0")
                conn.execute("PRAGMA busy_timeout = 0")
                self._loop_conn = conn
                self._loop_session = SqliteSession(conn, self._loop_wrapped)
        except NoSchema:
            self._close_connections()
            raise
        except (SchemaTooNew, SchemaBehind) as exc:
            self._close_connections()
            raise StoreError(f"the store {self.path}: {exc}") from None
        except sqlite3.Error as exc:
            self._close_connections()
            raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
        except OSError as exc:
            self._close_connections()
            raise StoreError(f"cannot open the store {self.path}: {exc.strerror}") from exc
        self._stop_checkpoints.clear()
        self._checkpointer = threading.Thread(
            target=self._checkpoints, name="echo-bot-sqlite-checkpoint", daemon=True
        )
        self._checkpointer.start()

    def _make_private(self) -> None:
        """The store and its -wal/-shm files are 0600 whatever the umask, also when
        they existed before. A new store file is created 0600 before SQLite opens it:
        SQLite gives the -wal and -shm files it makes the mode of the database file."""
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
        for suffix in ("", "-wal", "-shm"):
            make_private(self.path.with_name(self.path.name + suffix), PRIVATE_FILE)

    def _checkpoints(self) -> None:
        """Checkpoint the WAL every CHECKPOINT_INTERVAL s, on a connection of its own.

        PASSIVE: copies what no reader still needs, never waits for a lock and never
        blocks a writer (the WAL's design lets both go on at once). Under steady writes
        that never lets the WAL start over, so past WAL_LIMIT a TRUNCATE checkpoint
        (writers wait for it, the loop's batches on the store thread) cuts it to zero."""
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("WAL checkpoints are off (cannot open %s: %s)", self.path, exc)
            return
        try:
            sync = "FULL" if self._durability == "full" else "NORMAL"
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute("PRAGMA busy_timeout = 1000")
            wal = self.path.with_name(self.path.name + "-wal")
            said = -WAL_WARN_EVERY  # when the last warning went out (monotonic)
            while not self._stop_checkpoints.wait(CHECKPOINT_INTERVAL):
                trouble = None
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    size = wal.stat().st_size
                    if size > WAL_LIMIT:
                        # Writers wait (the loop hands its batches to the store thread)
                        # while the whole WAL is copied back and the file cut to zero.
                        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                        if busy:  # a reader still needs it: it grows on, unseen else
                            trouble = (
                                f"the store's write-ahead log is {size // 2**20} MB and"
                                " cannot be cut: another connection keeps reading (a"
                                " sqlite3 shell or a replicator left open?)"
                            )
                except (sqlite3.Error, OSError) as exc:  # busy, disk full…: next time
                    trouble = f"a checkpoint of the store's write-ahead log failed: {exc}"
                if trouble is not None and time.monotonic() - said >= WAL_WARN_EVERY:
                    said = time.monotonic()
                    log.warning("%s (tried again every %g s)", trouble, CHECKPOINT_INTERVAL)
        finally:
            conn.close()

    async def close(self) -> None:
        if self._worker is None or self._closed:
            return
        if not self._closing and asyncio.get_running_loop() is self._loop:
            # From now on loop jobs queue behind the close on the store thread; the ones
            # listed already are run (or handed over) first.
            self._closing = True
            while self._pending:
                self._flush()
        await self._close_on_thread()

    def _close(self) -> None:
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=30)
            self._checkpointer = None
        self._close_connections()

    def _close_connections(self) -> None:
        if self._loop_conn is not None:
            self._loop_conn.close()
            self._loop_conn = None
            self._loop_wrapped = None
            self._loop_session = None
        if self._conn is not None:
            # The last connection to close checkpoints the whole WAL (and removes it).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA wal_autocheckpoint = 1000")
            self._conn.close()
            self._conn = None
            self._wrapped = None
            self._session = None

    # -- running work ----------------------------------------------------------------
    async def run(
        self,
        fn: Callable[[SqliteUtilsDatabase], T],
        *,
        slow: bool = False,
        after_commit: Callable[[T], None] | None = None,
    ) -> T:
        """Run ``fn(db)`` inside a transaction, on the event loop's thread or, with
        ``slow=True`` (work that may take more than about a millisecond), on the store
        thread (see the module doc: it may share the transaction with other jobs, each
        in its own savepoint).

        The result comes back only after the COMMIT. SQLite failures (disk full, locked,
        corrupt) surface as StoreError, so callers can tell "the store could not take it"
        from a bug in what they asked. ``after_commit(result)`` runs on the loop right
        after the COMMIT, before any caller resumes, also when this caller was cancelled
        while its job ran (what it committed is there all the same).
        """
        loop = asyncio.get_running_loop()
        if slow or loop is not self._loop or self._closing or self._loop_conn is None:
            return await self._submit(fn, in_transaction=True, after_commit=after_commit)
        job = Job(fn, in_transaction=True, wrap_errors=True, loop=loop, after_commit=after_commit)
        self._pending.append(job)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return cast(T, await cast("asyncio.Future[Any]", job.future))

    # -- on the event loop -----------------------------------------------------------
    def _flush(self) -> None:
        """Commit the loop jobs listed so far in one transaction (on the loop's thread).

        Never raises: whatever a job raises goes to its caller, never into the loop."""
        self._flush_scheduled = False
        batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        if self._pending and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        batch = [job for job in batch if not job.future.cancelled()]
        if not batch:
            return
        try:
            if self._handed_off:  # earlier jobs still wait on the store thread
                self._hand_off(batch)
                return
            outcomes = self._run_on_loop(batch)
            if outcomes is None:
                self._hand_off(batch)
                return
        except BaseException as exc:  # nothing may leave a caller waiting forever
            outcomes = [(job, False, exc) for job in batch]
        self._note_away(outcomes)
        self._settle_all(outcomes)

    def _run_on_loop(self, batch: list[Job]) -> list[JobDone] | None:
        """The batch's outcomes, or None if another connection holds the write lock."""
        session = self._loop_session
        if session is None:
            return [(job, False, StoreError("the store is not open")) for job in batch]
        outcomes: list[JobDone] | None = None
        for together in (len(batch) > 1, False):
            try:
                session.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _LOCK_TAKEN:
                    return None
                return [(job, False, store_error(job, exc, session)) for job in batch]
            outcomes = run_begun(session, batch, together=together)
            if outcomes is not None:
                break
        assert outcomes is not None  # the second pass always has them
        return outcomes

    def _hand_off(self, batch: list[Job]) -> None:
        """Send loop jobs to the store thread, which waits for the lock (in order)."""
        with self._worker_lock:
            if self._closed or self._worker is None:
                refused = StoreError("the store is closed")
                self._settle_all([(job, False, refused) for job in batch])
                return
            for job in batch:
                job.handed_off = True
                self._jobs.put(job)
            self._handed_off += len(batch)

    # -- on the store thread ---------------------------------------------------------
    def _thread_session(self) -> Session | None:
        return self._session

    def _begin(self, session: Session, *, first: bool = True) -> None:
        session.execute("BEGIN" if self._reads_only else "BEGIN IMMEDIATE")

    @contextmanager
    def transaction(self) -> Iterator[SqliteUtilsDatabase]:
        """BEGIN IMMEDIATE … COMMIT on the store thread (rolls back on error)."""
        conn, wrapped = self._conn, self._wrapped
        if conn is None or wrapped is None:
            raise StoreError("the store is not open")
        if threading.current_thread() is not self._thread:
            raise StoreError("store used outside its thread")
        conn.execute("BEGIN" if self._reads_only else "BEGIN IMMEDIATE")
        try:
            yield wrapped
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")


def backup_to(source: Path, target: Path) -> int:
    """A consistent copy of the live store with SQLite's online backup API (WAL-safe).

    Returns the number of pages copied. Runs in the calling thread (management command).
    The copy holds everything the store does: it is made 0600 whatever the umask. It is
    written beside ``target`` as ``.partial`` and renamed only once SQLite's
    ``integrity_check`` passed on it. Any failure (no such directory, not writable, disk
    full, a damaged copy) is a one-line :class:`StoreError` and leaves nothing behind;
    an existing ``target`` stays as it was.
    """
    if not target.parent.is_dir():
        what = "does not exist" if not target.parent.exists() else "is not a directory"
        raise StoreError(f"cannot write the backup {target}: {target.parent} {what}")
    partial = target.with_name(target.name + ".partial")
    try:
        partial.unlink(missing_ok=True)
        # Created by us, private, before SQLite opens it (its journal copies this mode).
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except OSError as exc:
        raise StoreError(f"cannot write the backup {target}: {exc.strerror or exc}") from None
    try:
        make_private(partial, PRIVATE_FILE)
        pages, problems = _copy_and_check(source, partial)
        if problems:
            raise StoreError(
                f"the backup {target} failed SQLite's integrity check ({problems[0]}) and"
                " was removed; the store itself may be damaged: run `echo-bot doctor`"
            )
        partial.replace(target)
    except (OSError, sqlite3.Error) as exc:
        _remove_partial(partial)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise StoreError(f"the backup to {target} failed: {reason}") from None
    except BaseException:
        _remove_partial(partial)
        raise
    return pages


def _copy_and_check(source: Path, copy: Path) -> tuple[int, list[str]]:
    """Pages copied, and what ``integrity_check`` found wrong with the copy (empty: ok)."""
    from .inspect import read_only  # run with sudo, it leaves no file of root's

    with read_only(source, timeout=30) as src:
        dst = sqlite3.connect(copy)
        try:
            # One step, from one snapshot: copied in steps, the backup starts over at
            # each write another connection makes, and a busy daemon writes more often
            # than a large store takes to copy (it never finished).
            src.backup(dst, pages=-1)
            pages = int(dst.execute("PRAGMA page_count").fetchone()[0])
            found = [str(row[0]) for row in dst.execute("PRAGMA integrity_check")]
        finally:
            dst.close()
    return pages, [line for line in found if line != "ok"]


def _remove_partial(partial: Path) -> None:
    for path in (partial, partial.with_name(partial.name + "-journal")):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
