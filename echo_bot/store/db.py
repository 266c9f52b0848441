"""The SQLite file: one connection on one dedicated thread, WAL, forward migrations.

Every query runs on that thread (``await db.run(fn)``), so the event loop never blocks
on disk and there is exactly one writer per process. Other processes (the management
commands) open their own connection; SQLite's locking and ``busy_timeout`` serialise
them with the daemon.

Checkpoints (copying the WAL back into the database file, with an fsync) run on a
second connection in a thread of their own, every ``CHECKPOINT_INTERVAL`` seconds, not
inside a commit: SQLite's automatic checkpoint would stall whichever commit crosses
1000 pages — and with it every store call queued behind it — for as long as the fsync
takes (tens to hundreds of milliseconds on a busy disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database as SqliteUtilsDatabase

from ..errors import StoreError
from .schema import migrate

T = TypeVar("T")

DB_FILENAME = "echo-bot.sqlite3"
CHECKPOINT_INTERVAL = 1.0  # seconds between WAL checkpoints (PASSIVE, off the commit path)

log = logging.getLogger(__name__)


class Database:
    def __init__(self, path: Path, *, durability: str = "normal") -> None:
        self.path = path
        self._durability = durability
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo-bot-sqlite")
        self._conn: sqlite3.Connection | None = None
        # sqlite-utils' wrapper of the connection, made once: making one runs a PRAGMA
        # and the plugin hooks, too much to do again for every transaction.
        self._wrapped: SqliteUtilsDatabase | None = None
        self._thread: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        await self._submit(self._open)

    def open_sync(self) -> None:
        """For short-lived management commands that have no event loop."""
        self._executor.submit(self._open).result()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
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
            # Commits never checkpoint; the checkpointer thread does (see the module doc).
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
        self._stop_checkpoints.clear()
        self._checkpointer = threading.Thread(
            target=self._checkpoints, name="echo-bot-sqlite-checkpoint", daemon=True
        )
        self._checkpointer.start()

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
        await self._submit(self._close)
        self._executor.shutdown(wait=True)

    def close_sync(self) -> None:
        self._executor.submit(self._close).result()
        self._executor.shutdown(wait=True)

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
    async def _submit(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def run(self, fn: Callable[[SqliteUtilsDatabase], T]) -> T:
        """Run ``fn(db)`` inside one transaction on the store thread.

        SQLite failures (disk full, locked, corrupt) surface as StoreError, so callers can
        tell "the store could not take it" from a bug in what they asked.
        """

        def job() -> T:
            try:
                with self.transaction() as db:
                    return fn(db)
            except sqlite3.Error as exc:
                raise StoreError(f"store error: {exc}") from exc

        return await self._submit(job)

    def run_sync(self, fn: Callable[[SqliteUtilsDatabase], T]) -> T:
        def job() -> T:
            with self.transaction() as db:
                return fn(db)

        return self._executor.submit(job).result()

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


def backup_to(source: Path, target: Path) -> int:
    """A consistent copy of the live store with SQLite's online backup API (WAL-safe).

    Returns the number of pages copied. Runs in the calling thread (management command).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    try:
        dst = sqlite3.connect(partial)
        try:
            src.backup(dst, pages=1024)
            pages = dst.execute("PRAGMA page_count").fetchone()[0]
            dst.execute("PRAGMA integrity_check").fetchone()
        finally:
            dst.close()
    finally:
        src.close()
    partial.replace(target)
    return int(pages)
