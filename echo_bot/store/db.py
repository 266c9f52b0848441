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

Both paths group-commit the same way. The jobs of a batch run one after another with
no savepoint between them; if one raises, the transaction is rolled back and the batch
runs again, each job in a savepoint of its own (a savepoint per job, every time, cost
10–15 % of a turn). So a job may run twice before it commits and must act only through
its connection. A job that raises is rolled back alone (its savepoint) and gets its
error; SQLite's errors come back as StoreError (``run_sync``:
as they are). If SQLite abandons the whole transaction (disk full, I/O error), a job
raises something that is not an Exception, or the COMMIT fails, every job of the batch
fails — none of it was committed: the culprit gets its own error, the others a
StoreError saying they were rolled back with another job. No job's exception ever
leaves the flush into the event loop. A job whose caller was cancelled before its batch
ran is not run.

Checkpoints (copying the WAL back into the database file, with an fsync) run on a
third connection in a thread of their own, every ``CHECKPOINT_INTERVAL`` seconds, not
inside a commit: SQLite's automatic checkpoint would stall whichever commit crosses
1000 pages — and with it every store call queued behind it, on the loop: the loop
itself — for as long as the fsync takes (tens to hundreds of milliseconds on a busy
disk).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database as SqliteUtilsDatabase

from ..errors import StoreError
from ..hardening import PRIVATE_FILE, make_private
from .schema import migrate

T = TypeVar("T")

DB_FILENAME = "echo-bot.sqlite3"
CHECKPOINT_INTERVAL = 1.0  # seconds between WAL checkpoints (PASSIVE, off the commit path)
MAX_BATCH = 128  # jobs committed together at most
BUSY_TIMEOUT_MS = 10_000  # how long the store thread waits for another writer
# Past this, the checkpointer truncates the WAL (a PASSIVE checkpoint under steady writes
# never lets it restart, and nothing else would shrink it). Writers wait for the TRUNCATE
# (tens of ms, mostly its fsyncs): at 64 MB a saturated daemon (~90 MB of WAL a second)
# waited every 0.7 s, 5–10 % of its turns (bench/turns.py); at 256 MB every ~3 s.
WAL_LIMIT = 256 * 1024 * 1024
# What SQLite keeps of the WAL file when it starts over (journal_size_limit).
WAL_KEEP = 64 * 1024 * 1024

_SAVEPOINT = "echo_bot_job"
_LOCK_TAKEN = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)

Outcome = tuple["_Job", bool, Any]  # (job, ok, result or error)


class _Job:
    """One piece of work for the store and where its outcome goes."""

    __slots__ = (
        "after_commit",
        "fn",
        "future",
        "handed_off",
        "in_transaction",
        "loop",
        "wrap_errors",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        in_transaction: bool,
        wrap_errors: bool,
        loop: asyncio.AbstractEventLoop | None,
        after_commit: Callable[[Any], None] | None = None,
    ) -> None:
        self.fn = fn
        self.after_commit = after_commit
        self.in_transaction = in_transaction
        self.wrap_errors = wrap_errors
        self.loop = loop
        # A loop job the loop passed to the store thread (its write lock was taken).
        self.handed_off = False
        self.future: asyncio.Future[Any] | concurrent.futures.Future[Any] = (
            loop.create_future() if loop is not None else concurrent.futures.Future()
        )


_STOP = object()

log = logging.getLogger(__name__)


class Database:
    def __init__(self, path: Path, *, durability: str = "normal") -> None:
        self.path = path
        self._durability = durability
        self._jobs: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._closed = False
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
        self._pending: list[_Job] = []
        self._flush_scheduled = False
        self._handed_off = 0  # loop jobs the store thread has not finished yet
        self._closing = False
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        on_loop = self._durability != "full"
        await self._submit(lambda: self._open(loop_connection=on_loop), in_transaction=False)
        self._loop = loop if on_loop else None

    def open_sync(self) -> None:
        """For short-lived management commands that have no event loop."""
        self._submit_sync(lambda: self._open(loop_connection=False), in_transaction=False)

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

    def _open(self, *, loop_connection: bool) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._make_private()
            self._conn, self._wrapped = self._connect()
            self._thread = threading.current_thread()
            with self.transaction() as db:
                migrate(db)
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
            while not self._stop_checkpoints.wait(CHECKPOINT_INTERVAL):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    if wal.stat().st_size > WAL_LIMIT:
                        # Writers wait (the loop hands its batches to the store thread)
                        # while the whole WAL is copied back and the file cut to zero.
                        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except (sqlite3.Error, OSError) as exc:  # busy, disk full…: next time
                    log.debug("WAL checkpoint failed: %s", exc)
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
        try:
            await self._submit(self._close, in_transaction=False)
        finally:
            self._stop_worker()
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join)

    def close_sync(self) -> None:
        if self._worker is None or self._closed:
            return
        try:
            self._submit_sync(self._close, in_transaction=False)
        finally:
            self._stop_worker()
        if self._worker is not None:
            self._worker.join()

    def _stop_worker(self) -> None:
        with self._worker_lock:
            self._closed = True
            self._jobs.put(_STOP)

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
        if self._conn is not None:
            # The last connection to close checkpoints the whole WAL (and removes it).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA wal_autocheckpoint = 1000")
            self._conn.close()
            self._conn = None
            self._wrapped = None

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
        job = _Job(fn, in_transaction=True, wrap_errors=True, loop=loop, after_commit=after_commit)
        self._pending.append(job)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await job.future  # type: ignore[no-any-return]

    def run_sync(self, fn: Callable[[SqliteUtilsDatabase], T]) -> T:
        """``run`` for management commands without an event loop (SQLite errors as is).

        Refused on a thread that runs an event loop: it would block the loop — for the
        whole busy timeout, and then fail, when called inside a loop job that holds the
        write lock."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._submit_sync(fn, in_transaction=True, wrap_errors=False)
        raise StoreError("run_sync called on an event loop's thread: await run() instead")

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
        self._settle_all(outcomes)

    def _run_on_loop(self, batch: list[_Job]) -> list[Outcome] | None:
        """The batch's outcomes, or None if another connection holds the write lock."""
        conn, wrapped = self._loop_conn, self._loop_wrapped
        if conn is None or wrapped is None:
            return [(job, False, StoreError("the store is not open")) for job in batch]
        outcomes: list[Outcome] | None = None
        for together in (len(batch) > 1, False):
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _LOCK_TAKEN:
                    return None
                return [(job, False, _store_error(job, exc)) for job in batch]
            outcomes = _run_begun(conn, wrapped, batch, together=together)
            if outcomes is not None:
                break
        assert outcomes is not None  # the second pass always has them
        return outcomes

    def _hand_off(self, batch: list[_Job]) -> None:
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
    async def _submit(
        self,
        fn: Callable[..., T],
        *,
        in_transaction: bool,
        after_commit: Callable[[T], None] | None = None,
    ) -> T:
        job = _Job(
            fn,
            in_transaction=in_transaction,
            wrap_errors=True,
            loop=asyncio.get_running_loop(),
            after_commit=after_commit,
        )
        self._enqueue(job)
        return await job.future  # type: ignore[no-any-return]

    def _submit_sync(
        self, fn: Callable[..., T], *, in_transaction: bool, wrap_errors: bool = True
    ) -> T:
        job = _Job(fn, in_transaction=in_transaction, wrap_errors=wrap_errors, loop=None)
        self._enqueue(job)
        return job.future.result()  # type: ignore[union-attr,no-any-return]

    def _enqueue(self, job: _Job) -> None:
        with self._worker_lock:
            if self._closed:
                raise StoreError("the store is closed")
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._serve, name="echo-bot-sqlite", daemon=True
                )
                self._worker.start()
            self._jobs.put(job)

    def _serve(self) -> None:
        held: _Job | object | None = None
        while True:
            job = held if held is not None else self._jobs.get()
            held = None
            if job is _STOP:
                return
            assert isinstance(job, _Job)
            if not job.in_transaction:
                self._deliver([(job, *_call(job.fn))])
                continue
            batch = [job]
            while len(batch) < MAX_BATCH:
                try:
                    following = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if following is _STOP or not following.in_transaction:  # type: ignore[union-attr]
                    held = following
                    break
                batch.append(following)  # type: ignore[arg-type]
            try:
                outcomes = self._run_batch(batch)
            except BaseException as exc:  # nothing may leave a caller waiting forever
                outcomes = [(j, False, exc) for j in batch]
            try:
                self._deliver(outcomes)
            except BaseException:  # the store thread must go on serving
                log.exception("handing store results back failed")

    def _run_batch(self, batch: list[_Job]) -> list[Outcome]:
        """Run the jobs in one transaction on the store thread's connection."""
        conn, wrapped = self._conn, self._wrapped
        if conn is None or wrapped is None:
            return [(job, False, StoreError("the store is not open")) for job in batch]
        # A cancelled caller's job is not run (its outcome only settles the count).
        live: list[_Job] = []
        dropped: list[Outcome] = []
        for job in batch:
            if job.future.cancelled():
                dropped.append((job, False, None))
            else:
                live.append(job)
        if not live:
            return dropped
        for together in (True, False):
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                return dropped + [(job, False, _store_error(job, exc)) for job in live]
            # BEGIN may have waited for another writer's lock (up to the busy timeout):
            # a caller that gave up meanwhile is not run either.
            dropped += [(job, False, None) for job in live if job.future.cancelled()]
            live = [job for job in live if not job.future.cancelled()]
            if not live:
                conn.execute("ROLLBACK")
                return dropped
            outcomes = _run_begun(conn, wrapped, live, together=together and len(live) > 1)
            if outcomes is not None:
                return dropped + outcomes
        raise AssertionError("the second pass always has outcomes")

    def _deliver(self, outcomes: list[Outcome]) -> None:
        """Hand each job its outcome: one wake-up per event loop for the whole batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
        for outcome in outcomes:
            job = outcome[0]
            if job.loop is None:
                _settle(outcome)
            else:
                by_loop.setdefault(job.loop, []).append(outcome)
        for loop, some in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                loop.call_soon_threadsafe(self._settle_all, some)

    def _settle_all(self, outcomes: list[Outcome]) -> None:
        """On the jobs' loop, after the COMMIT: run each committed job's
        ``after_commit``, then set each future, in the order the jobs ran. Every
        outcome is settled whatever a hook raises (a BaseException is raised again
        once all are)."""
        raised: BaseException | None = None
        for job, ok, value in outcomes:
            if ok and job.after_commit is not None:
                try:
                    job.after_commit(value)
                except Exception:  # committed all the same
                    log.exception("a store job's after-commit hook failed")
                except BaseException as exc:
                    raised = raised or exc
        for outcome in outcomes:
            if outcome[0].handed_off:
                outcome[0].handed_off = False
                self._handed_off -= 1
            try:
                _settle(outcome)
            except Exception:  # one bad outcome must not leave the others waiting
                log.exception("handing a store result back failed")
                if not outcome[0].future.done():
                    outcome[0].future.set_exception(StoreError("store error: no result"))
        if raised is not None:
            raise raised

    @contextmanager
    def transaction(self) -> Iterator[SqliteUtilsDatabase]:
        """BEGIN IMMEDIATE … COMMIT on the store thread (rolls back on error)."""
        conn, wrapped = self._conn, self._wrapped
        if conn is None or wrapped is None:
            raise StoreError("the store is not open")
        if threading.current_thread() is not self._thread:
            raise StoreError("store used outside its thread")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield wrapped
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")


def _run_begun(
    conn: sqlite3.Connection,
    wrapped: SqliteUtilsDatabase,
    batch: list[_Job],
    *,
    together: bool,
) -> list[Outcome] | None:
    """Run the jobs in the transaction just begun, then COMMIT; an outcome for each.

    ``together``: one after another with nothing between them, betting that none
    fails. If one raises, the transaction is rolled back and None returned: the caller
    begins again and runs the batch with ``together=False``, each job in a savepoint of
    its own, so the failing one is rolled back alone. (A savepoint per job cost 10–15 %
    of a turn's CPU: SQLite copies every page a job first touches into its
    sub-journal.) So a job may run twice before it commits: it must act only through
    its connection — see ``Tx.on_commit`` for what is to happen once committed."""
    alone = len(batch) == 1 or together
    outcomes: list[Outcome] = []
    culprit: _Job | None = None
    try:
        for job in batch:
            culprit = job
            if not alone:
                conn.execute(f"SAVEPOINT {_SAVEPOINT}")
            try:
                value = job.fn(wrapped)
            except Exception as exc:
                if not conn.in_transaction:  # SQLite rolled all of it back
                    raise
                if together:
                    conn.execute("ROLLBACK")
                    return None
                conn.execute("ROLLBACK" if alone else f"ROLLBACK TO {_SAVEPOINT}")
                if not alone:
                    conn.execute(f"RELEASE {_SAVEPOINT}")
                outcomes.append((job, False, _store_error(job, exc)))
            else:
                if not conn.in_transaction:
                    # The job caught an error after which SQLite had rolled the
                    # transaction back: what it did before is gone.
                    raise StoreError("store error: the transaction was rolled back")
                if not alone:
                    conn.execute(f"RELEASE {_SAVEPOINT}")
                outcomes.append((job, True, value))
        culprit = None
        if conn.in_transaction:  # not when a lone job failed and was rolled back
            conn.execute("COMMIT")
    except BaseException as exc:
        # The transaction is lost (or would not commit, or a job raised something that
        # is not an error): nothing of the batch is stored. The job that raised gets its
        # error; the others are told their work was rolled back with it.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        error = _store_error(culprit or batch[0], exc)
        rolled_back = StoreError(f"store error: rolled back with another job ({exc!r})")
        return [
            (job, False, error if job is culprit or culprit is None else rolled_back)
            for job in batch
        ]
    return outcomes


def _call(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except BaseException as exc:
        return False, exc


def _store_error(job: _Job, exc: BaseException) -> BaseException:
    if job.wrap_errors and isinstance(exc, sqlite3.Error):
        error = StoreError(f"store error: {exc}")
        error.__cause__ = exc
        return error
    return exc


def _settle(outcome: Outcome) -> None:
    job, ok, value = outcome
    future = job.future
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    elif isinstance(value, StopIteration):  # a future refuses StopIteration
        error = RuntimeError(f"store job raised {value!r}")
        error.__cause__ = value
        future.set_exception(error)
    else:
        future.set_exception(value)


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
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    try:
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst, pages=1024)
            pages = int(dst.execute("PRAGMA page_count").fetchone()[0])
            found = [str(row[0]) for row in dst.execute("PRAGMA integrity_check")]
        finally:
            dst.close()
    finally:
        src.close()
    return pages, [line for line in found if line != "ok"]


def _remove_partial(partial: Path) -> None:
    for path in (partial, partial.with_name(partial.name + "-journal")):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
