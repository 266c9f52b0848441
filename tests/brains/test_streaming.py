"""Replies that grow in the chat as the model writes them.

The real openai SDK reads server-sent events from the fake OpenAI server (which can
hold a stream half written); the real aiogram client sends drafts (private chats) and
edits (groups) to the fake Bot API, which counts them against Telegram's rate limits.
The final reply always goes through the outbox, once.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from channels.cli import CliChannel
from channels.telegram.previews import PREVIEW_MARK
from echo_bot.events import Address, OutboundMessage, TextFormat
from echo_bot.secrets import Masker
from tests.agent.test_agent import GateTool
from tests.channels.test_telegram import OWNER, reply_to, say, sends, telegram_bot, text_of
from tests.conftest import echo_bot_env, run_echo_bot
from tests.fakes.host import BareHost
from tests.fakes.openai_api import FakeOpenAI, Raw
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.waiting import eventually

MODEL = "gpt-test"
ANSWER = " ".join(f"word{i}" for i in range(120))  # ~900 characters, no Markdown in it


def llm_extra(llm: FakeOpenAI, openai: str = "") -> str:
    return (
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "{MODEL}"\ntimeout = "5s"\n'
        f'max_retries = 0\n{openai}\n[brain]\nkind = "openai"\n'
    )


async def test_a_streamed_reply_shows_drafts_then_one_final_message(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply(ANSWER)
        llm.stream_hold_after = 40  # about a third written
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "tell me a long story")
            await llm.wait_until(lambda: llm.stream_holding == 1)
            await api.wait_for_call("sendMessageDraft")
            assert sends(api, OWNER) == []  # nothing final while it is written
            llm.stream_release.set()
            final = await reply_to(api, message_id, "word119")
            assert final.params["text"] == ANSWER
        request = llm.chat_requests()[-1]
        assert request["stream"] is True
        drafts = [d for d in api.drafts if d["chat_id"] == OWNER]
        assert drafts and all(d["can_stop"] for d in drafts)
        assert len({d["draft_id"] for d in drafts}) == 1
        assert all(ANSWER.startswith(d["plain_text"]) for d in drafts)
        assert [c for c in sends(api, OWNER)] == [final]  # one message: the record
        assert api.rate_limited == 0


async def test_the_stop_button_ends_generation_with_what_was_written(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply(ANSWER)
        llm.stream_hold_after = 30
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "tell me a long story")
            await llm.wait_until(lambda: llm.stream_holding == 1)
            draft = await api.wait_for_call("sendMessageDraft")
            api.push_stop(OWNER, int(draft.params["draft_id"]))
            final = await reply_to(api, message_id, "(stopped)")
            llm.stream_release.set()  # the fake writes on and finds the connection closed
            await llm.wait_until(lambda: llm.streams_cut == 1)  # the model call was cut
        written = final.params["text"].removesuffix("\n\n(stopped)")
        assert written and ANSWER.startswith(written) and written != ANSWER
        assert len(sends(api, OWNER)) == 1


async def test_a_group_sees_one_message_edited_as_it_grows(state_dir: Path) -> None:
    group = -(10**12 + OWNER)
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply(ANSWER)
        llm.stream_hold_after = 40
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            say(api, "@echo_test_bot tell me a long story", chat_type="group")
            await llm.wait_until(lambda: llm.stream_holding == 1)
            preview = await api.wait_for_call("sendMessage", lambda c: c.ok)
            assert preview.params["text"].endswith("✍️")
            llm.stream_release.set()
            preview_id = int(preview.response["result"]["message_id"])  # type: ignore[index]
            await api.wait_for_call(
                "editMessageText",
                lambda c: c.ok and c.params["text"] == ANSWER,
                timeout=15,
            )
            state = api.message(group, preview_id)
            assert state is not None and state["plain_text"] == ANSWER
        assert len(sends(api, group)) == 1  # the preview became the reply
        assert api.drafts == [] and api.rate_limited == 0


async def test_streamed_tool_calls_are_assembled_before_anything_runs(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.stream_chunk_chars = 3
        llm.tool_calls([("current_time", {"timezone": "Europe/Berlin"})], text="Checking… ")
        llm.reply("It is late.")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "what time is it in Berlin?")
            await reply_to(api, message_id, "It is late.")
        second = llm.chat_requests()[-1]["messages"]
        call = next(m for m in second if m["role"] == "assistant")["tool_calls"][0]
        assert call["function"]["name"] == "current_time"
        assert json.loads(call["function"]["arguments"]) == {"timezone": "Europe/Berlin"}
        result = next(m for m in second if m["role"] == "tool")["content"]
        assert "Europe/Berlin" in result or "CET" in result or "+01" in result


async def test_streaming_can_be_switched_off(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply(ANSWER)
        async with telegram_bot(state_dir, llm_extra(llm, "stream = false")) as (_bot, api):
            message_id = say(api, "tell me a long story")
            await reply_to(api, message_id, "word119")
        assert "stream" not in llm.chat_requests()[-1]
        assert api.drafts == []


async def test_issue28_a_server_that_cannot_stream_is_answered_not_offline(
    tmp_path: Path,
) -> None:
    """Issue 28: a server that answers a streamed request with one JSON completion was
    taken for down, and every turn was answered offline. A real `echo-bot chat` with the
    default ``stream = true``: the model's answers, and the second request not streamed."""
    async with FakeOpenAI(model=MODEL) as llm:
        llm.can_stream = False
        llm.reply("Hello from the model.")
        llm.reply("Still the model.")
        config = tmp_path / "config.toml"
        config.write_text(llm_extra(llm))
        args = ("chat", "--config", str(config), "--state-dir", str(tmp_path / "st"))
        env = echo_bot_env(OPENAI_API_KEY="sk-test")
        result = await asyncio.to_thread(
            run_echo_bot, *args, input="hello\nand once more\n", env=env
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Hello from the model.", "Still the model."]
    first, second = llm.chat_requests()
    assert first["stream"] is True
    assert "stream" not in second and "stream_options" not in second
    assert "sent without streaming" in result.stderr


async def test_a_whole_json_answer_with_tool_calls_runs_them(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.can_stream = False
        llm.tool_calls([("current_time", {"timezone": "Europe/Berlin"})])
        llm.reply("It is late in Berlin.")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "what time is it in Berlin?")
            final = await reply_to(api, message_id, "It is late in Berlin.")
        assert final.params["text"] == "It is late in Berlin."
        first, second = llm.chat_requests()
        assert first["stream"] is True and "stream" not in second
        assert next(m for m in second["messages"] if m["role"] == "tool")["content"]


async def test_a_secret_never_shows_in_a_draft_even_in_part(state_dir: Path) -> None:
    secret = "tg-secret-value-0123456789"
    async with FakeOpenAI(model=MODEL) as llm:
        llm.stream_chunk_chars = 4
        llm.reply(f"The token is {secret} and that is all " + ANSWER)
        extra = llm_extra(llm) + '[[webhook.routes]]\nname = "x"\nauth = "bearer"\n'
        extra += 'secret_env = "HOOK_SECRET"\nprompt = "p"\n'
        environ = {"HOOK_SECRET": secret}
        async with telegram_bot(state_dir, extra, environ=environ) as (_bot, api):
            message_id = say(api, "what is the token?")
            final = await reply_to(api, message_id, "The token is")
        assert secret not in final.params["text"]
        for draft in api.drafts:
            text = draft["plain_text"]
            assert not any(secret[:n] in text for n in range(6, len(secret) + 1)), text


async def test_a_broken_stream_falls_back_and_nothing_crashes(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        bad = "data: {not json\n\n"
        broken = Raw(bad, headers={"Content-Type": "text/event-stream"})
        llm.enqueue(broken, broken)  # both steps of the turn (the clock's call, its answer)
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "what time is it?")
            await reply_to(api, message_id, "It is")  # the offline brain answered
            message_id = say(api, "and now?")
            await reply_to(api, message_id)


async def test_the_terminal_prints_a_reply_as_it_is_written_word_by_word() -> None:
    out = io.StringIO()
    channel = CliChannel(
        None, {"stdin": io.StringIO(), "stdout": out, "interactive": False}, BareHost()
    )
    here = Address(channel="cli", chat_id="local")
    await channel.show_preview(here, "turn1", "Hello")
    assert out.getvalue() == ""  # a word is printed once it is whole
    await channel.show_preview(here, "turn1", "Hello, wor")
    assert out.getvalue() == "Hello, "
    await channel.end_preview(here, "turn1")
    await channel.send(
        OutboundMessage(to=here, text="Hello, world.", metadata={"inbound_id": "turn1"})
    )
    assert out.getvalue() == "Hello, \nworld.\n"
    await channel.send(OutboundMessage(to=here, text="Next reply", metadata={"inbound_id": "t2"}))
    assert out.getvalue().endswith("world.\nNext reply\n")


async def test_attack_a_secret_in_markdown_disguise_never_shows_in_the_terminal_even_in_part() -> (
    None
):
    """The terminal prints Markdown as written; written as ``&amp;`` and ``**`` it would
    still read as the secret. The stream stops before it, the reply prints what the
    Markdown reads as, masked."""
    secret = "sk-pa&ss<word>-1234567890"
    disguised = "sk-pa&amp;ss&lt;word&gt;-12**345**67890"
    host = BareHost()
    host.masker = Masker([secret])
    out = io.StringIO()
    channel = CliChannel(None, {"stdin": io.StringIO(), "stdout": out, "interactive": False}, host)
    here = Address(channel="cli", chat_id="local")
    text = f"The key is {disguised} as asked."
    for end in range(1, len(text) + 1):
        await channel.show_preview(here, "turn1", text[:end])
    await channel.end_preview(here, "turn1")
    await channel.send(
        OutboundMessage(to=here, text=text, format=TextFormat.MARKDOWN,
                        metadata={"inbound_id": "turn1"})
    )  # fmt: skip
    shown = out.getvalue()
    assert "The key is *** as asked." in shown
    assert not any(part in shown for part in ("sk-pa", "&amp;ss", "12**345", "67890")), shown


async def test_stops_for_nothing_and_unreadable_updates_change_nothing(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("Short answer.")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            api.push_stop(OWNER, 12345)  # no such draft
            # Malformed (its chat has no type): aiogram cannot read it, nor its batch.
            api.push_update({"stopped_message_generation": {"chat": {"id": 1}, "draft_id": 0}})
            message_id = say(api, "hello")
            final = await reply_to(api, message_id, "Short answer.")
            assert "(stopped)" not in final.params["text"]


def bot_texts(api: FakeTelegramAPI, chat_id: int) -> list[str]:
    """What the chat shows now from the bot (after edits and deletions)."""
    shown = [api.message(chat_id, m["message_id"]) for m in api.sent_messages(chat_id)]
    return [m["plain_text"] for m in shown if m is not None]


def reply_in_place(api: FakeTelegramAPI, chat_id: int, text: str) -> bool:
    """The reply is shown and no preview message is left (edited into the reply or
    deleted)."""
    shown = bot_texts(api, chat_id)
    return text in shown and not any(t.endswith(PREVIEW_MARK.strip()) for t in shown)


async def test_a_quick_group_reply_leaves_no_preview_behind(state_dir: Path) -> None:
    group = -(10**12 + OWNER)
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("Sure!")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            say(api, "@echo_test_bot can you?", chat_type="group")
            await eventually(lambda: reply_in_place(api, group, "Sure!"), 10, "the reply alone")
            assert bot_texts(api, group) == ["Sure!"]


async def test_a_group_reply_over_two_steps_is_one_message(state_dir: Path) -> None:
    group = -(10**12 + OWNER)
    gate = GateTool()
    async with FakeOpenAI(model=MODEL) as llm:
        llm.tool_calls([("wait_gate", {})], text="Let me look that up. ")
        llm.reply(ANSWER)
        async with telegram_bot(state_dir, llm_extra(llm), tools=[gate]) as (_bot, api):
            say(api, "@echo_test_bot look it up", chat_type="group")
            await asyncio.wait_for(gate.entered.wait(), 10)
            await api.wait_for_call(
                "sendMessage", lambda c: c.ok and "Let me look" in c.params["text"]
            )
            gate.release.set()
            await eventually(lambda: reply_in_place(api, group, ANSWER), 15, "the reply alone")
            assert bot_texts(api, group) == [ANSWER]


async def test_a_stop_while_tools_run_ends_the_turn_before_its_next_step(
    state_dir: Path,
) -> None:
    gate = GateTool()
    async with FakeOpenAI(model=MODEL) as llm:
        llm.tool_calls([("wait_gate", {})], text="Let me look that up, this takes a while. ")
        llm.reply("never asked for")
        async with telegram_bot(state_dir, llm_extra(llm), tools=[gate]) as (_bot, api):
            message_id = say(api, "look it up")
            await asyncio.wait_for(gate.entered.wait(), 10)
            draft = await api.wait_for_call("sendMessageDraft")
            api.push_stop(OWNER, int(draft.params["draft_id"]))
            await api.wait_for_call("getUpdates", after=len(api.calls))  # the stop was read
            await api.wait_for_call("getUpdates", after=len(api.calls))
            gate.release.set()
            final = await reply_to(api, message_id, "(stopped)")
        assert final.params["text"] == "(stopped)"
        assert len(llm.chat_requests()) == 1  # no step after the stop


async def test_an_answer_the_server_cut_short_is_never_passed_off_as_whole(
    state_dir: Path,
) -> None:
    """A stream a proxy closed cleanly midway (no finish reason, no [DONE]) is no
    answer: the offline brain answers and says so. An answer the model ended at its
    length limit, or that the provider's filter stopped, says it was cut."""
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "delta": {"content": "Hello, the answer is"},
                          "finish_reason": None}]}  # fmt: skip
    cut = Raw(f"data: {json.dumps(chunk)}\n\n", headers={"Content-Type": "text/event-stream"})
    async with FakeOpenAI(model=MODEL) as llm:
        llm.enqueue(cut)
        llm.reply("Hello, the answer is", finish_reason="length")
        llm.reply("", finish_reason="content_filter")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            first = text_of(await reply_to(api, say(api, "hi there")))
            second = text_of(await reply_to(api, say(api, "and the answer?")))
            third = text_of(await reply_to(api, say(api, "and again?")))
    assert "offline" in first.lower() and "Hello, the answer is" not in first, first
    assert second.startswith("Hello, the answer is") and "cut off" in second, second
    assert third == "(the model provider's filter withheld this answer)", third
