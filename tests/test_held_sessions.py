"""With several daemons on one PostgreSQL store, a session's next turn on the daemon that
has held it since its last one runs without a take of the lease of its own: its first
checkpoint has the server check that the lease is still this daemon's and that no
earlier turn of the session waits (``TurnRunner.advance``'s ``held``). What a user would
notice when that belief is wrong: nothing run by two daemons, nothing out of order."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from echo_bot.cluster import session_lease
from echo_bot.events import MessageInbound, Sender, new_id
from echo_bot.secrets import Masker
from echo_bot.store import Tx
from echo_bot.store.meta import InstanceRow
from tests.conftest import running_bot

pytestmark = pytest.mark.parametrize("on_both_engines", ["postgres"], indirect=True)

ANOTHER = "another-daemon"
ASK = "what time is it?"


def another_daemon_seen(tx: Any) -> None:
    """A live daemon besides the test's (its instance row seen now)."""
    tx.meta.instance_seen(
        InstanceRow(ANOTHER, ANOTHER, "elsewhere", "boot", 1, "test", time.time(), 0.0)
    )


def replies_to(bot: Any, inbound_id: str) -> list[str]:
    return [
        m.text
        for m in bot.channel.sent
        if m.kind == "reply" and m.metadata.get("inbound_id") == inbound_id
    ]


@pytest.mark.usefixtures("on_both_engines")
async def test_a_session_taken_over_while_idle_is_left_to_its_holder_and_nothing_of_its_turn_is_written(  # noqa: E501
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        await bot.channel.reply_to(await bot.channel.say(ASK))  # the session held since
        lease = session_lease(bot.channel.address().session_key)
        # Another daemon took the session over (as if this one had stalled past its
        # lease while the chat was idle).
        await bot.store.run(another_daemon_seen)
        await bot.db.run(
            lambda d: d.execute("UPDATE leases SET instance = ? WHERE name = ?", [ANOTHER, lease])
        )
        asked = await bot.channel.say(ASK)
        await asyncio.sleep(2)  # this daemon's poll and claims come and go meanwhile
        assert replies_to(bot, asked) == []
        row = await bot.store.run(lambda tx: tx.inbox.get(asked))
        assert row is not None and row.status == "accepted"
        assert await bot.store.run(lambda tx: tx.turns.get(asked)) is None
        history = await bot.store.run(lambda tx: tx.turns.history("cli:local"))
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        # The holder lets the session go without running it: this daemon's poll takes it.
        await bot.db.run(lambda d: d.execute("DELETE FROM leases WHERE name = ?", [lease]))
        reply = await bot.channel.reply_to(asked, timeout=20)
        assert reply.text.startswith("It is")
        assert len(replies_to(bot, asked)) == 1
        history = await bot.store.run(lambda tx: tx.turns.history("cli:local"))
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"] * 2


@pytest.mark.usefixtures("on_both_engines")
async def test_an_earlier_turn_another_daemon_committed_runs_before_a_held_sessions_next_one(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        await bot.channel.reply_to(await bot.channel.say(ASK))  # the session held since
        # Another daemon committed a message of the same chat (it received it first) and
        # left it, the session being held here; its wake has not reached this one yet.
        earlier = MessageInbound(
            address=bot.channel.address(),
            sender=Sender(id="owner", name="owner"),
            text=ASK,
            external_id=new_id(),
        )
        # Its unit of work not flushed nor announced: no NOTIFY, nothing told this daemon.
        await bot.db.run(lambda d: Tx(d, Masker(), ANOTHER).inbox.add(earlier))
        later = await bot.channel.say(ASK)
        await bot.channel.reply_to(later, timeout=20)
        await bot.channel.reply_to(earlier.id, timeout=20)
        order = [
            m.metadata.get("inbound_id")
            for m in bot.channel.sent
            if m.kind == "reply" and m.metadata.get("inbound_id") in (earlier.id, later)
        ]
        assert order == [earlier.id, later]
