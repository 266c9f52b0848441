"""A reply that grows in the room as the model writes it, on a real Synapse in an
encrypted room: the real openai SDK streams from the fake OpenAI server (held half
written as long as the test needs), the bot sends one message and edits it
(``m.replace``) as it grows, and the reply takes that message's place: the owner's
timeline holds one message from the bot, its last edit the whole answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from echo_bot.chat_sends import PREVIEW_MARK
from tests.channels.test_matrix import Chat
from tests.fakes.openai_api import FakeOpenAI
from tests.matrix_server import Synapse
from tests.waiting import eventually

MODEL = "gpt-test"
ANSWER = " ".join(f"word{i}" for i in range(120))  # ~900 characters, no Markdown in it


@pytest.fixture
async def streaming(synapse: Synapse, state_dir: Path) -> AsyncIterator[tuple[Chat, FakeOpenAI]]:
    async with FakeOpenAI(model=MODEL) as llm:
        made = Chat(state_dir, synapse)
        made.brain = None  # the config's: the openai SDK against the fake server
        made.extra = (
            f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "{MODEL}"\ntimeout = "5s"\n'
            'max_retries = 0\n[brain]\nkind = "openai"\n'
        )
        async with made.peer():
            yield made, llm


def edits_of(chat: Chat, event_id: str) -> list[str]:
    """The bodies of the bot's edits (``m.replace``) of ``event_id``, in order."""
    found = []
    for _room, event in chat.owner.seen:
        content = event.source.get("content", {})
        relation = content.get("m.relates_to") or {}
        if relation.get("rel_type") == "m.replace" and relation.get("event_id") == event_id:
            found.append(str(content.get("m.new_content", {}).get("body", "")))
    return found


async def test_a_streamed_reply_grows_in_one_message_that_becomes_the_reply(
    streaming: tuple[Chat, FakeOpenAI],
) -> None:
    chat, llm = streaming
    llm.reply(ANSWER)
    llm.stream_hold_after = 40  # about a third written
    async with chat.running():
        await chat.say("tell me a long story")
        await llm.wait_until(lambda: llm.stream_holding == 1, timeout=30)

        def preview() -> tuple[str, str] | None:
            sent = chat.owner.received_events(chat.room_id, chat.bot_id)
            return sent[0] if sent else None

        preview_id, shown = await eventually(preview, timeout=15, what="the preview message")
        assert shown.endswith(PREVIEW_MARK)
        written = shown.removesuffix(PREVIEW_MARK)
        assert written and ANSWER.startswith(written) and written != ANSWER
        llm.stream_release.set()

        await eventually(
            lambda: ANSWER in edits_of(chat, preview_id), timeout=20, what="the reply in place"
        )
        assert llm.chat_requests()[-1]["stream"] is True
        # One message from the bot: the preview became the reply; every edit a prefix.
        assert [e for e, _ in chat.owner.received_events(chat.room_id, chat.bot_id)] == [preview_id]
        edits = edits_of(chat, preview_id)
        assert edits[-1] == ANSWER
        assert all(ANSWER.startswith(e.removesuffix(PREVIEW_MARK)) for e in edits)
        assert chat.bot is not None
        health = next(c for c in chat.bot.daemon.channels if c.name == "matrix").health()
        assert health.get("rate_limited", 0) == 0


async def test_a_reply_written_without_streaming_is_one_message(
    streaming: tuple[Chat, FakeOpenAI],
) -> None:
    chat, llm = streaming
    llm.reply("short and whole")
    chat.extra = chat.extra.replace("max_retries = 0\n", "max_retries = 0\nstream = false\n")
    async with chat.running():
        await chat.say("hello")
        await chat.wait_received("short and whole")
        [(event_id, body)] = chat.owner.received_events(chat.room_id, chat.bot_id)
        assert body == "short and whole"
        assert edits_of(chat, event_id) == []  # no preview: nothing edited
