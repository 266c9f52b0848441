"""/model and /new: a chat switches between the models the config offers, and starts a
fresh conversation; both hold after the daemon is killed (SIGKILL) and started again, a
real process on a real store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from echo_bot.brains.openai_brain import OpenAIBrain
from echo_bot.config import BrainConfig, OpenAIConfig
from echo_bot.conversation import BrainContext
from echo_bot.events import Address, Sender
from tests.conftest import echo_bot_env
from tests.fakes.openai_api import FakeOpenAI
from tests.proc import EchoBotProcess


def config(llm: FakeOpenAI) -> str:
    return (
        f'[brain]\nkind = "openai"\n[openai]\nbase_url = "{llm.base_url}"\n'
        'model = "gpt-a"\nmodels = ["gpt-b"]\nmax_retries = 0\nstream = false\n'
    )


async def expect(proc: EchoBotProcess, pattern: str) -> str:
    return await asyncio.to_thread(proc.expect_stdout, pattern, 30)


async def test_the_chosen_model_and_a_fresh_conversation_survive_a_kill(tmp_path: Path) -> None:
    async with FakeOpenAI(model="gpt-a", api_key="sk-test") as llm:
        path = tmp_path / "config.toml"
        path.write_text(config(llm))
        args = ("chat", "--config", str(path), "--state-dir", str(tmp_path / "state"))
        env = echo_bot_env(OPENAI_API_KEY="sk-test")
        first = EchoBotProcess(*args, env=env)
        try:
            llm.reply("about the secret garden")
            first.send("tell me about the secret garden")
            await expect(first, "about the secret garden")
            first.send("/model")
            await expect(first, r"thinks with gpt-a \(the default\)\. Also offered: gpt-b")
            first.send("/model gpt-x")
            await expect(first, "'gpt-x' is not offered here: choose one of gpt-a, gpt-b")
            first.send("/model gpt-b")
            await expect(first, "now thinks with gpt-b")
            first.send("/new")
            await expect(first, "Started a fresh conversation. The earlier one stays")
            await asyncio.to_thread(first.kill9)
        finally:
            first.cleanup()
        second = EchoBotProcess(*args, env=env)
        try:
            llm.reply("hello again")
            second.send("hi")
            await expect(second, "hello again")
            second.send("/model default")
            await expect(second, "now thinks with gpt-a")
            llm.reply("back to a")
            second.send("and now?")
            await expect(second, "back to a")
        finally:
            second.cleanup()
    requests = llm.chat_requests()
    assert [r["model"] for r in requests] == ["gpt-a", "gpt-b", "gpt-a"]
    after_new = " ".join(str(m.get("content")) for m in requests[1]["messages"])
    assert "secret garden" not in after_new  # /new held across the kill


async def test_after_new_the_running_daemon_sends_none_of_the_earlier_conversation(
    tmp_path: Path,
) -> None:
    """The daemon keeps each chat's history in memory and never reads it back:
    /new must still empty it at once, not only after a restart."""
    async with FakeOpenAI(model="gpt-a", api_key="sk-test") as llm:
        path = tmp_path / "config.toml"
        path.write_text(config(llm))
        args = ("chat", "--config", str(path), "--state-dir", str(tmp_path / "state"))
        bot = EchoBotProcess(*args, env=echo_bot_env(OPENAI_API_KEY="sk-test"))
        try:
            for question, answer in [
                ("the secret garden?", "a garden"),
                ("and its gate?", "a gate"),
            ]:
                llm.reply(answer)
                bot.send(question)
                await expect(bot, answer)
            bot.send("/new")
            await expect(bot, "Started a fresh conversation")
            llm.reply("hello again")
            bot.send("hi")
            await expect(bot, "hello again")
        finally:
            bot.cleanup()
    requests = llm.chat_requests()
    said = [" ".join(str(m.get("content")) for m in r["messages"]) for r in requests]
    assert "the secret garden?" in said[1]  # the history is carried before /new
    assert "secret garden" not in said[2] and "gate" not in said[2]
    assert "hi" in said[2]


def test_a_choice_the_config_no_longer_offers_falls_back_to_the_default() -> None:
    brain = OpenAIBrain(OpenAIConfig(model="gpt-a", models=["gpt-b"]), BrainConfig(), "sk-x")
    chat = Address(channel="cli", chat_id="local")

    def context(model: str | None) -> BrainContext:
        return BrainContext("t", "cli:local", chat, Sender(id="owner"), 0, model=model)

    assert brain.model_for(context("gpt-b")) == "gpt-b"
    assert brain.model_for(context("gpt-gone")) == "gpt-a"  # [openai] models changed since
    assert brain.model_for(context(None)) == "gpt-a"
