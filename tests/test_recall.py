"""Recall (store/recall.py, the history_search tool): a chat's own history searched by
its words on both engines, facts far outside the model's window found, another chat's
never, and any query — search syntax, SQL, symbols, oversized — answered, not failed."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database as SqlDb

from echo_bot.agent.runner import HISTORY_LIMIT
from echo_bot.conversation import ChatMessage
from echo_bot.events import OutboundMessage
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store, Tx
from echo_bot.store.schema import MIGRATIONS
from tests.conftest import Bot, running_bot

pytestmark = pytest.mark.usefixtures("on_both_engines")

FILLER = 3 * HISTORY_LIMIT  # messages after the fact: far outside what the model sees


def fill(tx: Tx, session_key: str, fact: str) -> None:
    tx.turns.append_message(session_key, "t0", ChatMessage(role="user", content=fact))
    for n in range(FILLER):
        text = f"small talk number {n} about the weather and the garden"
        said = (
            ChatMessage(role="user", content=text)
            if n % 2 == 0
            else ChatMessage(role="assistant", content=text)
        )
        tx.turns.append_message(session_key, f"t{n + 1}", said)
    tx.turns.append_message(
        session_key, "tool", ChatMessage(role="tool", content="locker code 9999", name="x")
    )


async def answer(bot: Bot, text: str, chat: str = "local") -> OutboundMessage:
    inbound = await bot.channel.say(text, chat=chat)
    return await bot.channel.wait_for(
        lambda m: m.kind == "reply" and m.metadata.get("inbound_id") == inbound
    )


def search(query: str) -> str:
    return "/tool history_search " + json.dumps({"query": query})


async def test_a_fact_far_outside_the_window_is_found_in_its_own_chat_only(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        mine, theirs = str(bot.channel.address("local")), str(bot.channel.address("other"))
        await bot.store.run(lambda tx: fill(tx, mine, "My locker code is 4711, remember it"))
        await bot.store.run(lambda tx: fill(tx, theirs, "The locker code at work is 1234"))
        window = await bot.store.run(lambda tx: bot.daemon.runtime.runner.history.load(tx, mine))
        assert all("4711" not in (m.content or "") for m in window)  # out of the model's view
        found = await answer(bot, search("locker code"))
        assert "4711" in found.text and "1234" not in found.text
        assert "9999" not in found.text  # tool output is not searched
        assert "1 message(s)" in found.text
        asked = await answer(bot, "what did I say about my locker?")  # the rules brain
        assert "4711" in asked.text
        elsewhere = await answer(bot, search("4711"), chat="other")
        assert "Nothing in this chat's history matches" in elsewhere.text


@pytest.mark.parametrize(
    "query",
    [
        '"AND (', "*", "NEAR(a b)", "'; DROP TABLE messages; --", "a:b OR c", "!!! ???",
        "ÄÖÜ ßtraße 😀", "x" * 200, "locker | code & !x", "col:locker",
    ],
)  # fmt: skip
async def test_any_query_is_answered_never_failed(state_dir: Path, query: str) -> None:
    async with running_bot(state_dir) as bot:
        mine = str(bot.channel.address("local"))
        await bot.store.run(lambda tx: fill(tx, mine, "My locker code is 4711"))
        found = await answer(bot, search(query))
        assert re.match(r"(Nothing in this chat's history|\d+ message\(s\))", found.text), found
        assert "Traceback" not in found.text and "⚠️" not in found.text
        rows = await bot.store.run(lambda tx: tx.recall.search(mine, "garden", 10_000))
        assert len(rows) >= FILLER  # the history is still all there (and the answer)


async def test_too_long_a_query_is_refused_with_the_reason(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        refused = await answer(bot, search("x" * 201))
        assert "INVALID_PARAMETER" in refused.text


def test_messages_stored_before_recall_are_found_after_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "echo-bot.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for step in MIGRATIONS[:13]:  # a store as schema 13 left it, with a conversation
        step(SqlDb(conn))
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta(key, value) VALUES('schema_version', '13')")
    for role, content in (("user", "the boat is called Osprey"), ("tool", "Osprey data")):
        conn.execute(
            "INSERT INTO messages (session_key, turn_id, role, content, created_at)"
            " VALUES ('cli:local', 't', ?, ?, 1.0)",
            [role, content],
        )
    conn.execute("COMMIT")
    conn.close()
    store = Store(Database(path), Masker())
    store.open_sync()  # migrates, indexing what was there
    try:
        found = store.run_sync(lambda tx: tx.recall.search("cli:local", "osprey"))
    finally:
        store.close_sync()
    assert [(f.role, f.content) for f in found] == [("user", "the boat is called Osprey")]
