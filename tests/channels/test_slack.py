"""The Slack channel against the fake Slack (tests/fakes/slack_api.py), which the real
slack-sdk talks to over HTTP and WebSocket, for what the contract suite does not cover:
approvals by button (a forged or replayed press refused), redelivered envelopes, threads,
a paced burst, mrkdwn, strangers, hostile payloads and files both ways.

The owner (an approver) and a friend (allowed to chat) write in direct messages; the
daemon runs in Socket Mode (tests/channels/test_slack_http.py has the HTTP mode)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import new_id
from echo_bot.tools.base import Tool
from tests.channels.contract.drivers import (
    SLACK_DM,
    SLACK_OWNER,
    ChatBrain,
    SlackDriver,
    slack_shown,
)
from tests.fakes.slack_api import FakeSlack
from tests.waiting import eventually

HOSTILE_MARKDOWN = (
    "**bold** and `code` <!channel> <@U0FRIEND> & <https://evil.example|innocent>\n\n"
    "[click](javascript:alert(1)) [ok](https://example.org/a?b=1&c=2)"
)


class SlackBrain(ChatBrain):
    MARKDOWN = HOSTILE_MARKDOWN


class Chat(SlackDriver):
    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.brain = SlackBrain()

    @property
    def fake(self) -> FakeSlack:
        assert self.slack is not None
        return self.slack  # type: ignore[no-any-return]

    def replies(self, channel: str = SLACK_DM) -> list[str]:
        return [slack_shown(m) for m in self.sent(channel)]


@pytest.fixture
async def chat(state_dir: Path) -> AsyncIterator[Chat]:
    made = Chat(state_dir)
    async with made.peer():
        yield made


async def test_the_owners_press_approves_and_the_prompt_shows_who_decided(chat: Chat) -> None:
    async with chat.running():
        await chat.say("run:pressed")
        shown = await chat.prompt()
        ts, ids = shown.handle
        assert [a.split(":", 1)[0] for a in ids] == ["approve_once", "deny"]
        prompt = chat.fake.message(SLACK_DM, ts)
        assert prompt is not None
        [actions] = [b for b in prompt["blocks"] if b["type"] == "actions"]
        assert [e["style"] for e in actions["elements"]] == ["primary", "danger"]
        assert "```" in prompt["blocks"][0]["text"]["text"]  # the call in a code block
        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: pressed")
        assert (chat.state_dir / "workspace" / "contract.txt").exists()

        def edited() -> str | None:
            message = chat.fake.message(SLACK_DM, ts)
            if message is None or any(b["type"] == "actions" for b in message["blocks"]):
                return None
            return slack_shown(message)

        outcome = await eventually(edited, timeout=15, what="the prompt updated")
        assert "Approved" in outcome and SLACK_OWNER in outcome, outcome


async def test_a_forged_press_is_refused_and_a_replayed_one_changes_nothing(chat: Chat) -> None:
    async with chat.running():
        await chat.say("say:first")
        await chat.wait_received("echo: first")
        reply_ts = chat.sent()[-1]["ts"]
        await chat.say("run:once")
        shown = await chat.prompt()
        ts, ids = shown.handle
        approve = next(a for a in ids if a.startswith("approve_once:"))
        forged_id = "approve_once:" + "f" * 32
        # An action the prompt does not carry, and a real one on a message that is no prompt.
        for message_ts, action in ((ts, forged_id), (reply_ts, approve)):
            envelope = await chat.fake.push_action(
                channel=SLACK_DM, message_ts=message_ts, action_id=action, user=SLACK_OWNER
            )
            await chat.fake.wait_acked(envelope)
        await eventually(
            lambda: sum("not one this request offers" in t for t in chat.replies()) == 2,
            timeout=15, what="both forged presses refused",
        )  # fmt: skip
        assert not (chat.state_dir / "workspace" / "contract.txt").exists()
        assert "ran: once" not in chat.replies()

        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: once")
        envelope = await chat.fake.push_action(
            channel=SLACK_DM, message_ts=ts, action_id=approve, user=SLACK_OWNER
        )  # the same press again, a second later
        await chat.fake.wait_acked(envelope)
        await eventually(
            lambda: any("already" in t.lower() for t in chat.replies()),
            timeout=15, what="the replayed press answered",
        )  # fmt: skip
        await asyncio.sleep(0.5)
        assert chat.replies().count("ran: once") == 1


async def test_a_redelivered_envelope_is_taken_once(chat: Chat) -> None:
    async with chat.running():
        first = await chat.say("say:again")
        await chat.fake.wait_acked(first)
        second = await chat.fake.redeliver(first)  # Slack did not see the ack in time
        await chat.fake.wait_acked(second)
        assert second.envelope_id != first.envelope_id and second.retry_attempt == 1
        await chat.wait_received("echo: again")
        await chat.say("say:after")
        await chat.wait_received("echo: after")
        assert chat.replies().count("echo: again") == 1
        assert sum("say:again" in t for t in await chat.inbound_texts()) == 1


async def test_a_mention_is_answered_where_it_was_made_its_thread_or_the_channel(
    chat: Chat,
) -> None:
    async with chat.running():
        top = await chat.fake.push_mention("say:top", user=SLACK_OWNER, channel="C0GENERAL")
        await eventually(lambda: "echo: top" in chat.replies("C0GENERAL"), timeout=15,
                         what="the answer in the channel")  # fmt: skip
        parent = top.payload["event"]["ts"]
        await chat.fake.push_mention(
            "say:inside", user=SLACK_OWNER, channel="C0GENERAL", thread_ts=parent
        )
        await eventually(lambda: "echo: inside" in chat.replies("C0GENERAL"), timeout=15,
                         what="the answer in the thread")  # fmt: skip
        by_text = {slack_shown(m): m for m in chat.sent("C0GENERAL")}
        assert by_text["echo: top"].get("thread_ts") is None
        assert by_text["echo: inside"]["thread_ts"] == parent
        # A thread is a conversation of its own.
        sessions = {s.session_key for s in await chat.bot.store.run(  # type: ignore[union-attr]
            lambda tx: tx.inbox.recent("slack", limit=10))}  # fmt: skip
        assert {"slack:C0GENERAL", f"slack:C0GENERAL:{parent}"} <= sessions


async def test_the_agent_reads_what_the_person_typed_not_slacks_markup(chat: Chat) -> None:
    """Slack sends ``&``, ``<`` and ``>`` escaped and links and mentions as markup: the
    agent reads them as typed (a shell line with ``>`` and ``&&`` stays one)."""
    wire = (
        "say:run `echo a &gt; out.txt &amp;&amp; cat &lt;in.txt` see"
        " <https://example.org/x?a=1&amp;b=2> and <https://example.org/y|the docs>,"
        " ask <@U0FRIEND> in <#C0GENERAL|general> <!here> <mailto:a@example.org|a@example.org>"
    )
    async with chat.running():
        await chat.fake.push_message(wire, user=SLACK_OWNER, channel=SLACK_DM)
        await chat.wait_received("echo: run")
        texts = await chat.inbound_texts()
    assert texts[-1] == (
        "say:run `echo a > out.txt && cat <in.txt` see https://example.org/x?a=1&b=2 and"
        " the docs (https://example.org/y), ask @U0FRIEND in #general @here a@example.org"
    )


async def test_channel_messages_without_a_mention_and_other_channels_are_left_alone(
    chat: Chat,
) -> None:
    chat.slack_keys = 'channels = ["C0ALLOWED"]'
    async with chat.running():
        await chat.fake.push_message(
            "say:unmentioned", user=SLACK_OWNER, channel="C0ALLOWED", channel_type="channel"
        )
        await chat.fake.push_mention("say:elsewhere", user=SLACK_OWNER, channel="C0GENERAL")
        await chat.fake.push_mention("say:here", user=SLACK_OWNER, channel="C0ALLOWED")
        await eventually(lambda: "echo: here" in chat.replies("C0ALLOWED"), timeout=15,
                         what="the mention in the allowed channel answered")  # fmt: skip
        assert chat.replies("C0ALLOWED") == ["echo: here"]
        assert chat.replies("C0GENERAL") == []
        texts = await chat.inbound_texts()
        assert not any("unmentioned" in t or "elsewhere" in t for t in texts)


async def test_a_burst_is_paced_without_a_429_reaching_anyone(chat: Chat) -> None:
    chat.fake.rate_limit("chat.postMessage", per_second=1.0, burst=3)
    words = [f"w{n}" for n in range(8)]
    async with chat.running():
        for word in words:
            await chat.say(f"say:{word}")
        received = await chat.wait_received(*(f"echo: {w}" for w in words))
        await asyncio.sleep(0)
    assert [t for t in received if t.startswith("echo: ")] == [f"echo: {w}" for w in words]
    assert chat.fake.rate_limited == 0


async def test_markdown_becomes_mrkdwn_and_no_mention_or_hidden_link_gets_through(
    chat: Chat,
) -> None:
    async with chat.running():
        await chat.say("md: please")
        await chat.wait_received("bold")
        [text] = [m["text"] for m in chat.sent() if "bold" in m["text"]]
    assert text.startswith("*bold* and `code`")
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "<@U0FRIEND>" not in text and "&lt;@U0FRIEND&gt;" in text
    assert "<https://evil.example|innocent>" not in text
    assert "javascript:" not in text.replace("[click](javascript:alert(1))", "")
    assert "<https://example.org/a?b=1&amp;c=2|ok>" in text


async def test_a_stranger_is_told_their_id_once_and_can_pair(chat: Chat) -> None:
    stranger = "U0STRANGER"
    dm = chat.fake.dm_channel(stranger)
    async with chat.running():
        for _ in range(2):
            await chat.fake.push_message("say:hello", user=stranger, channel=dm)
        await eventually(lambda: chat.replies(dm), timeout=15, what="the refusal")
        await asyncio.sleep(0.5)
        [refusal] = chat.replies(dm)
        assert stranger in refusal and "allowed_users" in refusal
        assert not any("say:hello" in t for t in await chat.inbound_texts())
        assert chat.bot is not None
        code = await chat.bot.store.run(lambda tx: tx.access.new_pairing_code())
        await chat.fake.push_message(f"pair {code}", user=stranger, channel=dm)
        await eventually(lambda: any("Paired" in t for t in chat.replies(dm)), timeout=15,
                         what="paired")  # fmt: skip
        await chat.fake.push_message("say:paired", user=stranger, channel=dm)
        await eventually(lambda: "echo: paired" in chat.replies(dm), timeout=15,
                         what="the paired stranger answered")  # fmt: skip


async def test_hostile_payloads_neither_crash_nor_block_what_comes_after(chat: Chat) -> None:
    ts = "1700000000.000001"
    hostile: list[dict[str, Any]] = [
        {"type": "message", "channel": SLACK_DM, "channel_type": "im"},  # no user, no ts
        {"type": "message", "user": SLACK_OWNER, "channel": SLACK_DM, "channel_type": "im",
         "ts": ts, "text": {"not": "a string"}},
        {"type": "message", "user": SLACK_OWNER, "channel": "../../etc", "channel_type": "im",
         "ts": ts, "text": "x"},
        {"type": "message", "user": SLACK_OWNER, "channel": SLACK_DM, "channel_type": "im",
         "ts": "not-a-ts", "text": "x"},
        {"type": "message", "user": SLACK_OWNER, "channel": SLACK_DM, "channel_type": "im",
         "ts": ts, "text": "x", "files": "not a list", "subtype": "file_share"},
        {"type": "reaction_added", "user": SLACK_OWNER, "reaction": "+1"},
        {"type": "app_mention", "user": SLACK_OWNER, "channel": SLACK_DM, "ts": ts, "text": "x"},
    ]  # fmt: skip
    async with chat.running():
        for event in hostile:
            envelope = await chat.fake.push_event(event)
            await chat.fake.wait_acked(envelope)
        big = "heard: " + "\ud800 \x00 " + "y" * 60_000
        await chat.say(big)
        await chat.wait_received("heard")
        await chat.say("say:still")
        await chat.wait_received("echo: still")
    # Slack's own limit (40,000 characters) kept, a lone surrogate replaced, NUL dropped.
    assert [t for t in chat.replies() if t.startswith("heard")] == ["heard 39999 characters"]
    assert [t for t in chat.replies() if not t.startswith(("heard", "echo"))] == []


async def test_a_shared_file_is_saved_in_the_senders_inbox_and_the_bot_sends_files(
    chat: Chat,
) -> None:
    content = b"quarterly numbers: 42\n" * 50
    shared = chat.fake.add_file(content, name="q3.txt", mimetype="text/plain")
    workspace = chat.state_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "report.txt").write_bytes(b"the report body\n")
    async with chat.running():
        await chat.fake.push_message("here it is", user=SLACK_OWNER, channel=SLACK_DM,
                                     files=[shared])  # fmt: skip
        await chat.wait_received("q3.txt")
        saved = sorted(p for p in (workspace / "inbox").rglob("*") if p.is_file())
        assert [p.read_bytes() for p in saved] == [content]
        assert f"slack-{SLACK_OWNER}" in str(saved[0])
        assert all(d["authorized"] for d in chat.fake.downloads)

        args = {"path": "report.txt", "caption": "the **report**"}
        await chat.say(f"!tool send_file {json.dumps(args)}")  # the owner's own DM: unasked
        await eventually(lambda: chat.fake.uploads, timeout=15, what="the upload")
    [upload] = chat.fake.uploads
    assert upload["content"] == b"the report body\n" and upload["channel_id"] == SLACK_DM
    assert upload["filename"] == "report.txt"
    assert "*report*" in (upload["initial_comment"] or "")


async def test_a_file_over_max_download_is_refused_before_its_download(chat: Chat) -> None:
    chat.slack_keys = 'max_download = "1KB"'
    big = chat.fake.add_file(b"x" * 3000, name="big.bin", mimetype="application/octet-stream")
    async with chat.running():
        await chat.fake.push_message("a file", user=SLACK_OWNER, channel=SLACK_DM, files=[big])
        await chat.wait_received("big.bin")
    [reply] = [t for t in chat.replies() if "big.bin" in t]
    assert "max_download" in reply or "limit" in reply, reply
    assert chat.fake.downloads == []  # refused by its announced size: never fetched


class LongBrain(SlackBrain):
    """``long:`` → a reply of 10,000 characters; ``hostile:`` → a shell call whose
    arguments hold mrkdwn, a mention and a fence."""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "user" and "long:" in (last.content or ""):
            text = "\n\n".join(f"paragraph {n}: " + "lorem ipsum " * 30 for n in range(27))
            return BrainReply(text=text, route_reason="test: long")
        if last.role == "user" and "hostile:" in (last.content or ""):
            command = "echo ```*bold* <!channel> <@U0FRIEND> &amp;```"
            call = ToolCall(id=new_id(), name="shell_exec", args={"command": command})
            return BrainReply(tool_calls=[call], route_reason="test: hostile call")
        return await super().step(conversation, tools, context)


async def test_a_long_reply_is_split_in_order_and_each_part_fits(chat: Chat) -> None:
    chat.brain = LongBrain()
    async with chat.running():
        await chat.say("long: please")
        await chat.wait_received("paragraph 26")
        parts = [m["text"] for m in chat.sent() if "paragraph" in m["text"]]
    assert len(parts) >= 3 and all(len(p) <= 3_900 for p in parts)
    joined = "\n\n".join(parts)
    assert [f"paragraph {n}:" in joined for n in range(27)] == [True] * 27
    assert joined.index("paragraph 3:") < joined.index("paragraph 25:")


async def test_a_prompt_shows_hostile_arguments_escaped_in_its_code_block(chat: Chat) -> None:
    chat.brain = LongBrain()
    async with chat.running():
        await chat.say("hostile:")
        shown = await chat.prompt()
        ts, _ids = shown.handle
        message = chat.fake.message(SLACK_DM, ts)
    assert message is not None
    raw = json.dumps(message["blocks"])
    assert "<!channel>" not in raw and "<@U0FRIEND>" not in raw
    sections = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]
    [section] = [s for s in sections if "```" in s]
    code = section[section.index("```") :]
    assert "&lt;!channel&gt;" in code and "&amp;amp;" in code
    assert code.count("```") == 2  # the argument's own fences cannot end the block
    assert "*bold*" in code  # shown as typed: inside a code block mrkdwn is not applied
    # Nothing the model wrote notifies anyone: Slack links no bare @channel or name.
    assert all(b["text"].get("verbatim") is True for b in message["blocks"]
               if b["type"] == "section")  # fmt: skip


def test_the_slack_section_is_checked_and_its_secrets_named_by_mode() -> None:
    from echo_bot.config import LoadedConfig, channel_section, parse_config, secrets_in_use
    from echo_bot.errors import ConfigError

    with pytest.raises(ConfigError, match="not a Slack user ID"):
        parse_config({"slack": {"allowed_users": ["@alice"]}})
    with pytest.raises(ConfigError, match="not a Slack channel ID"):
        parse_config({"slack": {"channels": ["#general"]}})
    with pytest.raises(ConfigError, match=r"slack\.mode"):
        parse_config({"slack": {"mode": "rtm"}})
    with pytest.raises(ConfigError, match=r"slack\.api_base"):
        parse_config({"slack": {"api_base": "slack.com/api"}})
    with pytest.raises(ConfigError, match=r"slack\.bot_tokn_env"):
        parse_config({"slack": {"bot_tokn_env": "X"}})
    socket = parse_config({"slack": {"enabled": True, "allowed_users": ["U0ALICE"]}})
    assert channel_section(socket, "slack").approver_ids == ["U0ALICE"]
    loaded = LoadedConfig(config=socket, path=Path("x.toml"))
    assert dict(secrets_in_use(loaded, {})) == {"SLACK_BOT_TOKEN": True, "SLACK_APP_TOKEN": True}
    http = parse_config({"slack": {"enabled": True, "mode": "http"}})
    loaded = LoadedConfig(config=http, path=Path("x.toml"))
    assert dict(secrets_in_use(loaded, {})) == {
        "SLACK_BOT_TOKEN": True, "SLACK_SIGNING_SECRET": True,
    }  # fmt: skip


def test_markdown_to_mrkdwn_escapes_everything_but_its_own_markup() -> None:
    from channels.slack.formatting import TEXT
    from echo_bot.richtext.parts import message_parts

    def to_mrkdwn(markdown: str) -> str:
        return "\n".join(message_parts(markdown, True, None, TEXT))

    assert to_mrkdwn("# Title\n\n**b** _i_ ~~s~~") == "*Title*\n\n*b* _i_ ~s~"
    assert to_mrkdwn("- a\n- b <!here>") == "• a\n• b &lt;!here&gt;"
    # No run of backquotes (three, four…) inside a code block can end it early.
    assert to_mrkdwn("```\nx < y ```\n```") == "```\nx &lt; y `\u2060`\u2060`\n```"
    assert "``" not in to_mrkdwn("```\na````b\n```").strip("`\n")
    # A link's text naming another address than its target shows the target.
    assert to_mrkdwn("[bank.com](https://evil.example/x)") == (
        "<https://evil.example/x|bank.com> (https://evil.example/x)"
    )
    assert to_mrkdwn("[docs](https://x.org/d)") == "<https://x.org/d|docs>"
    # A | in the URL would end it early: the parser encodes it (%7C); in the label it is text.
    assert to_mrkdwn("[a|b](https://x.org/?q=a|b)") == "<https://x.org/?q=a%7Cb|a|b>"
    assert to_mrkdwn("[x](https://x.org/a>b)") == "<https://x.org/a%3Eb|x>"
    assert to_mrkdwn("<script>&") == "&lt;script&gt;&amp;"
    # Cut on the text people see, then escaped (never inside an escape); a part whose
    # escapes make it too long for one message is cut again.
    parts = message_parts("&" * 8_000, False, None, TEXT)
    assert all(p == "&amp;" * p.count("&") and len(p) <= 12_000 for p in parts)
    assert sum(p.count("&") for p in parts) == 8_000


async def test_after_slack_asks_it_to_reconnect_nothing_is_lost(chat: Chat) -> None:
    """Slack sends ``disconnect`` (a refresh, a deploy on its side) and closes the socket:
    the SDK opens a new connection, and what is said meanwhile is answered once."""
    async with chat.running():
        await chat.say("say:before")
        await chat.wait_received("echo: before")
        await chat.fake.disconnect()
        await eventually(lambda: chat.fake.connections == 2, timeout=15, what="reconnected")
        await chat.say("say:after")  # held by the fake until a connection takes it
        await chat.wait_received("echo: after")
        await chat.fake.drop_connection()  # no disconnect message: the socket just dies
        await chat.say("say:dropped")
        await chat.wait_received("echo: dropped")
    assert [t for t in chat.replies() if t.startswith("echo")] == [
        "echo: before", "echo: after", "echo: dropped",
    ]  # fmt: skip


async def test_a_press_on_a_prompt_someone_replied_under_still_decides(chat: Chat) -> None:
    """Regression (review): once a message has replies under it, Slack gives it a
    ``thread_ts`` of its own, and a press on it came as from that thread, which is not
    the chat the prompt went to: the approver was refused."""
    async with chat.running():
        await chat.say("run:threaded")
        shown = await chat.prompt()
        ts, _ids = shown.handle
        prompt = chat.fake.message(SLACK_DM, ts)
        assert prompt is not None
        prompt["thread_ts"] = ts  # someone replied under it
        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: threaded")


async def test_an_envelope_of_a_strange_type_stops_nothing_after_it(chat: Chat) -> None:
    """Regression (review): the worker read ``request.type`` outside its guard, so an
    envelope whose type was no string ended the worker, and nothing after it was taken."""
    from tests.fakes.slack_api import Envelope

    async with chat.running():
        for kind in (["events_api"], {"a": 1}, None, "slash_commands"):
            # An envelope no SDK method makes: sent as the fake sends any envelope.
            await chat.fake._deliver(Envelope(envelope_id=str(kind), type=kind, payload={}))  # type: ignore[arg-type]
        await chat.say("say:still")
        await chat.wait_received("echo: still")


async def test_the_outcome_of_a_prompt_deleted_meanwhile_is_posted_not_lost(chat: Chat) -> None:
    async with chat.running():
        await chat.say("run:deleted")
        shown = await chat.prompt()
        ts, _ids = shown.handle
        prompt = chat.fake.message(SLACK_DM, ts)
        assert prompt is not None
        chat.fake._remove(prompt)  # deleted in Slack meanwhile: chat.update finds nothing
        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: deleted")
        await eventually(lambda: any("Approved" in t for t in chat.replies()), timeout=15,
                         what="the outcome posted")  # fmt: skip
