"""/history and `echo-bot history CHAT`: what the model reads of a chat now — the same
selection its prompt makes within [brain] context_chars, the chat's notes counted —
and, with the offline rules brain, how much the conversation holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from echo_bot.conversation import ChatMessage
from echo_bot.events import OutboundMessage
from echo_bot.store import Tx
from tests.conftest import Bot, echo_bot_env, running_bot
from tests.fakes.openai_api import FakeOpenAI, Reply
from tests.test_summary import is_summary

pytestmark = pytest.mark.usefixtures("on_both_engines")


def llm_config(llm: FakeOpenAI) -> str:
    return (
        f'[brain]\nkind = "openai"\ncontext_chars = 2000\n[openai]\nbase_url = "{llm.base_url}"\n'
        'model = "gpt-test"\nmax_retries = 0\nstream = false\n'
    )


def talk(tx: Tx, key: str) -> None:
    for n in range(40):
        said = f"message {n:02d} " + "about the long voyage " * 4
        message = ChatMessage(role="user" if n % 2 == 0 else "assistant", content=said)
        tx.turns.append_message(key, f"t{n}", message)
    tx.memory.save(key, "the captain is called Ahab", "owner")


async def answer(bot: Bot, text: str) -> OutboundMessage:
    inbound = await bot.channel.say(text)
    return await bot.channel.wait_for(
        lambda m: m.kind == "reply" and m.metadata.get("inbound_id") == inbound
    )


async def test_history_shows_the_newest_messages_the_prompt_carries(state_dir: Path) -> None:
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        env = {"OPENAI_API_KEY": "sk-test"}
        async with running_bot(state_dir, llm_config(llm), environ=env) as bot:
            key = str(bot.channel.address())
            await bot.store.run(lambda tx: talk(tx, key))
            shown = (await answer(bot, "/history")).text
            llm.answer_first = lambda body: (  # over budget: summarised
                Reply("SUMMARY: a long voyage, forty messages of it") if is_summary(body) else None
            )
            llm.reply("aye")
            await answer(bot, "and now?")
            after = (await answer(bot, "/history")).text
    head = shown.splitlines()[0]
    assert head.startswith("The model reads ") and "of the 41 messages since the last /new" in head
    assert "of 2,000 characters" in head and "1 memory note(s)" in head
    assert "message 39" in shown and "message 00" not in shown  # the oldest fell out
    *summary_requests, main = llm.chat_requests()
    assert summary_requests and all(map(is_summary, summary_requests))
    summarised = " ".join(str(r["messages"][1]["content"]) for r in summary_requests)
    assert "message 00" in summarised and "message 30" in summarised  # three pages of it
    prompt = " ".join(str(m.get("content")) for m in main["messages"])
    assert "message 00" not in prompt and "Ahab" in prompt and "and now?" in prompt
    assert "SUMMARY: a long voyage" in prompt
    assert sum(len(json.dumps(m, ensure_ascii=False)) for m in main["messages"]) <= 2000
    assert "and a summary of the earlier ones" in after.splitlines()[0]
    in_view = int(head.split()[3])
    oldest_shown = min(int(line.split()[2]) for line in shown.splitlines() if "message " in line)
    assert oldest_shown == 40 - (in_view - 1)  # the view: /history itself, then the newest


async def test_with_the_rules_brain_it_says_no_model_reads_it(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        await answer(bot, "hello")
        text = (await answer(bot, "/history")).text
    assert text.startswith("No model here") and "holds 3 message(s)" in text


def test_the_shell_shows_every_line_of_a_chats_view(state_dir: Path, on_both_engines: str) -> None:
    if on_both_engines == "postgres":
        pytest.skip("the shell's store is SQLite here; both engines are covered above")
    config = state_dir.parent / "llm.toml"
    config.write_text(
        '[brain]\nkind = "openai"\ncontext_chars = 2000\n[openai]\n'
        'base_url = "http://127.0.0.1:9/v1"\n'
    )
    said = subprocess.run(
        [sys.executable, "-m", "echo_bot", "chat", "--state-dir", str(state_dir)],
        input="remember that the ship is the Pequod\n", capture_output=True, text=True,
        env=echo_bot_env(), timeout=60,
    )  # fmt: skip
    assert "Noted (" in said.stdout, said.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "echo_bot", "history", "cli:local", "--config", str(config),
         "--state-dir", str(state_dir)],
        capture_output=True, text=True, env=echo_bot_env(), timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert (
        lines[0].startswith("The model reads 3 of the 3 messages") and "1 memory note" in lines[0]
    )
    assert lines[1] == "you: remember that the ship is the Pequod"
    assert lines[2] == "bot: (calls memory_save)"
    assert lines[3].startswith("tool result: Noted (") and lines[4].startswith("bot: Noted (")
    for wrong, said_back in (("cli", "not of the form"), ("telegarm:1", "no channel 'telegarm'")):
        refused = subprocess.run(
            [sys.executable, "-m", "echo_bot", "history", wrong, "--state-dir", str(state_dir)],
            capture_output=True, text=True, env=echo_bot_env(), timeout=60,
        )  # fmt: skip  # it said "0 message(s)", as of a chat with nothing in it
        assert refused.returncode == 2 and said_back in refused.stderr, refused.stderr
