"""The engine contract, on both engines (SQLite, and a real PostgreSQL server): results
only after COMMIT, a failing job rolled back alone with its own error, the driver's
errors as StoreError, a lost transaction failing its batch, no job stranding its
callers, and a batch run again after a failure committing and announcing each unit of
work once. What only one engine does (SQLite's loop connection and write lock) is in
tests/test_store_batch.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import pytest

from echo_bot.errors import StoreError
from echo_bot.events import MessageInbound
from echo_bot.secrets import Masker
from echo_bot.store import DB_FILENAME, ChatTimezoneChanged, Database, Store, Tx
from echo_bot.store.engine import ThreadedEngine
from echo_bot.tools.base import Risk, Tool, ToolContext, ToolGroup, ToolResult
from tests.conftest import ON_POSTGRES, echo_bot_env, run_echo_bot, running_bot
from tests.postgres import (
    admin_url,
    drop_database,
    fresh_database,
    reachable_admin_url,
    with_database,
)
from tests.waiting import eventually

Job = Callable[[Any], Any]
SCRATCH = "CREATE TABLE scratch (id INTEGER PRIMARY KEY, v TEXT)"


@dataclass
class Engine:
    """An opened engine and a second connection that sees only what was committed."""

    name: str
    db: Any
    committed: Callable[[], dict[int, str]]
    make: Callable[[], Any]  # another engine on the same store, not opened


@contextlib.contextmanager
def _sqlite(tmp_path: Path) -> Iterator[tuple[Callable[[], Any], Callable[[], dict[int, str]]]]:
    path = tmp_path / "engine.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    with contextlib.closing(conn):
        yield (
            lambda: Database(path),
            lambda: dict(conn.execute("SELECT id, v FROM scratch").fetchall()),
        )


@contextlib.contextmanager
def _postgres() -> Iterator[tuple[Callable[[], Any], Callable[[], dict[int, str]]]]:
    import psycopg

    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
        yield (
            lambda: PostgresDatabase(url),
            lambda: dict(conn.execute("SELECT id, v FROM scratch").fetchall()),
        )


@pytest.fixture(params=["sqlite", "postgres"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    with _sqlite(tmp_path) if request.param == "sqlite" else _postgres() as (make, committed):
        db = make()
        await db.open()
        try:
            await db.run(lambda d: d.execute(SCRATCH))
            yield Engine(request.param, db, committed, make)
        finally:
            await db.close()


def insert(i: int, value: str | None = None) -> Job:
    def job(d: Any) -> int:
        d.execute("INSERT INTO scratch (id, v) VALUES (?, ?)", [i, value or f"row {i}"])
        return i

    return job


async def together(db: ThreadedEngine, jobs: list[Job], *, slow: bool = False) -> list[Any]:
    """Jobs launched at once: the engine commits them in as few batches as it can."""
    return await asyncio.gather(
        *(db.run(job, slow=slow) for job in jobs),
        return_exceptions=True,
    )


@pytest.mark.parametrize("slow", [False, True])
async def test_many_concurrent_jobs_are_all_committed_sharing_transactions(
    engine: Engine, slow: bool
) -> None:
    seen_uncommitted: list[bool] = []

    def job(i: int) -> Job:
        def run(d: Any) -> int:
            insert(i)(d)
            here = d.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]
            seen_uncommitted.append(here > len(engine.committed()) + 1)
            return i

        return run

    assert await together(engine.db, [job(i) for i in range(200)], slow=slow) == list(range(200))
    assert engine.committed() == {i: f"row {i}" for i in range(200)}
    assert any(seen_uncommitted)  # the jobs did share transactions


async def test_a_job_that_raises_is_rolled_back_alone_with_its_own_error(engine: Engine) -> None:
    error = ValueError("bad input for job 25")

    def failing(d: Any) -> None:
        insert(25)(d)
        d.execute("UPDATE scratch SET v = 'clobbered'")
        raise error

    results = await together(engine.db, [failing if i == 25 else insert(i) for i in range(50)])
    assert results[25] is error
    assert results[:25] + results[26:] == [i for i in range(50) if i != 25]
    assert engine.committed() == {i: f"row {i}" for i in range(50) if i != 25}


async def test_a_driver_error_is_a_store_error_and_the_others_commit(engine: Engine) -> None:
    await engine.db.run(insert(1, "original"))

    def duplicate(d: Any) -> None:
        insert(1000)(d)  # rolled back with the failing insert
        insert(1, "duplicate")(d)

    jobs = [insert(i) for i in range(2, 40)]
    results = await together(engine.db, [*jobs[:10], duplicate, *jobs[10:]])
    failed = results.pop(10)
    assert isinstance(failed, StoreError), failed
    assert "unique" in str(failed).lower() or "duplicate" in str(failed).lower()
    assert results == list(range(2, 40))
    stored = engine.committed()
    assert stored[1] == "original" and 1000 not in stored and len(stored) == 39


async def test_a_job_that_goes_on_after_a_failed_statement_is_not_told_it_succeeded(
    engine: Engine,
) -> None:
    await engine.db.run(insert(1))

    def swallows(d: Any) -> str:
        d.execute("INSERT INTO scratch (id, v) VALUES (5, 'before')")
        with contextlib.suppress(Exception):
            if engine.name == "sqlite":  # OR ROLLBACK: SQLite ends the whole transaction
                d.execute("INSERT OR ROLLBACK INTO scratch (id, v) VALUES (1, 'clash')")
            else:  # PostgreSQL refuses every statement after a failed one
                d.execute("INSERT INTO scratch (id, v) VALUES (1, 'clash')")
        return "ok"

    results = await together(engine.db, [insert(2), swallows, insert(3)])
    assert isinstance(results[1], StoreError)
    assert 5 not in engine.committed()
    if engine.name == "postgres":  # rolled back alone: the others committed
        assert results[0] == 2 and results[2] == 3
    assert await engine.db.run(insert(6)) == 6  # and the store goes on


async def test_a_result_arrives_only_once_its_row_is_committed(engine: Engine) -> None:
    async def write_then_look(i: int) -> str | None:
        await engine.db.run(insert(i))
        return engine.committed().get(i)

    seen = await asyncio.gather(*(write_then_look(i) for i in range(30)))
    assert seen == [f"row {i}" for i in range(30)]


class Interrupt(BaseException):
    """Not an Exception: what a job could raise that is not an error (say, SystemExit)."""


async def test_a_job_raising_a_base_exception_leaves_the_store_usable(engine: Engine) -> None:
    def interrupted(d: Any) -> None:
        d.execute("INSERT INTO scratch (id, v) VALUES (1, 'interrupted')")
        raise Interrupt()

    db = engine.db
    outcomes = await asyncio.gather(
        db.run(insert(2)), db.run(interrupted), db.run(insert(3)), return_exceptions=True
    )
    assert isinstance(outcomes[1], Interrupt)
    stored = engine.committed()
    assert 1 not in stored
    for i, outcome in ((2, outcomes[0]), (3, outcomes[2])):
        assert (i in stored) == (outcome == i)
        if outcome != i:
            assert isinstance(outcome, StoreError) and "rolled back" in str(outcome)
    assert await db.run(insert(4)) == 4
    assert engine.committed()[4] == "row 4"


async def test_a_job_raising_stop_iteration_does_not_strand_the_others(engine: Engine) -> None:
    def runs_dry(d: Any) -> None:
        next(iter(d.execute("SELECT id FROM scratch WHERE id = -1").fetchall()))

    async with asyncio.timeout(10):
        outcomes = await together(engine.db, [insert(1), runs_dry, insert(2)])
    assert outcomes[0] == 1 and outcomes[2] == 2
    assert isinstance(outcomes[1], RuntimeError) and "StopIteration" in str(outcomes[1])
    assert engine.committed() == {1: "row 1", 2: "row 2"}


async def test_each_job_gets_its_own_result(engine: Engine) -> None:
    def job(i: int) -> Job:
        return lambda d: (i, d.execute("SELECT id * id FROM scratch WHERE id = ?", [i]).fetchone())

    await together(engine.db, [insert(i) for i in range(100)])
    results = await together(engine.db, [job(i) for i in range(100)])
    assert [(i, row[0]) for i, row in results] == [(i, i * i) for i in range(100)]


async def test_run_after_close_is_refused(engine: Engine) -> None:
    db = engine.make()
    await asyncio.to_thread(db.open_sync)  # beside the daemon's engine (PostgreSQL: one)
    assert await db.run(lambda d: d.execute("SELECT COUNT(*) FROM scratch").fetchone()[0]) == 0
    await db.close()
    with pytest.raises(StoreError, match="closed"):
        await db.run(lambda d: d.execute("SELECT 1").fetchone()[0])
    await db.close()  # closing twice is harmless


async def test_run_sync_from_plain_threads_without_an_event_loop(engine: Engine) -> None:
    def in_threads() -> dict[int, list[int]]:
        db = engine.make()
        db.open_sync()
        try:
            results: dict[int, list[int]] = {}

            def worker(n: int) -> None:
                results[n] = [db.run_sync(insert(n * 100 + k)) for k in range(20)]

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            # The driver's own errors come back as they are (management commands).
            with pytest.raises(Exception, match=r"(?i)unique|duplicate") as caught:
                db.run_sync(insert(0))
            assert not isinstance(caught.value, StoreError)
            with pytest.raises(ValueError, match="nope"):
                db.run_sync(lambda d: (insert(5000)(d), int("nope")))
            return results
        finally:
            db.close_sync()

    results = await asyncio.to_thread(in_threads)
    assert results == {n: [n * 100 + k for k in range(20)] for n in range(8)}
    assert len(engine.committed()) == 160 and max(engine.committed()) == 719


async def test_run_sync_is_refused_on_the_event_loop_thread(engine: Engine) -> None:
    with pytest.raises(StoreError, match="event loop"):
        engine.db.run_sync(lambda d: 1)


@pytest.mark.parametrize("slow", [False, True])
async def test_a_batch_run_again_after_a_failure_commits_and_announces_each_unit_once(
    engine: Engine, slow: bool
) -> None:
    """A unit of work runs twice when another in its batch fails (the first run rolled
    back): what it committed is announced once, its ``on_commit`` called once."""
    store = Store(engine.db, Masker())  # opened (and closed) by the fixture
    announced: list[str] = []
    store.subscribe(ChatTimezoneChanged, lambda event: announced.append(event.session_key))
    kept: list[int] = []

    def unit(i: int) -> Callable[[Tx], int]:
        def fn(tx: Tx) -> int:
            tx.reminders.set_chat_timezone(f"cli:{i}", "Asia/Tokyo")
            tx.on_commit(lambda: kept.append(i))
            if i == 5:
                raise ValueError("unit 5 fails after its write")
            return i

        return fn

    results = await asyncio.gather(
        *(store.run(unit(i), slow=slow) for i in range(10)), return_exceptions=True
    )
    assert str(results.pop(5)) == "unit 5 fails after its write"
    assert results == [i for i in range(10) if i != 5]
    assert sorted(kept) == [i for i in range(10) if i != 5]
    assert sorted(announced) == sorted(f"cli:{i}" for i in range(10) if i != 5)
    zones = await store.run(lambda tx: [tx.reminders.chat_timezone(f"cli:{i}") for i in range(10)])
    assert zones == ["Asia/Tokyo"] * 5 + [None] + ["Asia/Tokyo"] * 4


async def test_a_daemon_on_either_engine_answers_and_keeps_its_turns(
    state_dir: Path, on_both_engines: str
) -> None:
    """``[storage] engine = "postgres"`` puts every turn in the database (no SQLite file
    in the state dir); a restart finds the history there."""
    async with running_bot(state_dir) as bot:
        assert bot.db.engine == on_both_engines
        first = await bot.channel.say('/tool current_time {"timezone": "UTC"}')
        assert "UTC" in (await bot.channel.reply_to(first)).text
    async with running_bot(state_dir) as bot:
        stored = await bot.db.run(
            lambda d: d.execute("SELECT status FROM inbox WHERE id = ?", [first]).fetchone()[0]
        )
        assert stored == "done"
    assert (state_dir / DB_FILENAME).exists() == (on_both_engines == "sqlite")


def _refused_url(case: str) -> str:
    """A URL the test server refuses for good, made from its own URL (whatever host,
    port and role it has); skipped, saying why, where that server does not answer."""
    admin = reachable_admin_url()
    if case == "wrong-password":
        parts = urlsplit(admin)
        user = parts.username or "echo_bot_test"
        where = parts.hostname or "127.0.0.1"
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{user}:wrong@{where}{port}"))
    return with_database(admin, f"no_such_db_{secrets.token_hex(4)}")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (None, "ECHO_BOT_DATABASE_URL is not set"),
        ("notaurl", "postgresql://user:password@host"),
        # Refused for good (a closed port instead makes the daemon wait: see
        # test_a_daemon_started_while_its_database_is_away_waits_degraded_then_runs).
        ("wrong-password", "password authentication"),
        ("no-such-db", "does not exist"),
    ],
)
def test_a_bad_database_url_is_one_clear_line_and_exit_2(
    tmp_path: Path, url: str | None, expected: str
) -> None:
    if url in ("wrong-password", "no-such-db"):
        url = _refused_url(url)
    config = tmp_path / "echo-bot.toml"
    config.write_text('[storage]\nengine = "postgres"\n')
    env = echo_bot_env(**({"ECHO_BOT_DATABASE_URL": url} if url else {}))
    if url is None:
        env.pop("ECHO_BOT_DATABASE_URL", None)
    done = run_echo_bot(
        "run", "--config", str(config), "--state-dir", str(tmp_path / "state"), env=env
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "wrong" not in done.stderr  # the password is never shown


class Nap(Tool):
    """A read tool that takes its time (long enough to take the database away)."""

    name: ClassVar[str] = "nap"
    description: ClassVar[str] = "Sleep a little, then say so."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"seconds": {"type": "number"}},
        "required": ["seconds"],
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "basic"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(args["seconds"])
        return ToolResult.success("napped")


async def test_a_turn_pauses_while_its_database_is_away_and_finishes_once_it_is_back(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's role may not log in for a while and its connection is cut in the
    middle of a turn: the turn waits (no failure, no "something went wrong") and is
    answered once, after the database is back; the next message just works."""
    import psycopg

    caplog.set_level(logging.WARNING, logger="echo_bot")
    role, password = f"echo_bot_away_{secrets.token_hex(3)}", secrets.token_hex(8)
    with fresh_database() as url, psycopg.connect(admin_url(), autocommit=True) as admin:
        parts = urlsplit(url)
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        try:
            admin.execute(f"GRANT {role} TO CURRENT_USER")
            admin.execute(f'ALTER DATABASE "{parts.path[1:]}" OWNER TO {role}')
            netloc = f"{role}:{password}@{parts.hostname}:{parts.port or 5432}"
            token = ON_POSTGRES.set(urlunsplit(parts._replace(netloc=netloc)))
            try:
                async with running_bot(state_dir, tools=[Nap()]) as bot:
                    turn = await bot.channel.say('/tool nap {"seconds": 0.5}')
                    admin.execute(f"ALTER ROLE {role} NOLOGIN")
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                        [role],
                    )

                    # The turn cannot go on (nor its session be taken): it says it waits.
                    def paused() -> bool:
                        return any(
                            "paused" in (said := r.getMessage())
                            and (turn in said or "session cli:local" in said)
                            for r in caplog.records
                            if r.name == "echo_bot.agent.dispatcher"
                        )

                    await eventually(paused, 30, "the turn paused")
                    assert not [m for m in bot.channel.sent if m.kind == "reply"]
                    admin.execute(f"ALTER ROLE {role} LOGIN")
                    reply = await bot.channel.reply_to(turn, timeout=30)
                    assert reply.text.endswith("napped")
                    later = await bot.channel.say('/tool current_time {"timezone": "UTC"}')
                    assert "UTC" in (await bot.channel.reply_to(later)).text
                    replies = [m for m in bot.channel.sent if m.kind == "reply"]
                    assert len(replies) == 2 and "went wrong" not in str(replies)
            finally:
                ON_POSTGRES.reset(token)
        finally:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [role],
            )
            drop_database(admin_url(), parts.path[1:])  # again while autovacuum is on it
            admin.execute(f"DROP ROLE IF EXISTS {role}")


@contextlib.asynccontextmanager
async def a_writer_heard() -> AsyncIterator[tuple[Store, asyncio.Queue[str]]]:
    """Two stores on one fresh PostgreSQL database: one to write with, and the wakes the
    other hears (once it listens)."""
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        writer, listener = (
            Store(PostgresDatabase(url), Masker()),
            Store(PostgresDatabase(url), Masker()),
        )
        await writer.open()
        await listener.open()
        heard: asyncio.Queue[str] = asyncio.Queue()
        listener.on_wake(heard.put_nowait)
        try:
            async with asyncio.timeout(10):
                assert await heard.get() == "*"  # listening now
            yield writer, heard
        finally:
            await writer.close()
            await listener.close()


def a_message(chat: str) -> MessageInbound:
    from echo_bot.events import Address, Sender, new_id

    return MessageInbound(
        address=Address(channel="cli", chat_id=chat),
        sender=Sender(id="owner"),
        text="hello",
        external_id=new_id(),
    )


async def test_work_committed_by_one_daemon_wakes_the_others_and_a_rollback_does_not() -> None:
    """LISTEN/NOTIFY: what a unit of work announces (inbound, outbound, reminders) reaches
    every store listening on the same database once committed — never when rolled back."""
    async with a_writer_heard() as (writer, heard):
        message = a_message("a")

        def add_then_fail(tx: Tx) -> None:
            tx.inbox.add(message)
            raise ValueError("rolled back")

        with pytest.raises(ValueError):
            await writer.run(add_then_fail)
        await writer.run(lambda tx: tx.reminders.set_chat_timezone("cli:a", "UTC"))
        async with asyncio.timeout(10):
            assert await heard.get() == "timezone"  # the rolled-back inbound: nothing
        await writer.run(lambda tx: tx.inbox.add(message))
        async with asyncio.timeout(10):
            assert await heard.get() == "inbound"
        assert heard.empty()


async def test_a_daemons_own_commits_do_not_wake_it_but_it_hears_them_at_once() -> None:
    """What a store commits it announces to its own parts at the commit: its NOTIFY wakes
    the other daemons only (one read fewer per commit for each of its woken parts)."""
    from echo_bot.store import InboundCommitted
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        own, other = Store(PostgresDatabase(url), Masker()), Store(PostgresDatabase(url), Masker())
        await own.open()
        await other.open()
        woken: asyncio.Queue[str] = asyncio.Queue()
        announced: list[InboundCommitted] = []
        own.on_wake(woken.put_nowait)
        own.subscribe(InboundCommitted, announced.append)
        try:
            async with asyncio.timeout(10):
                assert await woken.get() == "*"  # listening now

            mine = a_message("a")
            await own.run(lambda tx: tx.inbox.add(mine))
            assert [m.id for event in announced for m in event.messages] == [mine.id]
            await other.run(lambda tx: tx.inbox.add(a_message("b")))
            async with asyncio.timeout(10):
                assert await woken.get() == "inbound"  # the other daemon's, not its own
            await asyncio.sleep(0.5)
            assert woken.empty()
        finally:
            await own.close()
            await other.close()


async def test_a_chat_time_zone_set_through_one_daemon_is_used_by_the_others(
    tmp_path: Path,
) -> None:
    """Each daemon keeps chats' zones in memory; one set through another daemon on the
    same database reaches it by NOTIFY, not only at its next start."""
    from echo_bot.events import Address

    chat = Address(channel="cli", chat_id="x")
    with fresh_database() as url:
        token = ON_POSTGRES.set(url)
        try:
            (tmp_path / "a").mkdir()
            (tmp_path / "b").mkdir()
            async with running_bot(tmp_path / "a") as a, running_bot(tmp_path / "b") as b:
                zones_b = b.daemon.runtime.reminders
                assert await zones_b.timezone_for(chat) == "UTC"  # read, and kept
                outcome = await a.daemon.runtime.reminders.set_timezone(chat, "Asia/Tokyo")
                assert outcome.ok
                async with asyncio.timeout(10):
                    while await zones_b.timezone_for(chat) != "Asia/Tokyo":
                        await asyncio.sleep(0.05)
        finally:
            ON_POSTGRES.reset(token)


async def test_a_deadlock_between_two_daemons_is_store_unavailable_and_the_other_commits() -> None:
    """Two daemons' transactions in each other's way: PostgreSQL rolls one back; that job
    fails with StoreUnavailable (the dispatcher tries a turn again from its checkpoint)
    and the other commits."""
    from echo_bot.errors import StoreUnavailable
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        a, b = PostgresDatabase(url), PostgresDatabase(url)
        await a.open()
        await b.open()
        try:
            await a.run(lambda d: d.execute(SCRATCH))
            await a.run(
                lambda d: d.execute("INSERT INTO scratch (id, v) VALUES (1, 'a'), (2, 'b')")
            )
            both = threading.Barrier(2)

            def crossing(first: int, second: int) -> Job:
                def run(d: Any) -> int:
                    # Read: a statement is sent (and its row locked) no later than that.
                    assert d.execute("UPDATE scratch SET v = 'x' WHERE id = ?", [first]).rowcount
                    both.wait(10)  # each holds its first row now
                    d.execute("UPDATE scratch SET v = 'y' WHERE id = ?", [second])
                    return first

                return run

            results = await asyncio.gather(
                a.run(crossing(1, 2)), b.run(crossing(2, 1)), return_exceptions=True
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            assert len(failed) == 1 and isinstance(failed[0], StoreUnavailable), results
            assert "deadlock" in str(failed[0]).lower()
            assert await a.run(lambda d: d.execute("SELECT 1").fetchone()[0]) == 1
            assert await b.run(lambda d: d.execute("SELECT 1").fetchone()[0]) == 1
        finally:
            await a.close()
            await b.close()


async def test_a_connection_to_a_server_that_refuses_writes_is_given_up_for_a_new_one() -> None:
    """After a failover, a multi-host URL or a DNS name may still reach the old primary,
    now a standby: every write is refused (25006) on a connection that is not broken.
    That is the store away (the caller tries again, /healthz says so), and the next
    batch connects again, where writes go through; before, the daemon kept the
    connection and failed every write until it was restarted."""
    from echo_bot.errors import StoreUnavailable
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        db = PostgresDatabase(url)
        await db.open()
        try:
            await db.run(lambda d: d.execute(SCRATCH))
            # As a standby answers: this session's transactions are read-only.
            await db.run(
                lambda d: d.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            )
            with pytest.raises(StoreUnavailable, match="read-only"):
                await db.run(insert(1))
            assert db.health()["status"] != "ok"
            assert await db.run(insert(2)) == 2  # on a new connection
            assert await db.run(lambda d: d.execute("SELECT id FROM scratch").fetchall()) == [(2,)]
            assert db.health()["status"] == "ok"
        finally:
            await db.close()


async def test_a_stored_reader_position_only_moves_forward(engine: Engine) -> None:
    """The Telegram poller's offset: a poller that lost its lease late may still write
    the one it had; it never moves the position back."""
    store = Store(engine.make(), Masker())
    await store.open()
    try:
        assert await store.run(lambda tx: tx.meta.position("poller")) is None

        def position_to(v: int) -> Callable[[Tx], None]:
            return lambda tx: tx.meta.set_position("poller", v)

        for value in (5, 3, 9, 9, 7):
            await store.run(position_to(value))
        stored = await store.run(lambda tx: tx.meta.position("poller"))
        assert stored is not None and stored[0] == 9
    finally:
        await store.close()


async def test_a_note_kept_only_if_none_is_keeps_the_first_and_a_plain_one_replaces(
    engine: Engine,
) -> None:
    """A secret each daemon would make for itself (``replace=False``): the first written
    stays; a note written plainly (a sync token) replaces what was there."""
    store = Store(engine.make(), Masker())
    await store.open()
    try:

        def keep(value: str, replace: bool) -> Callable[[Tx], None]:
            return lambda tx: tx.meta.set_note("key", value, replace=replace)

        for value, replace in (("first", False), ("second", False)):
            await store.run(keep(value, replace))
        assert (await store.run(lambda tx: tx.meta.note("key")) or ("",))[0] == "first"
        await store.run(keep("third", True))
        assert (await store.run(lambda tx: tx.meta.note("key")) or ("",))[0] == "third"
    finally:
        await store.close()


async def test_a_transaction_left_idle_by_a_frozen_daemon_frees_its_rows() -> None:
    """A daemon frozen mid-transaction (a paused VM) must not hold its row locks for
    good: the server ends a transaction of ours idle longer than a few seconds, the
    daemon waiting on its rows goes on, and the frozen one's work fails as
    StoreUnavailable (tried again from its checkpoint once it runs)."""
    import time

    from echo_bot.errors import StoreUnavailable
    from echo_bot.store.postgres import IDLE_IN_TRANSACTION, PostgresDatabase

    with fresh_database() as url:
        frozen, other = PostgresDatabase(url), PostgresDatabase(url)
        await frozen.open()
        await other.open()
        try:
            await other.run(lambda d: d.execute(SCRATCH))
            await other.run(lambda d: d.execute("INSERT INTO scratch (id, v) VALUES (1, 'a')"))
            locked = threading.Event()

            def freeze(d: Any) -> None:
                # Read: a statement is sent (and its row locked) no later than that.
                assert d.execute("UPDATE scratch SET v = 'frozen' WHERE id = 1").rowcount == 1
                locked.set()
                time.sleep(int(IDLE_IN_TRANSACTION.removesuffix("s")) + 3)
                d.execute("SELECT 1")

            stuck = asyncio.ensure_future(frozen.run(freeze))
            await asyncio.to_thread(locked.wait, 10)
            async with asyncio.timeout(20):
                await other.run(lambda d: d.execute("UPDATE scratch SET v = 'b' WHERE id = 1"))
            with pytest.raises(StoreUnavailable):
                await stuck
            assert (
                await other.run(
                    lambda d: d.execute("SELECT v FROM scratch WHERE id = 1").fetchone()[0]
                )
                == "b"
            )
            assert await frozen.run(lambda d: d.execute("SELECT 1").fetchone()[0]) == 1
        finally:
            await frozen.close()
            await other.close()


@pytest.mark.parametrize("engine_name", ["sqlite", "postgres"])
async def test_a_store_of_a_newer_schema_is_refused_with_one_line_and_exit_2(
    tmp_path: Path, engine_name: str
) -> None:
    """An instance older than the store (another machine upgraded first) does not start
    on it: one line saying so, exit code 2 (systemd does not restart it in a loop)."""
    from echo_bot.store.postgres import PostgresDatabase

    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "echo-bot.toml"
    config.write_text(f'[storage]\nengine = "{engine_name}"\n')
    with contextlib.ExitStack() as stack:
        env = echo_bot_env()
        if engine_name == "postgres":
            env["ECHO_BOT_DATABASE_URL"] = url = stack.enter_context(fresh_database())
            db: Any = PostgresDatabase(url)
        else:
            db = Database(state / DB_FILENAME)
        await db.open()  # made and migrated by this echo-bot
        try:
            await db.run(
                lambda d: d.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
            )
        finally:
            await db.close()
        args = ("run", "--config", str(config), "--state-dir", str(state))
        done = await asyncio.to_thread(run_echo_bot, *args, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "schema version 999, newer than this echo-bot" in lines[0], lines


async def test_a_batch_of_jobs_wakes_the_others_once_for_all_it_committed() -> None:
    """Jobs committed in one transaction (a batch) send one NOTIFY with every kind they
    announced, not one each: the other daemons wake once, for all of it."""
    async with a_writer_heard() as (writer, heard):
        # The store thread held by one job while three more queue behind it: they run
        # as one batch, in one transaction.
        busy, go_on = threading.Event(), threading.Event()

        def hold(_tx: Tx) -> None:
            busy.set()
            go_on.wait(10)

        held = asyncio.ensure_future(writer.run(hold))
        await asyncio.to_thread(busy.wait, 10)
        batch = [
            asyncio.ensure_future(writer.run(lambda tx: tx.inbox.add(a_message("a")))),
            asyncio.ensure_future(writer.run(lambda tx: tx.inbox.add(a_message("b")))),
            asyncio.ensure_future(
                writer.run(lambda tx: tx.reminders.set_chat_timezone("cli:a", "UTC"))
            ),
        ]
        await asyncio.sleep(0.2)
        go_on.set()
        await held
        await asyncio.gather(*batch)
        async with asyncio.timeout(10):
            assert await heard.get() == "inbound,timezone"
        await asyncio.sleep(0.5)
        assert heard.empty()
