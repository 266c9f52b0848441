"""A turn of the rules brain on SQLite commits twice: its start with its first step, its
results with its answer (the checkpoints between them wait for the next commit, with
nothing slow in between). What that must not cost: a message handed over again is still
answered once, the history the cache holds is still the store's, and a tool's result is
recorded before anything shows it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from echo_bot.events import InboundStatus
from echo_bot.store import DB_FILENAME
from tests.conftest import ON_POSTGRES, Bot, calls_of_turn, running_bot
from tests.waiting import eventually


def commits_touching(statements: list[str], inbound_id: str) -> int:
    """How many transactions among ``statements`` wrote something of ``inbound_id``'s turn."""
    count, touched = 0, False
    for statement in statements:
        if statement.startswith("BEGIN"):
            touched = False
        elif statement.startswith("COMMIT"):
            count += touched
        elif inbound_id in statement and statement.split()[0] in {"INSERT", "UPDATE"}:
            touched = True
    return count


async def test_a_rules_turn_commits_its_start_with_its_step_and_its_results_with_its_answer(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        await bot.channel.reply_to(await bot.channel.say("what time is it?"))  # history held
        sent: list[str] = []
        # Both connections: the loop's, and the store thread's, which takes a batch the
        # loop found the write lock taken for (the WAL checkpointer, under load).
        for slow in (False, True):
            await bot.db.run(lambda db: db.conn.set_trace_callback(sent.append), slow=slow)
        try:
            asked = await bot.channel.say("what time is it?")
            reply = await bot.channel.reply_to(asked)
        finally:
            for slow in (False, True):
                await bot.db.run(lambda db: db.conn.set_trace_callback(None), slow=slow)
        assert reply.text.startswith("It is")
        # The inbound's own commit, then the turn's two (the delivery's comes after).
        assert commits_touching(sent, asked) == 3
        (call,) = await bot.store.run(lambda tx: calls_of_turn(tx, asked))
        assert call.status == "done" and call.result is not None
        assert call.result["output"] == reply.text


async def test_the_history_the_cache_holds_is_the_stores_after_turns_and_a_reset(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        runner = bot.daemon.runtime.runner
        key = "cli:local"
        for text in ["what time is it?", "/help", "what time is it?", "/new", "what time is it?"]:
            await bot.channel.reply_to(await bot.channel.say(text))
            held = runner.history.peek(key, [])
            stored = await bot.store.run(lambda tx: tx.turns.history(key))
            if held is not None:  # dropped by /new until the next turn reads it whole
                assert held == stored, text
        assert runner.history.peek(key, []) == await bot.store.run(lambda tx: tx.turns.history(key))
        assert [m.role for m in await bot.store.run(lambda tx: tx.turns.history(key))] == [
            "user", "assistant", "tool", "assistant",
        ]  # fmt: skip


@pytest.mark.usefixtures("on_both_engines")
async def test_a_message_handed_over_again_after_its_answer_is_not_answered_again(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        await bot.channel.reply_to(await bot.channel.say("what time is it?"))
        asked = await bot.channel.say("what time is it?")
        await bot.channel.reply_to(asked)
        row = await bot.store.run(lambda tx: tx.inbox.get(asked))
        assert row is not None and row.status == InboundStatus.DONE
        await bot.daemon.runtime.runner.advance(asked, row.message)
        replies = [m for m in bot.channel.sent if m.metadata.get("inbound_id") == asked]
        assert len(replies) == 1
        history = await bot.store.run(lambda tx: tx.turns.history("cli:local"))
        assert [m.role for m in history].count("user") == 2
        assert len(await bot.store.run(lambda tx: calls_of_turn(tx, asked))) == 1


def test_the_turn_rows_in_the_file_match_what_was_answered(state_dir: Path) -> None:
    """After a run: every inbound done has its turn done and its calls done (a deferred
    checkpoint never leaves a turn behind its inbound)."""
    import asyncio

    async def run() -> None:
        async with running_bot(state_dir) as bot:
            for _ in range(5):
                await bot.channel.reply_to(await bot.channel.say("what time is it?"))

    asyncio.run(run())
    with sqlite3.connect(state_dir / DB_FILENAME) as conn:
        rows = conn.execute(
            "SELECT i.status, t.status, t.step FROM inbox i JOIN turns t ON t.id = i.id"
        ).fetchall()
        calls = conn.execute("SELECT status FROM tool_calls").fetchall()
    assert rows == [("done", "done", 1)] * 5
    assert calls == [("done",)] * 5


@pytest.mark.usefixtures("on_both_engines")
async def test_a_session_another_daemon_drove_meanwhile_is_read_whole_again(
    tmp_path: Path,
) -> None:
    """The history cache is not read on: with two daemons, one that takes a session's
    lease after the other drove it forgets what it kept, and its history is the store's."""
    if ON_POSTGRES.get() is None:
        pytest.skip("one daemon per store on SQLite")
    key = "cli:local"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with running_bot(tmp_path / "a") as a, running_bot(tmp_path / "b") as b:

        async def answered_by(bot: Bot) -> None:
            cluster = bot.daemon.runtime.cluster
            assert cluster is not None
            # Held before the message: its turn is this daemon's (the other's poll
            # could claim the message first otherwise).
            assert await cluster.take(f"session:{key}")
            asked = await bot.channel.say("what time is it?")

            async def done() -> bool:
                row = await bot.store.run(lambda tx: tx.inbox.get(asked))
                return row is not None and row.status == InboundStatus.DONE

            await eventually(done, what=f"{asked} answered")

            async def let_go() -> bool:  # the driver keeps an idle session a moment
                leases = await bot.store.run(lambda tx: tx.leases.every())
                return not [name for name, _holder in leases if name.startswith("session:")]

            await eventually(let_go, timeout=10, what="the session let go")

        await answered_by(a)
        await answered_by(b)  # the other daemon drives the session meanwhile
        await answered_by(a)
        held = a.daemon.runtime.runner.history.peek(key, [])
        stored = await a.store.run(lambda tx: tx.turns.history(key))
        assert held == stored
        assert [m.role for m in stored].count("user") == 3
