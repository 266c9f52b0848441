"""The SQLite file: one connection on one dedicated thread, WAL, forward migrations.

Every query runs on that thread (``await db.run(fn)``), so the event loop never blocks
on disk and there is exactly one writer per process. Other processes (the management
commands) open their own connection; SQLite's locking and ``busy_timeout`` serialise
them with the daemon.

Group commit: the store thread takes every job queued when it wakes (up to
``MAX_BATCH``) and runs them in one transaction, each in a savepoint of its own, then
commits once and only then hands each caller its result. A job that raises is rolled
back alone (its savepoint) and gets its error; if SQLite abandons the whole transaction
(disk full, I/O error) or the COMMIT fails, every job of the batch gets the StoreError —
none of it was committed. Under load this turns many small commits (each writing the
same table and index pages to the WAL again) and as many thread hand-offs into one.

Checkpoints (copying the WAL back into the database file, with an fsync) run on a
second connection in a thread of their own, every ``CHECKPOINT_INTERVAL`` seconds, not
inside a commit: SQLite's automatic checkpoint would stall whichever commit crosses
1000 pages — and with it every store call queued behind it — for as long as the fsync
takes (tens to hundreds of milliseconds on a busy disk).
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

_SAVEPOINT = "echo_bot_job"


class _Job:
    """One piece of work for the store thread and where its outcome goes."""

    __slots__ = ("fn", "future", "in_transaction", "loop", "wrap_errors")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        in_transaction: bool,
        wrap_errors: bool,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.fn = fn
        self.in_transaction = in_transaction
        self.wrap_errors = wrap_errors
        self.loop = loop
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
        self._conn: sqlite3.Connection | None = None
        # sqlite-utils' wrapper of the connection, made once: making one runs a PRAGMA
        # and the plugin hooks, too much to do again for every transaction.
        self._wrapped: SqliteUtilsDatabase | None = None
        self._thread: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        await self._submit(self._open, in_transaction=False)

    def open_sync(self) -> None:
        """For short-lived management commands that have no event loop."""
        self._submit_sync(self._open, in_transaction=False)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._make_private()
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10
            )
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 10000")
            conn.execute("PRAGMA journal_mode = WAL")
            sync = "FULL" if self._durability == "full" else "NORMAL"
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute("PRAGMA foreign_keys = ON")
            self._conn = conn
            self._wrapped = SqliteUtilsDatabase(conn)
            self._thread = threading.current_thread()
            with self.transaction() as db:
                migrate(db)
            self._make_private()  # the -wal and -shm files exist now
            # Commits never checkpoint; the checkpointer thread does (see the module doc).
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
        except OSError as exc:
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
        blocks a writer (the WAL's design lets both go on at once)."""
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.warning("WAL checkpoints are off (cannot open %s: %s)", self.path, exc)
            return
        try:
            sync = "FULL" if self._durability == "full" else "NORMAL"
            conn.execute(f"PRAGMA synchronous = {sync}")
            while not self._stop_checkpoints.wait(CHECKPOINT_INTERVAL):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:  # busy, disk full…: try again next time
                    log.debug("WAL checkpoint failed: %s", exc)
        finally:
            conn.close()

    async def close(self) -> None:
        if self._worker is None or self._closed:
            return
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
        if self._conn is not None:
            # The last connection to close checkpoints the whole WAL (and removes it).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA wal_autocheckpoint = 1000")
            self._conn.close()
            self._conn = None
            self._wrapped = None

    # -- running work on the store thread ---------------------------------------------
    async def run(self, fn: Callable[[SqliteUtilsDatabase], T]) -> T:
        """Run ``fn(db)`` inside a transaction on the store thread (see the module doc:
        it may share the transaction with other jobs, each in its own savepoint).

        The result comes back only after the COMMIT. SQLite failures (disk full, locked,
        corrupt) surface as StoreError, so callers can tell "the store could not take it"
        from a bug in what they asked.
        """
        return await self._submit(fn, in_transaction=True)

    def run_sync(self, fn: Callable[[SqliteUtilsDatabase], T]) -> T:
        """``run`` for management commands without an event loop (SQLite errors as is)."""
        return self._submit_sync(fn, in_transaction=True, wrap_errors=False)

    async def _submit(self, fn: Callable[..., T], *, in_transaction: bool) -> T:
        job = _Job(
            fn,
            in_transaction=in_transaction,
            wrap_errors=True,
            loop=asyncio.get_running_loop(),
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
                _deliver([(job, *_call(job.fn))])
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
                _deliver(outcomes)
            except BaseException:  # the store thread must go on serving
                log.exception("handing store results back failed")

    def _run_batch(self, batch: list[_Job]) -> list[tuple[_Job, bool, Any]]:
        """Run the jobs in one transaction; (job, ok, result or error) for each."""
        conn, wrapped = self._conn, self._wrapped
        if conn is None or wrapped is None:
            return [(job, False, StoreError("the store is not open")) for job in batch]
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            return [(job, False, _store_error(job, exc)) for job in batch]
        alone = len(batch) == 1
        outcomes: list[tuple[_Job, bool, Any]] = []
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
            # The transaction is lost (or would not commit, or a job raised something
            # that is not an error): nothing of the batch is stored. The job that raised
            # gets its error; the others are told their work was rolled back with it.
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


def _deliver(outcomes: list[tuple[_Job, bool, Any]]) -> None:
    """Hand each job its outcome: one wake-up per event loop for the whole batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, bool, Any]]] = {}
    for outcome in outcomes:
        job = outcome[0]
        if job.loop is None:
            _settle(outcome)
        else:
            by_loop.setdefault(job.loop, []).append(outcome)
    for loop, some in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_settle_all, some)


def _settle_all(outcomes: list[tuple[_Job, bool, Any]]) -> None:
    for outcome in outcomes:
        try:
            _settle(outcome)
        except Exception:  # one bad outcome must not leave the others waiting
            log.exception("handing a store result back failed")
            if not outcome[0].future.done():
                outcome[0].future.set_exception(StoreError("store error: no result"))


def _settle(outcome: tuple[_Job, bool, Any]) -> None:
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
