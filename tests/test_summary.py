"""The running summary (agent/runner.py ``_summarised``): once a conversation outgrows
[brain] context_chars, its oldest part is summarised by the model, kept as a checkpoint
(once, even when the turn is re-run after a kill), and the prompt carries the summary
and the recent messages within the budget; the model away: the window as before."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from echo_bot.conversation import ChatMessage
from echo_bot.events import OutboundMessage
from echo_bot.store import Tx
from echo_bot.store.summaries import Summary
from tests.conftest import Bot, echo_bot_env, read_store, running_bot
from tests.fakes.openai_api import FakeOpenAI
from tests.proc import EchoBotProcess

BUDGET = 2000


def llm_config(llm: FakeOpenAI) -> str:
    return (
        f'[brain]\nkind = "openai"\ncontext_chars = {BUDGET}\n[openai]\n'
        f'base_url = "{llm.base_url}"\nmodel = "gpt-test"\nmax_retries = 0\nstream = false\n'
    )


def talk(tx: Tx, key: str, count: int = 30) -> None:
    for n in range(count):
        said = f"message {n:02d} " + "about the long voyage " * 4
        message = ChatMessage(role="user" if n % 2 == 0 else "assistant", content=said)
        tx.turns.append_message(key, f"t{n}", message)


def is_summary(request: dict[str, object]) -> bool:
    messages = request["messages"]
    assert isinstance(messages, list)
    return str(messages[0]["content"]).startswith("Summarise the conversation")


def size(request: dict[str, object]) -> int:
    messages = request["messages"]
    assert isinstance(messages, list)
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages)


async def answer(bot: Bot, text: str) -> OutboundMessage:
    inbound = await bot.channel.say(text)
    return await bot.channel.wait_for(
        lambda m: m.kind == "reply" and m.metadata.get("inbound_id") == inbound
    )


@pytest.mark.usefixtures("on_both_engines")
async def test_a_summary_is_made_once_and_the_prompt_carries_it_within_the_budget(
    state_dir: Path,
) -> None:
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        env = {"OPENAI_API_KEY": "sk-test"}
        async with running_bot(state_dir, llm_config(llm), environ=env) as bot:
            key = str(bot.channel.address())
            await bot.store.run(lambda tx: talk(tx, key))
            llm.reply("SUMMARY: the voyage so far", usage={"prompt_tokens": 900,
                                                           "completion_tokens": 40})  # fmt: skip
            llm.reply("first answer")
            assert (await answer(bot, "where are we?")).text == "first answer"
            llm.reply("second answer")
            assert (await answer(bot, "and now?")).text == "second answer"
            kept = await bot.store.run(lambda tx: tx.summaries.of(key))
            spent = await bot.store.run(lambda tx: tx.audit.tokens_since(0))
    requests = llm.chat_requests()
    assert [is_summary(r) for r in requests] == [True, False, False]  # made once
    # The oldest part is summarised; the newest messages that fit half the budget stay.
    assert "message 00" in json.dumps(requests[0]) and "message 29" not in json.dumps(requests[0])
    assert "message 29" in json.dumps(requests[1])
    for main in requests[1:]:
        text = json.dumps(main)
        assert "SUMMARY: the voyage so far" in text and "message 00" not in text
        assert size(main) <= BUDGET
    assert "where are we?" in json.dumps(requests[2])  # recent turns stay whole
    assert kept is not None and kept.text == "SUMMARY: the voyage so far"
    assert spent >= 940  # the summary's tokens count against the daily budget


@pytest.mark.usefixtures("on_both_engines")
async def test_with_the_model_away_for_the_summary_the_window_stays_as_before(
    state_dir: Path,
) -> None:
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        env = {"OPENAI_API_KEY": "sk-test"}
        async with running_bot(state_dir, llm_config(llm), environ=env) as bot:
            key = str(bot.channel.address())
            await bot.store.run(lambda tx: talk(tx, key))
            llm.error(500)  # the summary's request
            llm.reply("answered anyway")
            assert (await answer(bot, "where are we?")).text == "answered anyway"
            assert await bot.store.run(lambda tx: tx.summaries.of(key)) is None
            llm.reply("SUMMARY: later")  # the next turn tries again
            llm.reply("fine")
            await answer(bot, "again?")
            assert await bot.store.run(lambda tx: tx.summaries.of(key)) is not None
            await answer(bot, "/new")  # a fresh conversation: its summary goes
            assert await bot.store.run(lambda tx: tx.summaries.of(key)) is None
    first = llm.chat_requests()[1]
    assert "message 29" in json.dumps(first) and "message 00" not in json.dumps(first)


async def test_a_summary_cut_short_by_a_kill_is_made_again_and_kept_once(tmp_path: Path) -> None:
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        config = tmp_path / "config.toml"
        config.write_text(llm_config(llm))
        state = tmp_path / "state"
        args = ("chat", "--config", str(config), "--state-dir", str(state))
        env = echo_bot_env(OPENAI_API_KEY="sk-test")
        llm.reply("hello")
        first = EchoBotProcess(*args, env=env)
        try:
            first.send("hi")
            await asyncio.to_thread(first.expect_stdout, "hello", 30)
        finally:
            await asyncio.to_thread(first.kill9)
        await asyncio.to_thread(read_store, state, lambda tx: talk(tx, "cli:local"))
        llm.hang(60)  # the summary's request: the daemon is killed while it waits
        second = EchoBotProcess(*args, env=env)
        try:
            second.send("where are we?")
            await llm.wait_until(lambda: sum(map(is_summary, llm.chat_requests())) == 1, 30)
            await asyncio.to_thread(second.kill9)
        finally:
            second.cleanup()
        kept = await asyncio.to_thread(read_store, state, lambda tx: tx.summaries.of("cli:local"))
        assert kept is None  # nothing was kept of the summary cut short
        llm.reply("SUMMARY: made again after the kill")
        llm.reply("the answer after the restart")
        third = EchoBotProcess(*args, env=env)  # the turn is taken up again
        try:
            await asyncio.to_thread(third.expect_stdout, "the answer after the restart", 30)
        finally:
            third.cleanup()

    def read(tx: Tx) -> tuple[Summary | None, int]:
        audit = tx.audit.read(tail=500)
        made = sum(1 for row in audit if "summary of" in str(row.data.get("route_reason", "")))
        return tx.summaries.of("cli:local"), made

    kept, made = await asyncio.to_thread(read_store, state, read)
    assert kept is not None and kept.text == "SUMMARY: made again after the kill"
    assert made == 1  # kept once
    requests = llm.chat_requests()
    assert sum(map(is_summary, requests)) == 2  # asked again after the kill
    last = json.dumps(requests[-1])
    assert "SUMMARY: made again after the kill" in last and "where are we?" in last
