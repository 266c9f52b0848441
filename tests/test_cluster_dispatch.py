"""The dispatcher among daemons on one PostgreSQL database: a session's turns run in the
order they arrived, whichever daemon committed them and whichever took the session."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from echo_bot.agent.dispatcher import Dispatcher
from echo_bot.agent.runner import NotHeldAfterAll, TurnRunner
from echo_bot.approvals import ApprovalGate
from echo_bot.cluster import Cluster
from echo_bot.events import Address, InboundMessage, InboundStatus, MessageInbound, Sender, new_id
from echo_bot.secrets import Masker
from echo_bot.store import Store, Tx
from echo_bot.store.meta import InstanceRow
from tests.postgres import fresh_database
from tests.waiting import eventually


class RecordingRunner:
    """Runs a turn by recording it and marking its row done (the order is the point)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.ran: list[str] = []

    async def advance(
        self, inbound_id: str, known: InboundMessage | None = None, *, held: bool = False
    ) -> None:
        if held:  # it cannot check the lease at a first checkpoint: take it first
            raise NotHeldAfterAll(inbound_id)
        self.ran.append(inbound_id)
        await self.store.run(lambda tx: tx.inbox.set_status(inbound_id, InboundStatus.DONE))


async def alive(store: Store, *names: str) -> None:
    """``names`` seen now, as their heartbeats say: only a daemon seen alive takes a lease."""
    rows = [InstanceRow(name, name, "host", "", 0, "0", time.time(), time.time()) for name in names]

    def seen(tx: Tx) -> None:
        for row in rows:
            tx.meta.instance_seen(row)

    await store.run(seen)


def message(text: str) -> InboundMessage:
    return MessageInbound(
        address=Address(channel="cli", chat_id="owner"),
        sender=Sender(id="owner"),
        text=text,
        external_id=new_id(),
    )


async def test_a_daemon_taking_a_session_runs_the_turns_that_arrived_before_first() -> None:
    """Another daemon committed a message for the session (or drove it and died); this
    daemon's own later message reaches its dispatcher first, in memory. Taking the
    session, it runs the earlier one first."""
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        other = Store(PostgresDatabase(url), Masker(), instance="other-1")
        mine = Store(PostgresDatabase(url), Masker(), instance="mine-1")
        await other.open()
        await mine.open()
        try:
            await alive(mine, "mine-1")
            earlier, later = message("first"), message("second")
            await other.run(lambda tx: tx.inbox.add(earlier))
            await mine.run(lambda tx: tx.inbox.add(later))
            runner = RecordingRunner(mine)
            dispatcher = Dispatcher(
                store=mine,
                runner=cast(TurnRunner, runner),
                gate=cast(ApprovalGate, cast(Any, None)),  # no decisions here
                max_concurrent=4,
                cluster=Cluster(mine, "mine-1"),
            )
            dispatcher.accept([later])  # as a commit of this daemon hands it over
            async with asyncio.timeout(10):
                while len(runner.ran) < 2:
                    await asyncio.sleep(0.02)
            assert runner.ran == [earlier.id, later.id]
            # A third message of the session, run after the two: a turn queued twice
            # would have run again before it (a session's turns run in order).
            third = message("third")
            await mine.run(lambda tx: tx.inbox.add(third))
            dispatcher.accept([third])
            await eventually(lambda: len(runner.ran) >= 3, what="the third turn run")
            assert runner.ran == [earlier.id, later.id, third.id], "a turn ran twice"
            await dispatcher.stop()
        finally:
            await other.close()
            await mine.close()


async def test_an_idle_session_is_kept_a_moment_then_let_go() -> None:
    """A chat's next message often follows at once: the session's lease is kept for
    ``IDLE_HOLD`` after its last turn (no lease let go and taken again between the two),
    then let go, so another daemon may take the session."""
    from echo_bot.agent.dispatcher import IDLE_HOLD
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        store = Store(PostgresDatabase(url), Masker(), instance="mine-1")
        await store.open()
        try:
            await alive(store, "mine-1")
            runner = RecordingRunner(store)
            dispatcher = Dispatcher(
                store=store,
                runner=cast(TurnRunner, runner),
                gate=cast(ApprovalGate, cast(Any, None)),
                max_concurrent=4,
                cluster=Cluster(store, "mine-1"),
            )

            async def held() -> list[str]:
                leases = await store.run(lambda tx: tx.leases.every())
                return [name for name, instance in leases if instance == "mine-1"]

            async def turn(said: InboundMessage) -> None:
                await store.run(lambda tx: tx.inbox.add(said))
                dispatcher.accept([said])
                await eventually(lambda: said.id in runner.ran, what=f"{said.id} run")

            for text in ("first", "second"):
                await turn(message(text))
                await asyncio.sleep(IDLE_HOLD / 4)
                assert await held() == ["session:cli:owner"]
            async with asyncio.timeout(IDLE_HOLD * 3):
                while await held():
                    await asyncio.sleep(0.1)
            await dispatcher.stop()
        finally:
            await store.close()


async def test_a_take_says_whether_the_daemon_held_the_lease_without_a_break() -> None:
    """What a daemon keeps of a session in memory holds while it holds the session's
    lease without a break: a take says so (held already), and says not after the lease
    was let go or another daemon held it."""
    from echo_bot.store.postgres import PostgresDatabase

    with fresh_database() as url:
        store = Store(PostgresDatabase(url), Masker(), instance="a")
        await store.open()
        try:

            async def take(instance: str) -> tuple[bool, bool]:
                return await store.run(lambda tx: tx.leases.take_noting("session:s", instance, 15))

            assert await take("a") == (False, False)  # not seen alive: takes nothing
            await alive(store, "a", "b")
            assert await take("a") == (True, False)  # new
            assert await take("a") == (True, True)  # held already
            await store.run(lambda tx: tx.leases.release("session:s", "a"))
            assert await take("a") == (True, False)  # let go between
            # "a" unseen for longer than the lease: "b" may take it over, then "a" again.
            stale = "UPDATE instances SET seen_at = seen_at - 20 WHERE name = 'a'"
            await store.run(lambda tx: tx._db.execute(stale))
            assert await take("a") == (False, False)  # its own row stale: not even back
            assert await take("b") == (True, False)
            await alive(store, "a")
            assert await take("a") == (False, False)  # "b" is alive and holds it
            await store.run(lambda tx: tx._db.execute(stale.replace("'a'", "'b'")))
            assert await take("a") == (True, False)  # "b" held it between
            assert await take("a") == (True, True)
        finally:
            await store.close()
