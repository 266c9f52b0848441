"""The running summary (agent/runner.py ``_summarised``): once a conversation outgrows
[brain] context_chars, its oldest part is summarised by the model, kept as a checkpoint
(once, even when the turn is re-run after a kill), and the prompt carries the summary
and the recent messages within the budget; the model away: the window as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from echo_bot.conversation import ChatMessage
from echo_bot.events import DecisionVerb, OutboundMessage, approval_action
from echo_bot.store import Tx
from echo_bot.store.summaries import Summary
from tests.conftest import Bot, echo_bot_env, read_store, running_bot
from tests.fakes.openai_api import FakeOpenAI, Reply
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
            usage = {"prompt_tokens": 900, "completion_tokens": 40}
            llm.answer_first = lambda body: (
                Reply("SUMMARY: the voyage so far", usage=usage) if is_summary(body) else None
            )
            llm.reply("first answer")
            assert (await answer(bot, "where are we?")).text == "first answer"
            first_turn = len(llm.chat_requests())
            llm.reply("second answer")
            assert (await answer(bot, "and now?")).text == "second answer"
            kept = await bot.store.run(lambda tx: tx.summaries.of(key))
            spent = await bot.store.run(lambda tx: tx.audit.tokens_since(0))
    requests = llm.chat_requests()
    summaries = [r for r in requests if is_summary(r)]
    assert [is_summary(r) for r in requests[first_turn - 1 :]] == [False, False]  # made once
    # The oldest part is summarised, page by page, each within the budget; the newest
    # messages that fit half the budget stay.
    summarised = json.dumps(summaries)
    assert "message 00" in summarised and "message 29" not in summarised
    assert all(size(r) <= BUDGET + 500 for r in summaries)  # and the summary prompt
    assert "message 29" in json.dumps(requests[first_turn - 1])
    for main in requests[first_turn - 1 :]:
        text = json.dumps(main)
        assert "SUMMARY: the voyage so far" in text and "message 00" not in text
        assert size(main) <= BUDGET
    assert "where are we?" in json.dumps(requests[-1])  # recent turns stay whole
    assert kept is not None and kept.text == "SUMMARY: the voyage so far"
    assert spent >= 940 * len(summaries)  # the summaries' tokens count against the budget


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
        llm.answer_first = lambda body: (
            Reply("SUMMARY: made again after the kill") if is_summary(body) else None
        )
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
    requests = llm.chat_requests()
    again = sum(map(is_summary, requests)) - 1  # asked again after the kill, page by page
    assert again >= 1 and made == again  # each page kept once
    last = json.dumps(requests[-1])
    assert "SUMMARY: made again after the kill" in last and "where are we?" in last


def chat_of(count: int, words: str = "") -> Callable[[Tx, str], None]:
    def write(tx: Tx, key: str) -> None:
        for n in range(count):
            said = f"m{n:03d}{words}"
            message = ChatMessage(role="assistant" if n % 2 else "user", content=said)
            tx.turns.append_message(key, f"t{n}", message)

    return write


def said_in(request: dict[str, object], count: int) -> set[int]:
    text = json.dumps(request)
    return {n for n in range(count) if f"m{n:03d}" in text}


async def test_messages_beyond_the_loaded_window_reach_the_summary(state_dir: Path) -> None:
    """250 short messages fit the budget, but a turn loads only the newest 200: the 50
    before them went into neither the summary nor the prompt. They are summarised, with
    the older half of the window, and the prompt carries the rest."""
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        env = {"OPENAI_API_KEY": "sk-test"}
        config = llm_config(llm).replace(f"context_chars = {BUDGET}", "context_chars = 100000")
        async with running_bot(state_dir, config, environ=env) as bot:
            key = str(bot.channel.address())
            await bot.store.run(lambda tx: chat_of(250)(tx, key))
            llm.answer_first = lambda body: Reply("SUMMARY: so far") if is_summary(body) else None
            llm.reply("answered")
            assert (await answer(bot, "where are we?")).text == "answered"
            kept = await bot.store.run(lambda tx: tx.summaries.of(key))
    summaries = [r for r in llm.chat_requests() if is_summary(r)]
    main = [r for r in llm.chat_requests() if not is_summary(r)]
    assert len(summaries) == 1 and len(main) == 1
    summarised, shown = said_in(summaries[0], 250), said_in(main[0], 250)
    assert summarised | shown == set(range(250))  # every message reaches the model once
    assert not summarised & shown and 0 in summarised and 249 in shown
    assert "SUMMARY: so far" in json.dumps(main[0]) and kept is not None


async def test_a_long_unsummarised_stretch_is_summarised_page_by_page_over_turns(
    state_dir: Path,
) -> None:
    """Each summary request stays within the budget; a stretch too long for one turn's
    requests is caught up at the next turns, every message summarised exactly once."""
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        env = {"OPENAI_API_KEY": "sk-test"}
        async with running_bot(state_dir, llm_config(llm), environ=env) as bot:
            key = str(bot.channel.address())
            await bot.store.run(lambda tx: chat_of(400, " of the long voyage")(tx, key))
            made = iter(range(1000))
            llm.answer_first = lambda body: (
                Reply(f"SUMMARY {next(made)}") if is_summary(body) else None
            )
            for n in range(6):
                llm.reply(f"answer {n}")
                assert (await answer(bot, f"question {n}")).text == f"answer {n}"
    requests = llm.chat_requests()
    summaries = [r for r in requests if is_summary(r)]
    assert 3 < len(summaries) <= 6 * 3  # not all in the first turn, never more than 3 a turn
    seen: list[int] = []
    for request in summaries:
        assert size(request) <= 3 * BUDGET  # a page (2 budgets), the summary so far, the prompt
        seen += sorted(said_in(request, 400))
    # Each message summarised once, oldest first: no gap, nothing twice.
    assert seen == list(range(len(seen))) and len(seen) > 300
    assert said_in(requests[-1], 400) == set(range(len(seen), 400))  # the rest, whole


async def test_a_call_waiting_for_approval_is_never_summarised_away(state_dir: Path) -> None:
    """While turn A's call waits for its approval, the chat goes on and outgrows the
    budget: the summary stops before A's messages. Before, it took A's tool-call message,
    and once approved, A's result came back to the model without its call (dropped), so
    the model never saw that the write was done."""
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        env = {"OPENAI_API_KEY": "sk-test"}
        config = llm_config(llm) + '[tools]\nprofile = "coding"\n'
        async with running_bot(state_dir, config, environ=env) as bot:
            llm.answer_first = lambda body: Reply("SUMMARY: chat") if is_summary(body) else None
            for n in range(3):  # before it: what a summary may take
                llm.reply(f"earlier {n} " + "and so on " * 20)
                await answer(bot, f"at first {n}? " + "tell me more " * 20)
            write = {"path": "note.txt", "content": "x"}
            llm.tool_calls([("file_write", write, "call_w")])
            first = await bot.channel.say("please write the note")
            prompt = await bot.channel.prompt_for(first)
            for n in range(8):  # the chat goes on meanwhile, past the budget
                llm.reply(f"meanwhile {n} " + "and so on " * 20)
                said = await answer(bot, f"and now {n}? " + "tell me more " * 20)
                assert said.text.startswith(f"meanwhile {n}")
            assert prompt.approval is not None
            llm.reply("the note is written")
            await bot.channel.press(
                approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
            )
            assert (await bot.channel.reply_to(first)).text == "the note is written"
    summaries = [json.dumps(r) for r in llm.chat_requests() if is_summary(r)]
    assert summaries and not any("please write the note" in text for text in summaries)
    last = llm.chat_requests()[-1]["messages"]
    calls = [m for m in last if m["role"] == "assistant" and m.get("tool_calls")]
    results = [m for m in last if m["role"] == "tool"]
    assert [c["tool_calls"][0]["id"] for c in calls] == ["call_w"]
    assert [r["tool_call_id"] for r in results] == ["call_w"]
    assert "Wrote" in results[0]["content"] or "note.txt" in results[0]["content"]
