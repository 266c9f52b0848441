"""What a unit of work expects of the store, checked where it is cheapest
(``sql.expect_row``, ``sql.expect_change``), and results read once committed
(``sql.read_later``), on both engines: SQLite reads at once; PostgreSQL has the server
check (``echo_bot_expect``) and reads after the COMMIT, so neither waits on the network
by itself. A user would notice: the unit of work refused with the caller's own error and
nothing of it stored, another unit of work in the same batch committed all the same,
and what is read after the commit never seen for work rolled back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from echo_bot.errors import EchoBotError
from echo_bot.store import Database
from echo_bot.store.engine import ThreadedEngine
from echo_bot.store.sql import expect_change, expect_row, read_later
from tests.postgres import fresh_database

SCRATCH = "CREATE TABLE scratch (id INTEGER PRIMARY KEY, v TEXT)"


class Refused(EchoBotError):
    """The caller's own error for an expectation that does not hold."""


@contextlib.contextmanager
def _made(name: str, tmp_path: Path) -> Iterator[ThreadedEngine]:
    if name == "sqlite":
        yield Database(tmp_path / "engine.sqlite3")
        return
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        yield PostgresDatabase(url)


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ThreadedEngine]:
    with _made(request.param, tmp_path) as engine:
        await engine.open()
        try:
            await engine.run(lambda d: d.execute(SCRATCH))
            await engine.run(lambda d: d.execute("INSERT INTO scratch (id, v) VALUES (1, 'a')"))
            yield engine
        finally:
            await engine.close()


async def rows(db: ThreadedEngine) -> list[tuple[int, str]]:
    found = await db.run(lambda d: d.execute("SELECT id, v FROM scratch ORDER BY id").fetchall())
    return [(int(r[0]), str(r[1])) for r in found]


async def test_an_expected_row_that_is_there_lets_the_work_commit(db: ThreadedEngine) -> None:
    def job(d: Any) -> str:
        expect_row(d, "SELECT 1 FROM scratch WHERE id = ?", [1], Refused("no row 1"))
        d.execute("INSERT INTO scratch (id, v) VALUES (2, 'b')")
        return "done"

    assert await db.run(job) == "done"
    assert await rows(db) == [(1, "a"), (2, "b")]


async def test_an_expected_row_that_is_not_there_refuses_the_work_with_the_callers_error(
    db: ThreadedEngine,
) -> None:
    def job(d: Any) -> str:
        d.execute("INSERT INTO scratch (id, v) VALUES (2, 'b')")
        expect_row(d, "SELECT 1 FROM scratch WHERE id = ?", [7], Refused("no row 7"))
        d.execute("UPDATE scratch SET v = 'changed' WHERE id = 1")
        return "done"

    with pytest.raises(Refused, match="no row 7"):
        await db.run(job)
    assert await rows(db) == [(1, "a")]


async def test_an_expected_change_holds_only_when_exactly_one_row_changes(
    db: ThreadedEngine,
) -> None:
    def change(d: Any, where: str) -> None:
        expect_change(
            d, f"UPDATE scratch SET v = 'x' WHERE {where}", [], Refused(f"not one: {where}")
        )

    await db.run(lambda d: change(d, "id = 1"))
    assert await rows(db) == [(1, "x")]
    with pytest.raises(Refused, match="not one: id = 5"):
        await db.run(lambda d: change(d, "id = 5"))

    def insert_new(d: Any, key: int) -> None:
        expect_change(
            d,
            "INSERT INTO scratch (id, v) VALUES (?, 'new') ON CONFLICT (id) DO NOTHING",
            [key],
            Refused(f"{key} exists"),
        )

    await db.run(lambda d: insert_new(d, 2))
    with pytest.raises(Refused, match="1 exists"):
        await db.run(lambda d: insert_new(d, 1))
    assert await rows(db) == [(1, "x"), (2, "new")]


async def test_a_refused_unit_of_work_in_a_batch_leaves_the_others_committed(
    db: ThreadedEngine,
) -> None:
    def adds(key: int) -> Any:
        def job(d: Any) -> int:
            d.execute("INSERT INTO scratch (id, v) VALUES (?, 'ok')", [key])
            return key

        return job

    def refused(d: Any) -> int:
        d.execute("INSERT INTO scratch (id, v) VALUES (100, 'refused')")
        expect_row(d, "SELECT 1 FROM scratch WHERE id = -1", [], Refused("refused"))
        return 100

    jobs = [adds(k) for k in range(2, 12)]
    results = await asyncio.gather(
        *(db.run(job) for job in [*jobs[:5], refused, *jobs[5:]]), return_exceptions=True
    )
    assert isinstance(results.pop(5), Refused)
    assert results == list(range(2, 12))
    assert [key for key, _v in await rows(db)] == [1, *range(2, 12)]


async def test_what_is_read_later_is_read_once_committed_and_never_for_rolled_back_work(
    db: ThreadedEngine,
) -> None:
    seen: list[int] = []

    def job(fail: bool) -> Any:
        def run(d: Any) -> None:
            cursor = d.execute("INSERT INTO scratch (id, v) VALUES (?, 'n') RETURNING id", [9])
            read_later(d, cursor, lambda c: seen.append(int(c.fetchone()[0])))
            if fail:
                raise Refused("changed my mind")

        return run

    with pytest.raises(Refused):
        await db.run(job(fail=True))
    if db.engine == "postgres":  # held back: never sent, never read
        assert seen == []
    seen.clear()
    await db.run(job(fail=False))
    assert seen == [9]
    assert (9, "n") in await rows(db)


async def test_on_postgres_neither_costs_a_wait_of_its_own() -> None:
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        db = PostgresDatabase(url)
        await db.open()
        try:
            await db.run(lambda d: d.execute(SCRATCH))
            seen: list[int] = []

            def checked(d: Any) -> None:
                expect_row(d, "SELECT 1", [], Refused("x"))
                for key in (1, 2, 3):
                    expect_change(
                        d, "INSERT INTO scratch (id, v) VALUES (?, 'v')", [key], Refused("y")
                    )
                cursor = d.execute("SELECT COUNT(*) FROM scratch")
                read_later(d, cursor, lambda c: seen.append(int(c.fetchone()[0])))

            before = await db.run(lambda d: d.round_trips)
            await db.run(checked)
            after = await db.run(lambda d: d.round_trips)
            assert seen == [3]
            assert after - before <= 2  # the COMMIT's, and the BEGIN's after a pause
        finally:
            await db.close()
