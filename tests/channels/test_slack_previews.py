"""A reply that grows in Slack as the model writes it: the real openai SDK streams from
the fake OpenAI server (held half written as long as the test needs), the bot posts one
message and updates it (``chat.update``) as it grows, and the reply takes that
message's place: the conversation holds one message from the bot, the whole answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from echo_bot.chat_sends import PREVIEW_MARK
from tests.channels.contract.drivers import SLACK_DM, SlackDriver
from tests.fakes.openai_api import FakeOpenAI
from tests.waiting import eventually

MODEL = "gpt-test"
ANSWER = " ".join(f"word{i}" for i in range(120))  # ~900 characters, no Markdown in it


@pytest.fixture
async def streaming(state_dir: Path) -> AsyncIterator[tuple[SlackDriver, FakeOpenAI]]:
    async with FakeOpenAI(model=MODEL) as llm:
        made = SlackDriver(state_dir)
        made.brain = None  # the config's: the openai SDK against the fake server
        made.extra = (
            f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "{MODEL}"\ntimeout = "5s"\n'
            'max_retries = 0\n[brain]\nkind = "openai"\n'
        )
        async with made.peer():
            yield made, llm


async def test_a_streamed_reply_grows_in_one_message_that_becomes_the_reply(
    streaming: tuple[SlackDriver, FakeOpenAI],
) -> None:
    chat, llm = streaming
    llm.reply(ANSWER)
    llm.stream_hold_after = 40  # about a third written
    async with chat.running():
        await chat.say("tell me a long story")
        await llm.wait_until(lambda: llm.stream_holding == 1, timeout=30)
        preview = await eventually(lambda: chat.sent()[0] if chat.sent() else None,
                                   timeout=15, what="the preview message")  # fmt: skip
        shown = preview["text"]
        assert shown.endswith(PREVIEW_MARK)
        written = shown.removesuffix(PREVIEW_MARK)
        assert written and ANSWER.startswith(written) and written != ANSWER
        llm.stream_release.set()
        await eventually(lambda: chat.slack.message(SLACK_DM, preview["ts"])["text"] == ANSWER,
                         timeout=20, what="the reply in place")  # fmt: skip
    assert [m["ts"] for m in chat.sent()] == [preview["ts"]]  # one message: the reply
    edits = [u["text"] for u in chat.slack.updates if u["ts"] == preview["ts"]]
    assert edits[-1] == ANSWER
    assert all(ANSWER.startswith(e.removesuffix(PREVIEW_MARK)) for e in edits)
    assert chat.slack.rate_limited == 0
