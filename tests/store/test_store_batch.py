"""The store's group commit: jobs queued together share one transaction (run again, each
in its own savepoint, when one fails); each caller gets its own result or error, and only
after the COMMIT. Short
jobs run on the event loop's thread; slow ones, and jobs that meet another writer's
lock, on the store thread."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from sqlite_utils import Database as SqlDb

from echo_bot.errors import StoreError
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store
from echo_bot.store.db import BUSY_TIMEOUT_MS
from echo_bot.store.engine import MAX_BATCH
from tests.waiting import eventually

Job = Callable[[SqlDb], Any]


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(tmp_path / "batch.sqlite3")
    await database.open()
    await database.run(lambda d: d.execute("CREATE TABLE scratch (id INTEGER PRIMARY KEY, v TEXT)"))
    yield database
    await database.close()


@pytest.fixture
def reader(db: Database) -> Iterator[sqlite3.Connection]:
    """Another connection to the same file: it sees only what was committed."""
    conn = sqlite3.connect(db.path, isolation_level=None, check_same_thread=False)
    with contextlib.closing(conn):
        yield conn


def committed(conn: sqlite3.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT id, v FROM scratch").fetchall())


def insert(i: int, value: str | None = None) -> Job:
    def job(d: SqlDb) -> int:
        d.execute("INSERT INTO scratch (id, v) VALUES (?, ?)", [i, value or f"row {i}"])
        return i

    return job


async def run_together(db: Database, jobs: list[Job]) -> list[Any]:
    """Run ``jobs`` launched in the same loop iteration: the store lists them all before
    its next flush and commits them together (at most MAX_BATCH to a transaction)."""
    return await asyncio.gather(*(db.run(job) for job in jobs), return_exceptions=True)


async def test_many_concurrent_jobs_are_all_committed(
    db: Database, reader: sqlite3.Connection
) -> None:
    seen_uncommitted: list[bool] = []

    def job(i: int) -> Job:
        def run(d: SqlDb) -> int:
            insert(i)(d)
            # Rows of earlier jobs of the same transaction are visible here, not elsewhere.
            here = d.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]
            elsewhere = reader.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]
            seen_uncommitted.append(here > elsewhere + 1)
            return i

        return run

    results = await run_together(db, [job(i) for i in range(200)])
    assert results == list(range(200))
    assert committed(reader) == {i: f"row {i}" for i in range(200)}
    assert any(seen_uncommitted)  # the jobs did share transactions


async def test_a_job_that_raises_is_rolled_back_alone_with_its_own_error(
    db: Database, reader: sqlite3.Connection
) -> None:
    error = ValueError("bad input for job 25")

    def failing(d: SqlDb) -> None:
        insert(25)(d)
        d.execute("UPDATE scratch SET v = 'clobbered'")
        raise error

    jobs = [failing if i == 25 else insert(i) for i in range(50)]
    results = await run_together(db, jobs)
    assert results[25] is error
    assert results[:25] + results[26:] == [i for i in range(50) if i != 25]
    assert committed(reader) == {i: f"row {i}" for i in range(50) if i != 25}


@pytest.mark.parametrize("together", [True, False])
async def test_an_sqlite_error_comes_back_as_store_error_and_the_others_commit(
    db: Database, reader: sqlite3.Connection, together: bool
) -> None:
    await db.run(insert(1, "original"))

    def duplicate(d: SqlDb) -> None:
        insert(1000)(d)  # rolled back with the failing insert
        insert(1, "duplicate")(d)

    jobs = [insert(i) for i in range(2, 40)]
    if together:
        results = await run_together(db, [*jobs[:10], duplicate, *jobs[10:]])
        failed = results.pop(10)
    else:
        with pytest.raises(StoreError) as caught:
            await db.run(duplicate)
        failed = caught.value
        results = [await db.run(job) for job in jobs]
    assert isinstance(failed, StoreError)
    assert isinstance(failed.__cause__, sqlite3.IntegrityError)
    assert "UNIQUE constraint failed" in str(failed)
    assert results == list(range(2, 40))
    expected = {1: "original"} | {i: f"row {i}" for i in range(2, 40)}
    assert committed(reader) == expected


async def test_each_job_gets_its_own_result(db: Database) -> None:
    def job(i: int) -> Job:
        return lambda d: (i, d.execute("SELECT ? * ?", [i, i]).fetchone()[0])

    results = await run_together(db, [job(i) for i in range(100)])
    assert results == [(i, i * i) for i in range(100)]
    # Without a busy store thread to queue behind, too.
    assert await asyncio.gather(*(db.run(job(i)) for i in range(100))) == results


async def test_a_result_arrives_only_once_its_row_is_committed(
    db: Database, reader: sqlite3.Connection
) -> None:
    async def write_then_look(i: int) -> str | None:
        await db.run(insert(i))
        row = reader.execute("SELECT v FROM scratch WHERE id = ?", [i]).fetchone()
        return row[0] if row else None

    seen = await asyncio.gather(*(write_then_look(i) for i in range(30)))
    assert seen == [f"row {i}" for i in range(30)]


async def test_run_after_close_is_refused(tmp_path: Path) -> None:
    db = Database(tmp_path / "closed.sqlite3")
    await db.open()
    assert await db.run(lambda d: d.execute("SELECT 1").fetchone()[0]) == 1
    await db.close()
    with pytest.raises(StoreError, match="closed"):
        await db.run(lambda d: d.execute("SELECT 1").fetchone()[0])
    await db.close()  # closing twice is harmless


class Interrupt(BaseException):
    """Not an Exception: what a job could raise that is not an error (say, SystemExit)."""


async def test_a_job_raising_a_base_exception_leaves_the_store_usable(
    db: Database, reader: sqlite3.Connection
) -> None:
    def interrupted(d: SqlDb) -> None:
        d.execute("INSERT INTO scratch (id, v) VALUES (1, 'interrupted')")
        raise Interrupt()

    outcomes = await asyncio.gather(
        db.run(insert(2)), db.run(interrupted), db.run(insert(3)), return_exceptions=True
    )
    assert isinstance(outcomes[1], Interrupt)
    stored = committed(reader)
    assert 1 not in stored  # its transaction rolled back, nothing half-stored
    # Jobs that shared its transaction failed with it (told so); the others are stored.
    for i, outcome in ((2, outcomes[0]), (3, outcomes[2])):
        assert (i in stored) == (outcome == i)
        if outcome != i:
            assert isinstance(outcome, StoreError) and "rolled back" in str(outcome)
    assert await db.run(insert(4)) == 4  # the next transaction starts cleanly
    assert committed(reader)[4] == "row 4"


async def test_a_job_raising_stop_iteration_does_not_strand_the_others(
    db: Database, reader: sqlite3.Connection
) -> None:
    # asyncio futures refuse StopIteration (a next() without a default in a query, say).
    def runs_dry(d: SqlDb) -> None:
        next(iter(d.execute("SELECT id FROM scratch WHERE id = -1").fetchall()))

    async with asyncio.timeout(10):
        outcomes = await run_together(db, [insert(1), runs_dry, insert(2)])
    assert outcomes[0] == 1 and outcomes[2] == 2
    assert isinstance(outcomes[1], RuntimeError) and "StopIteration" in str(outcomes[1])
    assert committed(reader) == {1: "row 1", 2: "row 2"}


async def test_a_job_that_swallows_a_rollback_is_not_told_it_succeeded(
    db: Database, reader: sqlite3.Connection
) -> None:
    await db.run(insert(1))

    def swallows(d: SqlDb) -> str:
        d.execute("INSERT INTO scratch (id, v) VALUES (5, 'before')")
        with contextlib.suppress(sqlite3.IntegrityError):
            # OR ROLLBACK: SQLite ends the whole transaction, not just this statement.
            d.execute("INSERT OR ROLLBACK INTO scratch (id, v) VALUES (1, 'clash')")
        return "ok"

    with pytest.raises(StoreError, match="rolled back"):
        await db.run(swallows)
    assert 5 not in committed(reader)
    assert await db.run(insert(6)) == 6  # and the store goes on


def where(_d: SqlDb) -> int:
    return threading.get_ident()


async def test_jobs_launched_in_one_loop_iteration_share_one_transaction(
    db: Database, reader: sqlite3.Connection
) -> None:
    def job(i: int) -> Job:
        def run(d: SqlDb) -> tuple[int, int]:
            insert(i)(d)
            here = d.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]
            elsewhere = reader.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]
            return here, elsewhere

        return run

    jobs = [job(i) for i in range(MAX_BATCH)]
    # Each job sees every earlier one's row, which nobody else sees yet: one transaction.
    assert await run_together(db, jobs) == [(i + 1, 0) for i in range(MAX_BATCH)]
    assert len(committed(reader)) == MAX_BATCH


async def test_short_jobs_run_on_the_event_loop_thread(tmp_path: Path) -> None:
    db = Database(tmp_path / "normal.sqlite3")
    await db.open()
    try:
        loop_thread = threading.get_ident()
        assert await db.run(where) == loop_thread
        assert await run_together(db, [where] * 10) == [loop_thread] * 10
    finally:
        await db.close()


async def test_slow_jobs_and_full_durability_run_off_the_loop(tmp_path: Path) -> None:
    loop_thread = threading.get_ident()
    db = Database(tmp_path / "normal.sqlite3")
    await db.open()
    try:
        assert await db.run(where, slow=True) != loop_thread
        assert await db.run(where) == loop_thread
        # The typed layer on top passes ``slow`` through.
        store = Store(db, Masker())
        assert await store.run(lambda _tx: threading.get_ident(), slow=True) != loop_thread
        assert await store.run(lambda _tx: threading.get_ident()) == loop_thread
    finally:
        await db.close()
    full = Database(tmp_path / "full.sqlite3", durability="full")
    await full.open()
    try:
        assert await full.run(where) != loop_thread  # every commit fsyncs: off the loop
        assert await full.run(where, slow=True) != loop_thread
        assert await full.run(lambda d: d.execute("PRAGMA synchronous").fetchone()[0]) == 2
    finally:
        await full.close()


# Another process (a management command, say) holding the write lock until told to commit.
LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO scratch (id, v) VALUES (0, 'other process')")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
print("committed", flush=True)
"""


async def test_another_process_holding_the_write_lock_does_not_block_the_loop(
    db: Database, reader: sqlite3.Connection
) -> None:
    order: list[tuple[int, int]] = []

    def noted(i: int) -> Job:
        def job(d: SqlDb) -> int:
            insert(i)(d)
            order.append((i, threading.get_ident()))
            return i

        return job

    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOCK_HOLDER, str(db.path),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert holder.stdin is not None and holder.stdout is not None
    loop = asyncio.get_running_loop()
    gaps: list[float] = []  # between the ticks of a ticker on the loop

    async def ticker() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - last)
            last = loop.time()

    ticking = asyncio.ensure_future(ticker())
    async with asyncio.timeout(60):
        assert await holder.stdout.readline() == b"locked\n"
        first = asyncio.ensure_future(db.run(noted(1)))
        while len(gaps) < 50:  # the loop goes on answering while the lock is held
            await asyncio.sleep(0.01)
        assert not first.done()  # it waits for the lock, off the loop
        second = asyncio.ensure_future(db.run(noted(2)))  # submitted later: runs later
        while len(gaps) < 55:
            await asyncio.sleep(0.01)
        assert not second.done()
        # One given up while it waits (its caller cancelled): it is not run.
        given_up = asyncio.ensure_future(db.run(noted(3)))
        while len(gaps) < 60:
            await asyncio.sleep(0.01)
        given_up.cancel()
        holder.stdin.write(b"commit\n")
        await holder.stdin.drain()
        assert await holder.stdout.readline() == b"committed\n"
        assert cast(list[int], await asyncio.gather(first, second)) == [1, 2]
        with pytest.raises(asyncio.CancelledError):
            await given_up
        assert await holder.wait() == 0
    ticking.cancel()
    # Not a speed test: waiting for the lock (as the store thread does, up to its busy
    # timeout) would have stopped the ticker for seconds.
    assert max(gaps) < BUSY_TIMEOUT_MS / 1000 / 2
    loop_thread = threading.get_ident()
    assert [i for i, _ in order] == [1, 2]
    assert all(thread != loop_thread for _, thread in order)
    assert committed(reader) == {0: "other process", 1: "row 1", 2: "row 2"}
    # The store thread has drained what the loop handed it: jobs run on the loop again.
    assert await db.run(where) == loop_thread


async def test_run_sync_from_threads_while_the_loop_commits_too(
    db: Database, reader: sqlite3.Connection
) -> None:
    """The store thread's writes and the loop's contend for the one write lock: the
    loop never waits for it, and every job of both kinds is committed once."""

    def worker(n: int) -> list[int]:
        return [db.run_sync(insert(n * 100 + k)) for k in range(20)]

    async def on_loop(n: int) -> list[int]:
        return [await db.run(insert(n * 100 + k)) for k in range(20)]

    outcomes = await asyncio.gather(
        *(asyncio.to_thread(worker, n) for n in range(8)),
        *(on_loop(n) for n in range(8, 16)),
    )
    assert outcomes == [[n * 100 + k for k in range(20)] for n in range(16)]
    assert committed(reader) == {
        n * 100 + k: f"row {n * 100 + k}" for n in range(16) for k in range(20)
    }


async def test_a_job_cancelled_before_its_flush_does_not_run(
    db: Database, reader: sqlite3.Connection
) -> None:
    ran: list[int] = []

    def job(d: SqlDb) -> int:
        ran.append(7)
        return cast(int, insert(7)(d))

    task = asyncio.ensure_future(db.run(job))
    await asyncio.sleep(0)  # the task has listed its job; the store's flush comes next
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await db.run(insert(8)) == 8
    assert ran == []
    assert committed(reader) == {8: "row 8"}


async def test_close_commits_the_loop_jobs_already_listed(tmp_path: Path) -> None:
    db = Database(tmp_path / "closing.sqlite3")
    await db.open()
    await db.run(lambda d: d.execute("CREATE TABLE scratch (id INTEGER PRIMARY KEY, v TEXT)"))
    listed = asyncio.ensure_future(db.run(insert(1)))
    await asyncio.sleep(0)  # listed, not flushed yet
    await db.close()
    assert await listed == 1
    with contextlib.closing(sqlite3.connect(db.path)) as conn:
        assert committed(conn) == {1: "row 1"}


async def test_run_sync_is_refused_on_the_event_loop_thread(db: Database) -> None:
    # Inside a loop job it would wait the whole busy timeout for the loop's own lock.
    with pytest.raises(StoreError, match="await run"):
        db.run_sync(lambda d: d.execute("SELECT 1").fetchone())
    assert await db.run(lambda d: d.execute("SELECT 1").fetchone()[0]) == 1


async def test_a_job_given_up_while_the_store_thread_waits_for_the_lock_does_not_run(
    db: Database, reader: sqlite3.Connection
) -> None:
    other = sqlite3.connect(db.path, isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # another process's write lock
    try:
        waiting = asyncio.ensure_future(db.run(insert(7)))
        # Kept: nothing public shows that the job was handed to the store thread and
        # that the thread now waits in BEGIN (nor that it has seen the cancel), so each
        # is given a moment. Too short a moment tests less; it never fails wrongly.
        await asyncio.sleep(0.3)  # handed to the store thread, which waits in BEGIN
        waiting.cancel()
        await asyncio.sleep(0.05)
    finally:
        other.execute("COMMIT")
        other.close()
    assert await db.run(insert(8)) == 8  # after the waiting batch
    assert committed(reader) == {8: "row 8"}


def test_the_wal_is_cut_back_under_steady_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from echo_bot.store import db as engine

    monkeypatch.setattr(engine, "WAL_LIMIT", 256 * 1024)
    monkeypatch.setattr(engine, "CHECKPOINT_INTERVAL", 0.05)
    store = Database(tmp_path / "wal.sqlite3")
    store.open_sync()
    wal = tmp_path / "wal.sqlite3-wal"
    try:
        store.run_sync(lambda d: d.execute("CREATE TABLE scratch (id INTEGER PRIMARY KEY, v)"))
        biggest = 0
        for i in range(400):  # ~4 MB over about a second, a write every 2.5 ms
            store.run_sync(insert(i, "x" * 10_000))
            biggest = max(biggest, wal.stat().st_size)
            time.sleep(0.0025)
        # Until the checkpointer (every 0.05 s here) has cut the WAL back.
        asyncio.run(eventually(lambda: wal.stat().st_size <= 256 * 1024, what="the WAL cut back"))
        assert wal.stat().st_size <= 256 * 1024
    finally:
        store.close_sync()
    assert biggest < 2 * 1024 * 1024
