"""The inbox on the store: concurrent adds each keep their own outcome (the engine
group-commits them), dedup holds across them, and each row knows which process wrote it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from sqlite_utils import Database as SqlDb

from echo_bot.bus import Published
from echo_bot.errors import StoreError
from echo_bot.events import Address, InboundMessage, MessageInbound, Sender
from echo_bot.secrets import Masker
from echo_bot.store import BusQueues, Database, InboundCommitted, Store, Tx
from echo_bot.store.inbox import DEDUP_WINDOW, dedupe_window


def message(external_id: str | None, channel: str = "webhook", **extra: object) -> InboundMessage:
    return MessageInbound(
        address=Address(channel=channel, chat_id="route"),
        sender=Sender(id="s"),
        text="hello",
        external_id=external_id,
        **extra,
    )


@pytest.fixture
async def db(tmp_path: Path):  # type: ignore[no-untyped-def]
    database = Database(tmp_path / "inbox.sqlite3")
    await database.open()
    yield database
    await database.close()


def daemon_inbox(db: Database) -> BusQueues:
    return BusQueues(Store(db, Masker(), instance="host-1"))


def adding(m: InboundMessage) -> Callable[[SqlDb], Published]:
    """Work for ``db.run`` that adds ``m`` (bound now, not when the work runs)."""
    return lambda d: Tx(d, Masker()).inbox.add(m)


def count(db: SqlDb) -> int:
    return cast(int, db.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])


async def test_concurrent_adds_each_get_their_own_outcome(db: Database) -> None:
    inbox = daemon_inbox(db)
    messages = [message(f"k{i}") for i in range(50)]
    results = await asyncio.gather(*(inbox.add(m) for m in messages))
    assert results == [Published(m.id, False) for m in messages]
    assert await db.run(count) == 50


async def test_two_equal_keys_in_one_batch_the_second_is_a_duplicate(db: Database) -> None:
    inbox = daemon_inbox(db)
    first, second, other = message("same"), message("same"), message("other")
    results = await asyncio.gather(inbox.add(first), inbox.add(second), inbox.add(other))
    assert cast(list[Published], results) == [
        Published(first.id, False),
        Published(first.id, True),
        Published(other.id, False),
    ]
    # The same key on another channel is another delivery.
    elsewhere = message("same", channel="telegram")
    assert await inbox.add(elsewhere) == Published(elsewhere.id, False)
    assert await db.run(count) == 3


async def test_a_key_already_stored_is_a_duplicate_in_a_batch(db: Database) -> None:
    inbox = daemon_inbox(db)
    stored = message("seen")
    await inbox.add(stored)
    again, new = message("seen"), message("new")
    results = await asyncio.gather(inbox.add(new), inbox.add(again))
    assert cast(list[Published], results) == [Published(new.id, False), Published(stored.id, True)]
    # The same message (same id, no key) added twice is one row.
    keyless = message(None)
    assert cast(list[Published], await asyncio.gather(inbox.add(keyless), inbox.add(keyless))) == [
        Published(keyless.id, False),
        Published(keyless.id, True),
    ]


async def test_the_dedup_window_holds_in_a_batch(db: Database) -> None:
    """A key older than its channel's window is new again; inside it, a duplicate."""
    inbox = daemon_inbox(db)
    old_webhook = message("w")
    old_telegram = message("t", channel="telegram")
    await inbox.add(old_webhook)
    await inbox.add(old_telegram)
    # 4 days ago: beyond Telegram's window, within the webhook one.
    past = time.time() - 4 * 86400
    assert dedupe_window("telegram") < 4 * 86400 < DEDUP_WINDOW == dedupe_window("webhook")
    await db.run(lambda d: d.execute("UPDATE inbox SET received_at = ?", [past]))
    webhook_again, telegram_again = message("w"), message("t", channel="telegram")
    telegram_twice = message("t", channel="telegram")
    results = await asyncio.gather(
        inbox.add(webhook_again), inbox.add(telegram_again), inbox.add(telegram_twice)
    )
    assert cast(list[Published], results) == [
        Published(old_webhook.id, True),
        Published(telegram_again.id, False),
        Published(telegram_again.id, True),
    ]


async def test_a_group_commit_and_one_by_one_agree(db: Database) -> None:
    """Adds the engine commits together give exactly what ``tx.inbox.add`` gives, message
    after message, each in its own transaction."""
    import sqlite3

    from echo_bot.store.schema import migrate

    one = SqlDb(sqlite3.connect(":memory:"))
    migrate(one)
    one_by_one = Tx(one, Masker()).inbox
    inbox = daemon_inbox(db)
    old = datetime.now(UTC) - timedelta(seconds=DEDUP_WINDOW + 60)
    seed = [message("a"), message("b", received_at=old), message("c", channel="telegram")]
    batch = [
        message("a"),
        message("b"),
        message("b"),
        message("d"),
        message("d"),
        message(None),
        seed[2],
        message("c"),
    ]
    for m in seed:
        one_by_one.add(m)
        await inbox.add(m)
    expected = [one_by_one.add(m) for m in batch]
    assert await asyncio.gather(*(inbox.add(m) for m in batch)) == expected
    rows = "SELECT id, channel, external_id, received_at FROM inbox ORDER BY seq"
    stored = await db.run(lambda d: [tuple(r) for r in d.execute(rows).fetchall()])
    assert stored == one.execute(rows).fetchall()
    # The fast path (nothing stored, nothing repeated) stores the same rows too.
    fast = [message(f"n{i}") for i in range(5)] + [message(None)]
    assert await asyncio.gather(*(inbox.add(m) for m in fast)) == [
        Published(m.id, False) for m in fast
    ]
    new = sum(not p.duplicate for p in expected)
    assert new == 4  # b (its old row retired), d, the keyless one, c on another channel
    assert await db.run(count) == len(seed) + new + 6


async def test_a_failing_commit_fails_every_add_of_the_batch(db: Database) -> None:
    inbox = daemon_inbox(db)
    real = db.run

    async def broken(fn, **options):  # type: ignore[no-untyped-def]
        raise StoreError("disk full")

    db.run = broken  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(inbox.add(message(f"x{i}")) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, StoreError) for r in results)
    db.run = real  # type: ignore[method-assign]
    assert await db.run(count) == 0
    # The store is back: the same deliveries, retried, are new (nothing half-stored).
    retried = message("x0")
    assert await inbox.add(retried) == Published(retried.id, False)


async def test_a_message_that_cannot_be_stored_fails_alone(db: Database) -> None:
    inbox = daemon_inbox(db)
    good = [message(f"g{i}") for i in range(3)]
    bad = message("\ud800")  # a lone surrogate: SQLite cannot encode it
    results = await asyncio.gather(
        inbox.add(good[0]), inbox.add(bad), inbox.add(good[1]), inbox.add(good[2]),
        return_exceptions=True,
    )  # fmt: skip
    assert isinstance(results[1], Exception)
    assert [results[0], results[2], results[3]] == [Published(m.id, False) for m in good]
    assert await db.run(count) == 3


async def test_the_poll_reads_only_what_other_processes_wrote(db: Database) -> None:
    """The daemon's own inbound reach its dispatcher by InboundCommitted; its poll reads
    the rows of management commands (NULL) and of other instances only. Recovery reads
    every unfinished row, whoever wrote it."""
    told: list[str] = []
    store = Store(db, Masker(), instance="host-1")
    store.subscribe(InboundCommitted, lambda e: told.extend(m.id for m in e.messages))
    inbox = BusQueues(store)
    own = message("own")
    await inbox.add(own)
    admin = message("admin", channel="admin")
    await db.run(lambda d: Tx(d, Masker()).inbox.add(admin))  # what `echo-bot approvals` does
    other = message("other")
    await BusQueues(Store(db, Masker(), instance="host-2")).add(other)
    assert told == [own.id]
    found, last, more = await store.run(lambda tx: tx.inbox.accepted_from_others(0, 500))
    assert [m.id for m in found] == [admin.id, other.id] and not more
    again = await store.run(lambda tx: tx.inbox.accepted_from_others(last, 500))
    assert again == ([], last, False)
    unfinished, newest = await store.run(lambda tx: tx.inbox.unfinished())
    assert [m.id for m in unfinished] == [own.id, admin.id, other.id] and newest == last


async def test_a_page_of_the_poll_ends_at_its_last_row(db: Database) -> None:
    store = Store(db, Masker(), instance="host-1")
    rows = [message(f"p{i}") for i in range(5)]
    for m in rows:
        await db.run(adding(m))
    first, last, more = await store.run(lambda tx: tx.inbox.accepted_from_others(0, 3))
    assert [m.id for m in first] == [m.id for m in rows[:3]] and more
    rest, _last, more = await store.run(lambda tx: tx.inbox.accepted_from_others(last, 3))
    assert [m.id for m in rest] == [m.id for m in rows[3:]] and not more


async def test_a_publisher_that_gives_up_before_the_commit_leaves_nothing_behind(
    db: Database,
) -> None:
    """Cancelled before its flush: not stored, not announced (and not acknowledged)."""
    told: list[str] = []
    store = Store(db, Masker(), instance="host-1")
    store.subscribe(InboundCommitted, lambda e: told.extend(m.id for m in e.messages))
    publish = asyncio.ensure_future(BusQueues(store).add(message("cancelled")))
    await asyncio.sleep(0)  # listed for the next flush
    publish.cancel()
    with pytest.raises(asyncio.CancelledError):
        await publish
    await store.run(lambda tx: None)
    assert await db.run(count) == 0
    assert told == []


async def test_work_committed_after_its_caller_gave_up_is_still_announced(
    db: Database,
) -> None:
    """A job already running when its caller is cancelled (here a slow one on the store
    thread) is committed all the same; what it committed must still be announced, or the
    message would wait for the next restart (the poll never reads this process's rows)."""
    told: list[str] = []
    store = Store(db, Masker(), instance="host-1")
    store.subscribe(InboundCommitted, lambda e: told.extend(m.id for m in e.messages))
    given_up = message("cancelled")
    running = threading.Event()

    def add_then_dawdle(tx: Tx) -> None:
        tx.inbox.add(given_up)
        running.set()
        time.sleep(0.3)  # the caller gives up meanwhile

    publish = asyncio.ensure_future(store.run(add_then_dawdle, slow=True))
    async with asyncio.timeout(10):
        while not running.is_set():
            await asyncio.sleep(0.01)
    publish.cancel()
    with pytest.raises(asyncio.CancelledError):
        await publish
    async with asyncio.timeout(10):
        while not told:
            await asyncio.sleep(0.01)
    assert await db.run(count) == 1
    assert told == [given_up.id]


def test_one_insert_decides_and_a_conflict_looks_at_the_window() -> None:
    """tx.inbox.add through its SQL: a new key is one INSERT; a key stored within its
    window is a duplicate of that row; past the window the old row keeps its row under a
    retired key and the delivery is new; the same message (same id) is never stored twice,
    whatever the window."""
    import sqlite3

    from echo_bot.store.schema import migrate

    db = SqlDb(sqlite3.connect(":memory:"))
    migrate(db)
    inbox = Tx(db, Masker()).inbox
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    first = message("k")
    assert inbox.add(first) == Published(first.id, False)
    work = [s for s in statements if not s.startswith("BEGIN")]  # the driver's own
    assert len(work) == 1 and work[0].startswith("INSERT")
    again = message("k")
    assert inbox.add(again) == Published(first.id, True)  # within the window
    db.conn.set_trace_callback(None)
    past = time.time() - DEDUP_WINDOW - 60
    db.execute("UPDATE inbox SET received_at = ? WHERE id = ?", [past, first.id])
    later = message("k")
    assert inbox.add(later) == Published(later.id, False)  # past the window: new
    rows = db.execute("SELECT id, external_id FROM inbox ORDER BY seq").fetchall()
    assert rows[0][0] == first.id and rows[0][1].startswith("k#")
    assert rows[1] == (later.id, "k")
    assert inbox.add(message("k")) == Published(later.id, True)
    # The first message itself, added again long after its window: still one row.
    assert inbox.add(first).duplicate
    assert db.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 2
    # A keyless message added twice: the second is a duplicate by its id.
    keyless = message(None)
    assert inbox.add(keyless) == Published(keyless.id, False)
    assert inbox.add(keyless) == Published(keyless.id, True)
