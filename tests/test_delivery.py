"""The outbox worker on a real SQLite store: per-chat order, retries, failures, edits."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from echo_bot import delivery
from echo_bot.delivery import DeliveryWorker
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundMessage, Receipt
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store, Tx
from echo_bot.store import db as store_db
from tests.conftest import running_bot
from tests.fakes.channel import RecordingChannel
from tests.waiting import eventually

WAIT = 10.0  # an upper bound for "eventually", never a speed requirement


class Clock:
    """Real time plus a jump a test can add (so a backoff of seconds passes at once)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class Harness:
    db: Database
    store: Store
    worker: DeliveryWorker
    clock: Clock

    async def send(self, to: Address, text: str, **fields: object) -> OutboundMessage:
        message = OutboundMessage(to=to, text=text, **fields)
        await self.store.run(lambda tx: tx.outbox.add(message))  # the commit wakes the worker
        return message

    async def row(self, outbound_id: str) -> tuple[str, str | None, int]:
        stored = await self.store.run(lambda tx: tx.outbox.deliveries())
        [found] = [d for d in stored if d.id == outbound_id]
        return found.status, found.last_error, found.attempts

    async def wait_attempts(self, outbound_id: str, n: int) -> tuple[str, str | None, int]:
        async def attempted() -> tuple[str, str | None, int] | None:
            row = await self.row(outbound_id)
            return row if row[2] >= n else None

        return await eventually(attempted, WAIT, f"{outbound_id} tried {n} times")

    async def wait_status(self, outbound_id: str, status: str) -> tuple[str, str | None, int]:
        async def reached() -> tuple[str, str | None, int] | None:
            row = await self.row(outbound_id)
            return row if row[0] == status else None

        return await eventually(reached, WAIT, f"{outbound_id} {status}")


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    clock = Clock()
    worker = DeliveryWorker(store=store, clock=clock, max_attempts=3)
    await worker.start()
    try:
        yield Harness(db=db, store=store, worker=worker, clock=clock)
    finally:
        await worker.stop()
        await db.close()


async def wait_sent(channel: RecordingChannel, count: int) -> list[OutboundMessage]:
    await eventually(lambda: len(channel.sent) >= count, WAIT, f"{count} messages sent")
    return channel.sent


def adding(message: OutboundMessage) -> Callable[[Tx], None]:
    """Store work that queues ``message`` (bound now, not when the work runs)."""
    return lambda tx: tx.outbox.add(message)


def fail_first(
    n: int, make: Callable[[], Exception], only: str | None = None
) -> Callable[[OutboundMessage], Exception | None]:
    """A failure hook: the first ``n`` attempts (of message text ``only``) raise."""
    seen = {"n": 0}

    def hook(message: OutboundMessage) -> Exception | None:
        if only is not None and message.text != only:
            return None
        seen["n"] += 1
        return make() if seen["n"] <= n else None

    return hook


# --------------------------------------------------------------------------- ordering


async def test_one_chat_is_delivered_in_order(harness: Harness) -> None:
    channel = RecordingChannel("cli")
    harness.worker.add_channel(channel)
    to = channel.address("a")
    for i in range(20):
        await harness.send(to, f"msg {i}")
    sent = await wait_sent(channel, 20)
    assert [m.text for m in sent] == [f"msg {i}" for i in range(20)]
    assert len(channel.attempts) == 20  # each exactly once


async def test_a_message_another_daemon_queued_is_due_at_once_whatever_the_clocks(
    tmp_path: Path,
) -> None:
    """Daemons' clocks may be seconds apart. A message was queued with the clock of the
    daemon that queued it as its first try's time: one delivering it whose clock ran a
    minute behind sent it a minute late. A message queued is due at once."""
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    channel = RecordingChannel("cli")
    queued = OutboundMessage(to=channel.address("a"), text="queued by another daemon")
    await store.run(adding(queued))  # before this daemon's worker runs: read back by it
    worker = DeliveryWorker(store=store, clock=lambda: time.time() - 60)
    worker.add_channel(channel)
    await worker.start()
    try:
        assert [m.text for m in await wait_sent(channel, 1)] == ["queued by another daemon"]
    finally:
        await worker.stop()
        await db.close()


async def test_three_chats_all_arrive_each_in_order(harness: Harness) -> None:
    channel = RecordingChannel("cli")
    harness.worker.add_channel(channel)
    for i in range(10):
        for chat in ("a", "b", "c"):
            await harness.send(channel.address(chat), f"{chat}{i}")
    sent = await wait_sent(channel, 30)
    for chat in ("a", "b", "c"):
        assert [m.text for m in sent if m.to.chat_id == chat] == [f"{chat}{i}" for i in range(10)]
    assert len(sent) == 30


async def test_sent_rows_are_marked_with_a_receipt(harness: Harness) -> None:
    channel = RecordingChannel("cli")
    harness.worker.add_channel(channel)
    message = await harness.send(channel.address(), "hello")
    _, error, attempts = await harness.wait_status(message.id, "sent")
    assert (error, attempts) == (None, 1)
    assert await harness.store.run(lambda tx: tx.outbox.receipt_of(message.id)) == "m1"
    assert await harness.worker.idle(str(channel.address()))


# --------------------------------------------------------------------------- retries


async def test_retryable_error_keeps_order_and_does_not_block_other_chats(
    harness: Harness,
) -> None:
    channel = RecordingChannel("cli")
    channel.failure = fail_first(2, lambda: ChannelError("flood", retry_after=0.05), only="a0")
    harness.worker.add_channel(channel)
    first = await harness.send(channel.address("a"), "a0")
    await harness.send(channel.address("a"), "a1")
    await harness.send(channel.address("a"), "a2")
    await harness.send(channel.address("b"), "b0")
    sent = await wait_sent(channel, 4)
    texts = [m.text for m in sent]
    assert [t for t in texts if t.startswith("a")] == ["a0", "a1", "a2"]
    assert "b0" in texts
    assert texts.count("a0") == 1  # delivered once, after two failed attempts
    assert [m.text for m in channel.attempts].count("a0") == 3
    _, error, attempts = await harness.wait_status(first.id, "sent")
    assert attempts == 3 and error == "flood"


async def test_other_chat_is_delivered_while_one_chat_waits_for_its_retry(
    harness: Harness,
) -> None:
    channel = RecordingChannel("cli")
    # chat a fails with a long retry_after; chat b must still get through meanwhile
    channel.failure = fail_first(1, lambda: ChannelError("busy", retry_after=3600), only="a0")
    harness.worker.add_channel(channel)
    a0 = await harness.send(channel.address("a"), "a0")
    await harness.send(channel.address("a"), "a1")
    await harness.send(channel.address("b"), "b0")
    await channel.wait_for(lambda m: m.text == "b0", WAIT)
    assert [m.text for m in channel.sent] == ["b0"]  # a1 waits behind a0
    assert (await harness.row(a0.id))[0] == "queued"
    harness.clock.offset += 7200  # the hour passes
    harness.worker.wake()
    await wait_sent(channel, 3)
    assert [m.text for m in channel.sent] == ["b0", "a0", "a1"]


async def test_non_retryable_error_fails_the_message_and_moves_on(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    channel = RecordingChannel("cli")
    channel.failure = fail_first(
        99, lambda: ChannelError("chat not found", retryable=False), only="doomed"
    )
    harness.worker.add_channel(channel)
    with caplog.at_level(logging.WARNING, logger="echo_bot.delivery"):
        doomed = await harness.send(channel.address("a"), "doomed")
        await harness.send(channel.address("a"), "next")
        await channel.wait_for(lambda m: m.text == "next", WAIT)
    _, error, attempts = await harness.wait_status(doomed.id, "failed")
    assert error == "chat not found" and attempts == 1
    assert [m.text for m in channel.attempts].count("doomed") == 1  # not retried
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any(doomed.id in r.getMessage() for r in errors), caplog.text
    assert await harness.store.run(lambda tx: tx.outbox.pending_count()) == 0


async def test_max_attempts_marks_failed_not_dropped(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    channel = RecordingChannel("cli")
    channel.failure = fail_first(
        99, lambda: ChannelError("still down", retry_after=0.01), only="never"
    )
    harness.worker.add_channel(channel)  # the harness worker has max_attempts=3
    with caplog.at_level(logging.WARNING, logger="echo_bot.delivery"):
        never = await harness.send(channel.address("a"), "never")
        await harness.send(channel.address("a"), "after")
        _, error, attempts = await harness.wait_status(never.id, "failed")
        await channel.wait_for(lambda m: m.text == "after", WAIT)
    assert (error, attempts) == ("still down", 3)
    assert [m.text for m in channel.attempts].count("never") == 3
    assert "never" not in [m.text for m in channel.sent]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(never.id in m and "3 attempt" in m for m in errors), caplog.text


class AwayChannel(RecordingChannel):
    """A channel that says on /healthz whether it can reach its network."""

    status = "degraded"

    def health(self) -> dict[str, object]:
        return {"status": self.status}


async def test_failures_while_the_channel_cannot_reach_its_network_are_not_counted(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage longer than the attempts last fails nothing: while the channel's health
    is not "ok" a failed send is tried again (every AWAY_RETRY) without counting."""
    monkeypatch.setattr(delivery, "AWAY_RETRY", 0.01)
    channel = AwayChannel("cli")
    channel.failure = lambda _m: (
        ChannelError("network error: refused") if channel.status != "ok" else None
    )
    harness.worker.add_channel(channel)  # the harness worker has max_attempts=3
    message = await harness.send(channel.address("a"), "held")
    await eventually(lambda: len(channel.attempts) >= 6, WAIT, "six tries while away")
    status, error, attempts = await harness.row(message.id)
    assert (status, error, attempts) == ("queued", "network error: refused", 0)
    channel.status = "ok"  # the network is back
    await wait_sent(channel, 1)
    assert await harness.wait_status(message.id, "sent")
    assert [m.text for m in channel.sent] == ["held"]


async def test_plain_exception_in_send_is_retried(harness: Harness) -> None:
    channel = RecordingChannel("cli")
    channel.failure = fail_first(1, lambda: RuntimeError("socket closed"))
    harness.worker.add_channel(channel)
    message = await harness.send(channel.address("a"), "hello")
    # The first attempt fails with a backoff of seconds; let that time pass at once.
    status, error, _ = await harness.wait_attempts(message.id, 1)
    assert status == "queued" and error == "RuntimeError: socket closed"
    assert channel.sent == []
    harness.clock.offset += 3600
    harness.worker.wake()
    await channel.wait_for(lambda m: m.text == "hello", WAIT)
    assert (await harness.wait_status(message.id, "sent"))[2] == 2
    # the worker survived: later messages still flow
    await harness.send(channel.address("b"), "still alive")
    await channel.wait_for(lambda m: m.text == "still alive", WAIT)


async def test_a_broken_channel_does_not_block_other_channels(harness: Harness) -> None:
    class Broken(RecordingChannel):
        async def send(self, message: OutboundMessage) -> Receipt:
            self.attempts.append(message)
            raise ValueError("bad payload")

    broken = Broken("broken")
    good = RecordingChannel("cli")
    harness.worker.add_channel(broken)
    harness.worker.add_channel(good)
    bad = await harness.send(broken.address(), "x")
    await harness.send(good.address(), "y")
    await good.wait_for(lambda m: m.text == "y", WAIT)
    assert await harness.wait_attempts(bad.id, 1) == ("queued", "ValueError: bad payload", 1)


# --------------------------------------------------------------------------- edits


async def test_edit_carries_the_channel_message_id_of_the_original(harness: Harness) -> None:
    channel = RecordingChannel("cli")
    harness.worker.add_channel(channel)
    await harness.send(channel.address(), "first")
    original = await harness.send(channel.address(), "Approve?")
    await wait_sent(channel, 2)
    await harness.wait_status(original.id, "sent")  # the receipt is committed after the send
    receipt = await harness.store.run(lambda tx: tx.outbox.receipt_of(original.id))
    assert receipt == "m2"
    edit = await harness.send(channel.address(), "✅ Approved", edit_of=original.id)
    delivered = await channel.wait_for(lambda m: m.id == edit.id, WAIT)
    assert delivered.edit_of == original.id
    assert delivered.edit_message_id == receipt


async def test_edit_enqueued_with_its_original_waits_for_the_receipt(harness: Harness) -> None:
    channel = RecordingChannel("cli")
    original = await harness.send(channel.address(), "Approve?")
    edit = await harness.send(channel.address(), "❌ Denied", edit_of=original.id)
    harness.worker.add_channel(channel)  # both are queued before the channel starts
    delivered = await channel.wait_for(lambda m: m.id == edit.id, WAIT)
    assert delivered.edit_message_id == "m1"


# --------------------------------------------------------------------------- channels


async def test_unregistered_channel_stays_queued_until_it_is_added(harness: Harness) -> None:
    cli = RecordingChannel("cli")
    harness.worker.add_channel(cli)
    telegram = RecordingChannel("telegram")
    waiting = await harness.send(telegram.address("42"), "for later")
    await harness.send(cli.address(), "now")
    await cli.wait_for(lambda m: m.text == "now", WAIT)
    await asyncio.sleep(0)  # let the worker loop turn once more
    assert await harness.row(waiting.id) == ("queued", None, 0)
    assert (
        await harness.store.run(lambda tx: tx.outbox.pending_count(str(telegram.address("42"))))
        == 1
    )
    harness.worker.add_channel(telegram)
    await telegram.wait_for(lambda m: m.text == "for later", WAIT)
    await harness.wait_status(waiting.id, "sent")
    assert [m.text for m in cli.sent] == ["now"]


async def test_stop_lets_the_send_in_flight_finish(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    started, release = asyncio.Event(), asyncio.Event()

    class Slow(RecordingChannel):
        async def send(self, message: OutboundMessage) -> Receipt:
            started.set()
            await release.wait()
            return await super().send(message)

    channel = Slow("cli")
    worker = DeliveryWorker(store=store)
    worker.add_channel(channel)
    await worker.start()
    message = OutboundMessage(to=channel.address(), text="in flight")
    await store.run(lambda tx: tx.outbox.add(message))
    await asyncio.wait_for(started.wait(), WAIT)
    stopping = asyncio.create_task(worker.stop(grace=WAIT))
    await asyncio.sleep(0)
    release.set()
    await stopping
    assert [m.text for m in channel.sent] == ["in flight"]
    assert await store.run(lambda tx: tx.outbox.pending_count()) == 0
    await db.close()


class SlowChannel(RecordingChannel):
    async def send(self, message: OutboundMessage) -> Receipt:
        await asyncio.sleep(0.5)
        return await super().send(message)


async def test_the_worker_waits_quietly_while_a_send_is_in_flight(tmp_path: Path) -> None:
    """A send in flight is still 'queued' in the store; the worker must not take it for a
    due message and look again and again until the send returns (a busy loop)."""
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    worker = DeliveryWorker(store=store)
    channel = SlowChannel("cli")
    worker.add_channel(channel)
    await worker.start()
    try:
        for text in ("one", "two"):
            message = OutboundMessage(to=channel.address("a"), text=text)
            await store.run(adding(message))
        sent = await wait_sent(channel, 2)
        assert [m.text for m in sent] == ["one", "two"]
        # One look when woken, one after each send (more queued / the last one), and an
        # idle look at most: not one per event-loop turn for a second of sending.
        assert worker.looks <= 5, worker.looks
    finally:
        await worker.stop()
        await db.close()


class RateLimitedChannel(RecordingChannel):
    """Answers the first send like Telegram's 429: retry in a few seconds."""

    async def send(self, message: OutboundMessage) -> Receipt:
        if not self.attempts:
            self.attempts.append(message)
            raise ChannelError("429 Too Many Requests", retryable=True, retry_after=5)
        return await super().send(message)


async def test_the_worker_waits_quietly_while_a_chat_waits_out_a_retry(tmp_path: Path) -> None:
    """The message behind a chat's head is not due while the head waits out retry_after;
    counting it as due would have the worker read the outbox again and again."""
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    worker = DeliveryWorker(store=store)
    channel = RateLimitedChannel("cli")
    worker.add_channel(channel)
    try:
        for text in ("first", "second"):
            message = OutboundMessage(to=channel.address("a"), text=text)
            await store.run(adding(message))
        await worker.start()
        async with asyncio.timeout(WAIT):
            while not channel.attempts:
                await asyncio.sleep(0.01)
        # A bounded negative check: a busy loop would make thousands of looks here, and
        # nothing marks "the worker is waiting quietly" but the looks it does not make.
        await asyncio.sleep(1.0)
        assert worker.looks <= 5, worker.looks
        assert channel.sent == []  # and nothing jumped the queue
    finally:
        await worker.stop()
        await db.close()


async def test_outbound_queued_through_the_store_wakes_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody calls wake(): the commit that queued the message announces it, and the
    worker (idle for an hour here) sends it."""
    monkeypatch.setattr(delivery, "IDLE_WAIT", 3600.0)
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    worker = DeliveryWorker(store=store)
    channel = RecordingChannel("cli")
    worker.add_channel(channel)
    await worker.start()
    try:
        await settle_worker(worker)
        message = OutboundMessage(to=channel.address("a"), text="from a turn")
        await store.run(lambda tx: tx.outbox.add(message))
        await channel.wait_for(lambda m: m.text == "from a turn", WAIT)
    finally:
        await worker.stop()
        await db.close()


# -- knowing without asking the store ---------------------------------------------------
# A message committed with nothing queued ahead of it in its chat is sent from the
# commit's announcement, and after a send the worker knows from its own look and from
# later announcements whether the chat has more: no read of the outbox for either. The
# worker's idle look is an hour here, so nothing below may rely on it.


class GatedChannel(RecordingChannel):
    """Holds each send until the test lets it go."""

    def __init__(self, name: str = "cli") -> None:
        super().__init__(name)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, message: OutboundMessage) -> Receipt:
        self.entered.set()
        await self.release.wait()
        return await super().send(message)


@pytest.fixture
async def hour_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Store, DeliveryWorker]]:
    monkeypatch.setattr(delivery, "IDLE_WAIT", 3600.0)
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    worker = DeliveryWorker(store=store)
    try:
        yield store, worker
    finally:
        await worker.stop()
        await db.close()


def looked(worker: DeliveryWorker) -> int:
    """How many of the worker's looks for due messages have come back to it."""
    return worker.looked


async def settle_worker(worker: DeliveryWorker) -> None:
    """Until the worker's first look has come back to it: it now waits an hour."""
    await eventually(lambda: looked(worker) >= 1, WAIT, "the worker's first look")


async def test_a_message_queued_behind_a_send_in_flight_goes_right_after_it(
    hour_idle: tuple[Store, DeliveryWorker],
) -> None:
    store, worker = hour_idle
    channel = GatedChannel("cli")
    worker.add_channel(channel)
    await worker.start()
    await settle_worker(worker)
    to = channel.address("a")
    await store.run(lambda tx: tx.outbox.add(OutboundMessage(to=to, text="one")))
    await asyncio.wait_for(channel.entered.wait(), WAIT)
    await store.run(lambda tx: tx.outbox.add(OutboundMessage(to=to, text="two")))
    channel.release.set()
    sent = await wait_sent(channel, 2)
    assert [m.text for m in sent] == ["one", "two"]


async def test_messages_queued_in_one_transaction_go_in_their_order(
    hour_idle: tuple[Store, DeliveryWorker],
) -> None:
    """A reply and its attachments: the first is its chat's head, the rest follow it."""
    store, worker = hour_idle
    channel = RecordingChannel("cli")
    worker.add_channel(channel)
    await worker.start()
    await settle_worker(worker)
    texts = ["reply", "attachment 1", "attachment 2"]
    messages = [OutboundMessage(to=channel.address("a"), text=t) for t in texts]

    def add_all(tx: Tx) -> None:
        for m in messages:
            tx.outbox.add(m)

    await store.run(add_all)
    sent = await wait_sent(channel, 3)
    assert [m.text for m in sent] == texts


async def test_a_new_message_never_overtakes_one_waiting_out_a_retry(
    hour_idle: tuple[Store, DeliveryWorker],
) -> None:
    store, worker = hour_idle
    channel = RateLimitedChannel("cli")  # the first send: retry in 5 s
    worker.add_channel(channel)
    await worker.start()
    await settle_worker(worker)
    to = channel.address("a")
    await store.run(lambda tx: tx.outbox.add(OutboundMessage(to=to, text="first")))
    async with asyncio.timeout(WAIT):
        while not channel.attempts:
            await asyncio.sleep(0.01)
    seen = worker.looks  # looks begun so far; one begun after the commit is next
    await store.run(lambda tx: tx.outbox.add(OutboundMessage(to=to, text="second")))
    # The commit woke the worker (its chat has a message queued ahead): until a look
    # begun after it has come back (looks run one at a time), or something was sent.
    await eventually(lambda: looked(worker) > seen or channel.sent, WAIT, "a look after the commit")
    assert channel.sent == []
    assert [m.text for m in channel.attempts] == ["first"]


async def test_many_chats_queued_at_once_each_get_every_message_once_in_order(
    hour_idle: tuple[Store, DeliveryWorker],
) -> None:
    """Commits from many writers at once, some while their chat's send is in flight and
    while the worker looks: every message is sent exactly once, each chat in order."""
    store, worker = hour_idle
    channel = RecordingChannel("cli")
    worker.add_channel(channel)
    await worker.start()
    await settle_worker(worker)
    chats, per_chat = 12, 15

    async def writer(chat: int) -> None:
        to = channel.address(f"c{chat}")
        for n in range(per_chat):
            message = OutboundMessage(to=to, text=f"c{chat}-{n}")
            await store.run(lambda tx, m=message: tx.outbox.add(m))  # type: ignore[misc]
            if n % 4 == chat % 4:
                await asyncio.sleep(0)

    await asyncio.gather(*(writer(c) for c in range(chats)))
    sent = await wait_sent(channel, chats * per_chat)

    async def all_idle() -> bool:
        for chat in range(chats):
            if not await worker.idle(str(channel.address(f"c{chat}"))):
                return False
        return True

    # Nothing queued or in flight for any chat: nothing more can come.
    await eventually(all_idle, WAIT, "every chat idle")
    texts = [m.text for m in channel.sent]
    assert len(texts) == len(set(texts)) == chats * per_chat
    for chat in range(chats):
        mine = [t for t in texts if t.startswith(f"c{chat}-")]
        assert mine == [f"c{chat}-{n}" for n in range(per_chat)]
    assert sent is channel.sent


async def test_a_message_committed_with_the_look_that_starts_its_chat_is_not_left_behind(
    hour_idle: tuple[Store, DeliveryWorker],
) -> None:
    """The look reads the chat's head; a message for that chat committed in the same
    batch right after the look (so the look did not see it) is announced before the
    head's send is registered: the worker must still send it next."""
    store, worker = hour_idle
    channel = RecordingChannel("cli")
    await worker.start()
    await settle_worker(worker)
    to = channel.address("a")
    # Queued while its channel is away: it stays queued.
    await store.run(lambda tx: tx.outbox.add(OutboundMessage(to=to, text="one")))
    worker.add_channel(channel)  # wakes the worker: its look joins the next batch…
    await asyncio.sleep(0)
    await store.run(lambda tx: tx.outbox.add(OutboundMessage(to=to, text="two")))  # …and this
    sent = await wait_sent(channel, 2)
    assert [m.text for m in sent] == ["one", "two"]


class SessionChannel(RecordingChannel):
    """A channel whose send reaches its server, then waits for the answer, and whose
    stop closes its connection: a send still waiting then fails, as an HTTP client's
    does when its session is closed under it (the message was delivered all the same)."""

    def __init__(self) -> None:
        super().__init__("cli")
        self.reached: list[str] = []
        self._closed = asyncio.Event()

    async def send(self, message: OutboundMessage) -> Receipt:
        self.reached.append(message.text)
        answer = asyncio.ensure_future(asyncio.sleep(0.3))
        closed = asyncio.ensure_future(self._closed.wait())
        await asyncio.wait({answer, closed}, return_when=asyncio.FIRST_COMPLETED)
        answer.cancel()
        closed.cancel()
        if self._closed.is_set():
            raise ChannelError("network error: Server disconnected")
        return await super().send(message)

    async def stop(self) -> None:
        self._closed.set()


async def test_a_send_in_flight_at_a_stop_finishes_before_the_channel_stops(
    state_dir: Path,
) -> None:
    """Regression (found by the Slack HTTP contract driver): channels stopped while the
    delivery worker still sent to them, so a reply in flight failed as the channel closed
    its session, though its server had it, and was sent again at the next start."""
    channel = SessionChannel()
    async with running_bot(state_dir, channel=channel) as bot:
        message = OutboundMessage(to=channel.address(), text="in flight at the stop")
        await bot.store.run(lambda tx: tx.outbox.add(message))
        await eventually(lambda: channel.reached, timeout=5, what="the send reaching its server")
    again = SessionChannel()
    async with running_bot(state_dir, channel=again):
        await asyncio.sleep(1.0)
    assert channel.reached == ["in flight at the stop"] and again.reached == []
    assert [m.text for m in channel.sent] == ["in flight at the stop"]


class LockingChannel(RecordingChannel):
    """Sends, and as the send goes out another process takes the store's write lock
    for ``hold`` seconds (a backup, a `sqlite3` shell): the send's record must wait."""

    def __init__(self, db_path: Path, hold: float) -> None:
        super().__init__("cli")
        self.db_path, self.hold = db_path, hold
        self.released = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None

    async def send(self, message: OutboundMessage) -> Receipt:
        if self._holder is None:
            other = sqlite3.connect(self.db_path, isolation_level=None, timeout=0)
            other.execute("BEGIN IMMEDIATE")
            self._holder = asyncio.create_task(self._release(other))
        return await super().send(message)

    async def _release(self, other: sqlite3.Connection) -> None:
        await asyncio.sleep(self.hold)
        other.execute("COMMIT")
        other.close()
        self.released.set()


async def test_a_send_the_store_cannot_record_yet_is_not_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply went out; the store refuses the record of it for a while (another
    process holds its write lock past the busy timeout): the chat waits for the record,
    and the reply is sent once."""
    monkeypatch.setattr(store_db, "BUSY_TIMEOUT_MS", 200)
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    store = Store(db, Masker())
    worker = DeliveryWorker(store=store, max_attempts=3)
    await worker.start()
    try:
        channel = LockingChannel(tmp_path / "x.sqlite3", hold=2.0)
        worker.add_channel(channel)
        first = OutboundMessage(to=channel.address("a"), text="once")
        await store.run(lambda tx: tx.outbox.add(first))
        await asyncio.wait_for(channel.released.wait(), WAIT)
        await store.run(adding(OutboundMessage(to=channel.address("a"), text="after")))
        await wait_sent(channel, 2)
        await asyncio.sleep(0.5)  # a second copy would show by now
        assert [m.text for m in channel.sent] == ["once", "after"]
        [row] = [d for d in await store.run(lambda tx: tx.outbox.deliveries()) if d.id == first.id]
        assert (row.status, row.attempts) == ("sent", 1)
    finally:
        await worker.stop()
        await db.close()


@pytest.mark.parametrize("retry_after", [math.inf, 1e12, math.nan, -5.0, 0.0])
async def test_a_networks_retry_after_is_taken_only_within_sane_bounds(
    harness: Harness, retry_after: float
) -> None:
    """A "retry after" that is no number, infinite, years away or negative (a broken or
    hostile peer's answer): the message waits between a second and a day, its attempt
    counted, and the chat's next message is not held behind it for ever."""
    channel = RecordingChannel("cli")
    refused_at: list[float] = []

    def refuse(message: OutboundMessage) -> Exception | None:
        if message.text != "first" or refused_at:
            return None
        refused_at.append(harness.clock())
        return ChannelError("slow down", retry_after=retry_after)

    channel.failure = refuse
    harness.worker.add_channel(channel)
    first = await harness.send(channel.address("a"), "first")
    await harness.send(channel.address("a"), "second")
    await harness.wait_attempts(first.id, 1)
    [row] = [
        d for d in await harness.store.run(lambda tx: tx.outbox.deliveries()) if d.id == first.id
    ]  # its next attempt stays as it was set, whether it is sent by now or not
    wait = row.next_attempt_at - refused_at[0]
    assert row.attempts >= 1 and 1.0 <= wait <= delivery.MAX_RETRY_AFTER + 1, wait
    harness.clock.offset += delivery.MAX_RETRY_AFTER + 1  # the wait has passed
    harness.worker.wake()
    sent = await wait_sent(channel, 2)
    assert [m.text for m in sent] == ["first", "second"]


class PacedChannel(RecordingChannel):
    """A send that takes ``seconds`` (a long reply's parts paced out)."""

    def __init__(self, seconds: float) -> None:
        super().__init__("tg")
        self.seconds = seconds
        self.started = asyncio.Event()

    async def send(self, message: OutboundMessage) -> Receipt:
        self.started.set()
        await asyncio.sleep(self.seconds)
        return await super().send(message)


async def test_a_daemon_stopping_mid_send_keeps_the_channels_lease_until_the_send_is_done(
    tmp_path: Path,
) -> None:
    """A rolling restart: the daemon delivering a channel stops while a long reply is
    going out; the other daemon on the store takes the channel's outbox over only once
    that send is recorded, and sends nothing of it again."""
    from echo_bot.cluster import BEAT, Cluster
    from echo_bot.instances import InstanceMembership

    workers, dbs, channels, members = [], [], [], []
    # The first's send outlasts a beat: the other daemon looks at the lease meanwhile.
    for name, seconds in (("first", BEAT + 1.5), ("second", 0.0)):
        db = Database(tmp_path / "x.sqlite3")
        await db.open()
        store = Store(db, Masker(), instance=name)
        member = InstanceMembership(store, label=name, started_at=time.time())
        await member.start()
        members.append(member)
        worker = DeliveryWorker(store=store, cluster=Cluster(store, name))
        await worker.start()
        channel = PacedChannel(seconds)
        worker.add_channel(channel)
        workers.append(worker)
        dbs.append(db)
        channels.append(channel)
        if name == "first":  # the first takes the channel's lease before the other runs
            await eventually(functools.partial(worker._may_send, "tg"), WAIT, "the lease taken")
    first = workers[0]
    try:
        reply = OutboundMessage(to=Address(channel="tg", chat_id="1"), text="long reply")
        await first.store.run(adding(reply))
        await asyncio.wait_for(channels[0].started.wait(), WAIT)
        await first.release("tg")  # as a channel's stop does, the send still going
        after = OutboundMessage(to=Address(channel="tg", chat_id="1"), text="after")
        await first.store.run(adding(after))
        await eventually(lambda: "after" in [m.text for m in channels[1].sent], 3 * WAIT,
                         "the other daemon delivering what came next")  # fmt: skip
        await asyncio.sleep(0.5)  # a second copy would show by now
    finally:
        for worker in workers:
            await worker.stop()
        for member in members:
            await member.stop()
        for db in dbs:
            await db.close()
    assert [m.text for m in channels[0].sent] == ["long reply"]
    assert [m.text for m in channels[1].sent] == ["after"]


class FlappingChannel(RecordingChannel):
    """Says it cannot reach its network after a send of its fails (as Slack and
    Discord do on a 5xx), and that it can again after one goes through."""

    status = "ok"

    def health(self) -> dict[str, object]:
        return {"status": self.status}

    async def send(self, message: OutboundMessage) -> Receipt:
        try:
            receipt = await super().send(message)
        except ChannelError:
            self.status = "degraded"
            raise
        self.status = "ok"
        return receipt


async def test_a_message_its_server_always_fails_is_counted_once_the_network_takes_others(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload the server answers 5xx every time while it takes every other message:
    the network is there, so its failures count and it fails after the last attempt,
    letting its chat go on (it was tried every AWAY_RETRY for ever, uncounted)."""
    monkeypatch.setattr(delivery, "AWAY_RETRY", 1_000.0)  # due only when the test says
    channel = FlappingChannel("cli")
    channel.failure = lambda m: ChannelError("HTTP 500") if m.text == "poison" else None
    harness.worker.add_channel(channel)  # the harness worker has max_attempts=3
    poison = await harness.send(channel.address("a"), "poison")
    await harness.send(channel.address("a"), "after")

    def tried(n: int) -> Callable[[], bool]:
        return lambda: sum(m.text == "poison" for m in channel.attempts) >= n

    for n in range(1, 4):
        await eventually(tried(n), WAIT, f"try {n} of the poison message")
        await eventually(lambda: channel.status == "degraded", WAIT, "the failure said")
        if n < 3:
            other = await harness.send(channel.address(f"other{n}"), f"other {n}")
            await channel.wait_for(functools.partial(_is, other.id), WAIT)
            harness.clock.offset += 2_000  # past its wait, whichever it was
            harness.worker.wake()
    _, error, attempts = await harness.wait_status(poison.id, "failed")
    assert (error, attempts) == ("HTTP 500", 3)
    await channel.wait_for(lambda m: m.text == "after", WAIT)


def _is(outbound_id: str, message: OutboundMessage) -> bool:
    return message.id == outbound_id
