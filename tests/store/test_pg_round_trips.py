"""PostgreSQL: a unit of work's statements are held back and sent together at its next
read or its COMMIT (``PgHandle``), against a real server. What a user would notice: the
same results and errors as one statement at a time, fewer waits on the network, and a
daemon frozen between two sends holding no row it has not sent a statement for."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from echo_bot.errors import StoreError
from echo_bot.store.postgres import PostgresDatabase
from tests.postgres import fresh_database

SCRATCH = "CREATE TABLE scratch (id INTEGER PRIMARY KEY, v TEXT)"


class Pg(PostgresDatabase):
    url = ""


@pytest.fixture
async def pg() -> AsyncIterator[Pg]:
    with fresh_database() as url:
        db = Pg(url)
        db.url = url
        await db.open()
        try:
            await db.run(lambda d: d.execute(SCRATCH))
            yield db
        finally:
            await db.close()


async def waits_for(db: PostgresDatabase, job: Any) -> tuple[Any, int]:
    """``job``'s result and the round trips the store's connection made for it."""
    before = await db.run(lambda d: d.round_trips)
    value = await db.run(job)
    after = await db.run(lambda d: d.round_trips)
    return value, after - before


async def test_statements_whose_results_are_not_read_wait_once_with_the_commit(
    pg: Pg,
) -> None:
    def five_inserts(d: Any) -> None:
        for i in range(5):
            d.execute("INSERT INTO scratch (id, v) VALUES (?, ?)", [i, f"row {i}"])

    _, trips = await waits_for(pg, five_inserts)
    # The COMMIT's wait, and the BEGIN's if the connection had been idle a while.
    assert trips <= 2
    rows = await pg.run(lambda d: d.execute("SELECT id, v FROM scratch ORDER BY id").fetchall())
    assert [tuple(r) for r in rows] == [(i, f"row {i}") for i in range(5)]


async def test_a_read_sends_what_came_before_it_and_sees_it(pg: Pg) -> None:
    def write_then_read(d: Any) -> tuple[int, int, str]:
        d.execute("INSERT INTO scratch (id, v) VALUES (1, 'a'), (2, 'b')")
        changed = d.execute("UPDATE scratch SET v = 'c' WHERE id >= 1").rowcount
        d.execute("INSERT INTO scratch (id, v) VALUES (3, 'd')")
        count = d.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]
        d.execute("DELETE FROM scratch WHERE id = 3")
        last = d.execute("SELECT v FROM scratch WHERE id = 2").fetchone()[0]
        return changed, count, last

    (changed, count, last), trips = await waits_for(pg, write_then_read)
    assert (changed, count, last) == (2, 3, "c")
    assert trips <= 5  # 6 statements and a COMMIT: four waits (and maybe the BEGIN's)


async def test_a_failed_statement_fails_its_job_at_the_next_wait_and_nothing_of_it_stays(
    pg: Pg,
) -> None:
    await pg.run(lambda d: d.execute("INSERT INTO scratch (id, v) VALUES (1, 'first')"))

    def clash(d: Any) -> None:
        d.execute("INSERT INTO scratch (id, v) VALUES (2, 'kept only if all commit')")
        d.execute("INSERT INTO scratch (id, v) VALUES (1, 'duplicate')")  # not read
        d.execute("UPDATE scratch SET v = 'changed' WHERE id = 1")

    with pytest.raises(StoreError, match="duplicate key"):
        await pg.run(clash)
    rows = await pg.run(lambda d: d.execute("SELECT id, v FROM scratch ORDER BY id").fetchall())
    assert [tuple(r) for r in rows] == [(1, "first")]


async def test_a_daemon_frozen_before_its_first_send_locks_nothing(pg: Pg) -> None:
    """A job that stalls before anything of its transaction was sent holds no row: another
    daemon's write goes through at once, and the stalled one's statements run when it
    goes on (after the other's, as if it had begun then)."""
    await pg.run(lambda d: d.execute("INSERT INTO scratch (id, v) VALUES (1, 'a')"))
    other = PostgresDatabase(pg.url)
    await other.open()
    try:
        # Within FRESH_FOR of the last transaction: the BEGIN too is held back.
        stalled, go_on = threading.Event(), threading.Event()

        def stall(d: Any) -> None:
            d.execute("UPDATE scratch SET v = 'stalled' WHERE id = 1")
            stalled.set()
            go_on.wait(10)

        job = asyncio.ensure_future(pg.run(stall))
        await asyncio.to_thread(stalled.wait, 10)
        started = time.monotonic()
        async with asyncio.timeout(5):
            await other.run(lambda d: d.execute("UPDATE scratch SET v = 'other' WHERE id = 1"))
        assert time.monotonic() - started < 5
        go_on.set()
        await job
        assert (
            await other.run(lambda d: d.execute("SELECT v FROM scratch WHERE id = 1").fetchone()[0])
            == "stalled"
        )
    finally:
        await other.close()
