"""The Discord channel against the fake Discord (tests/fakes/discord_api.py), which the
real discord.py talks to over HTTP and WebSocket through ``[discord] proxy``, for what
the contract suite does not cover: approvals by button (a forged or replayed press
refused, the prompt edited to its outcome), guilds (mentions, replies, threads, the
allowlists), a RESUME's replay and a new session's catch-up, 429s and a lost answer,
Discord's Markdown, strangers, hostile payloads, files both ways and the intents.

The owner (an approver) and a friend (allowed to chat) write in direct messages and in
one guild's channel."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import Address, OutboundMessage, new_id
from echo_bot.tools.base import Tool
from tests.channels.contract.drivers import (
    DISCORD_FRIEND_ID,
    SECRET,
    ChatBrain,
    DiscordDriver,
    discord_read,
)
from tests.fakes.discord_api import (
    BOT_ID,
    BOT_USER,
    OWNER_ID,
    FakeDiscord,
    bot_role,
    dm_of,
    user,
)
from tests.waiting import eventually

pytest.importorskip("discord")

GUILD, CHANNEL, ELSEWHERE, THREAD, CATEGORY = (f"13000000000000000{n:02d}" for n in range(1, 6))
OTHER_GUILD, OTHER_CHANNEL = "1400000000000000001", "1400000000000000002"
OWNER = user(OWNER_ID, "owner")
FRIEND = user(DISCORD_FRIEND_ID, "friend")
HOSTILE_MARKDOWN = (
    "**bold** @everyone <@1100000000000000002> `co`de`\n\n# not a heading\n\n"
    "[click](javascript:alert(1)) [ok](https://example.org/a_b)"
)


LONG_COMMAND = "echo " + "word " * 500  # a call shown in two messages (2,000 characters each)
LONG_CODE = (
    "Here it is:\n\n```python\n"
    + "\n".join(f"x{n} = '{SECRET if n == 7 else n}'" for n in range(300))
    + "\n```\n\nand a short one:\n\n```\nprint(1)\n```\n\nthe end"
)


class DiscordBrain(ChatBrain):
    """``code:`` → a reply with a long code block and a short one; else a chat brain's."""

    MARKDOWN = HOSTILE_MARKDOWN

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "user" and "code:" in (last.content or ""):
            return BrainReply(text=LONG_CODE, route_reason="test: code", markdown=True)
        if last.role == "user" and "long:" in (last.content or ""):
            call = ToolCall(id=new_id(), name="shell_exec", args={"command": LONG_COMMAND})
            return BrainReply(tool_calls=[call], route_reason="test: a long call that asks")
        if last.role == "tool" and LONG_COMMAND in str(conversation[-2].tool_calls):
            return BrainReply(text="ran: long", route_reason="test: report")
        return await super().step(conversation, tools, context)


class Chat(DiscordDriver):
    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.brain = DiscordBrain()

    @property
    def fake(self) -> FakeDiscord:
        assert self.discord is not None
        return self.discord  # type: ignore[no-any-return]

    def replies(self, channel: str | None = None) -> list[str]:
        return [s.content for s in self.sent(channel)]

    async def mention(self, text: str, *, channel: str = CHANNEL, guild: str = GUILD,
                      by: dict[str, Any] = OWNER) -> dict[str, Any]:  # fmt: skip
        return await self.fake.push_message(
            f"<@{BOT_ID}> {text}", author=by, channel_id=channel, guild_id=guild,
            mentions=[BOT_USER],
        )  # fmt: skip


@pytest.fixture
async def chat(state_dir: Path) -> AsyncIterator[Chat]:
    made = Chat(state_dir)
    async with made.peer():
        made.fake.add_guild(GUILD, [CHANNEL, ELSEWHERE], threads={THREAD: CHANNEL},
                            categories=[CATEGORY])  # fmt: skip
        made.fake.add_guild(OTHER_GUILD, [OTHER_CHANNEL])
        yield made


async def test_the_owners_press_approves_and_the_prompt_shows_who_decided(chat: Chat) -> None:
    async with chat.running():
        await chat.say("run:pressed")
        shown = await chat.prompt()
        sent, ids = shown.handle
        assert [a.split(":", 1)[0] for a in ids] == ["approve_once", "deny"]
        styles = [b["style"] for row in sent.components for b in row["components"]]
        assert styles == [3, 4]  # success, danger
        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: pressed")
        assert (chat.state_dir / "workspace" / "contract.txt").exists()
        # Acknowledged as a deferred update (no message of its own), after the commit.
        assert [body["type"] for _, body in chat.fake.callbacks] == [6]
        await eventually(lambda: sent.components == [], timeout=15, what="the buttons gone")
    outcome = discord_read(sent.content)
    assert "Approved" in outcome and OWNER_ID in outcome and sent.edits, outcome  # and by whom


async def test_a_long_prompts_outcome_says_who_decided_which_request_under_its_call(
    chat: Chat,
) -> None:
    """A call too long for one message is shown in two, the buttons on the second; the
    decision edits that one to say who decided and which request, and leaves the call
    shown where it was (not its beginning again in place of its end)."""
    async with chat.running():
        await chat.say("long:please")
        shown = await chat.prompt()
        sent, _ids = shown.handle
        first = chat.sent()[-2]
        call_start, call_end = discord_read(first.content), discord_read(sent.content)
        assert "shell_exec" in call_start and "word" in call_end and "shell_exec" not in call_end
        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: long")
        await eventually(lambda: sent.components == [], timeout=15, what="the buttons gone")
    outcome = discord_read(sent.content)
    request = re.search(r"Request ([0-9a-f]{32})", call_start + call_end)
    assert request is not None and f"Request {request.group(1)}" in outcome
    assert "Approved" in outcome and OWNER_ID in outcome, outcome
    assert "word word" not in outcome and discord_read(first.content) == call_start


async def test_a_forged_press_is_refused_and_a_replayed_one_changes_nothing(chat: Chat) -> None:
    async with chat.running():
        await chat.say("say:first")
        await chat.wait_received("echo: first")
        reply = chat.sent()[-1]
        await chat.say("run:once")
        shown = await chat.prompt()
        sent, ids = shown.handle
        approve = next(a for a in ids if a.startswith("approve_once:"))
        # An action the prompt does not carry, and a real one on a message that is no prompt.
        for message, action in ((sent, "approve_once:" + "f" * 32), (reply, approve)):
            await chat.fake.press(message, action, by=OWNER)
        await eventually(lambda: sum(t.startswith("⚠️") for t in chat.received()) == 2,
                         timeout=15, what="both presses refused")  # fmt: skip
        assert not (chat.state_dir / "workspace" / "contract.txt").exists()
        for _ in range(2):  # the real press, and the same press again
            await chat.fake.press(sent, approve, by=OWNER)
        await chat.wait_received("ran: once")
        await asyncio.sleep(0.5)
        assert sum(t == "ran: once" for t in chat.received()) == 1


async def test_in_a_guild_a_mention_or_a_reply_to_the_bot_is_answered_where_it_was_made(
    chat: Chat,
) -> None:
    chat.keys = f'guilds = ["{GUILD}"]\nchannels = ["{CHANNEL}"]'
    async with chat.running():
        await chat.mention("say:channel")
        await eventually(lambda: "echo: channel" in chat.replies(CHANNEL), timeout=15,
                         what="the answer in the channel")  # fmt: skip
        [answer] = chat.sent(CHANNEL)
        assert answer.reference is not None  # a reply to the message it answers
        # A reply to the bot's message, without a mention, is for the bot too.
        bot_message = next(m for m in chat.fake.history[CHANNEL] if m["id"] == answer.id)
        await chat.fake.push_message("say:replied", author=OWNER, channel_id=CHANNEL,
                                     guild_id=GUILD, reply_to=bot_message)  # fmt: skip
        await chat.mention("say:threaded", channel=THREAD)  # the thread's parent is listed
        await eventually(lambda: "echo: threaded" in chat.replies(THREAD), timeout=15,
                         what="the answer in the thread")  # fmt: skip
        await eventually(lambda: "echo: replied" in chat.replies(CHANNEL), timeout=15,
                         what="the answer to the reply")  # fmt: skip
        # Left alone: no mention; a channel or guild not listed; another bot.
        await chat.fake.push_message("say:unaddressed", author=OWNER, channel_id=CHANNEL,
                                     guild_id=GUILD)  # fmt: skip
        await chat.mention("say:elsewhere", channel=ELSEWHERE)
        await chat.mention("say:other", channel=OTHER_CHANNEL, guild=OTHER_GUILD)
        robot = {**user("1500000000000000001", "robot"), "bot": True}
        await chat.mention("say:robot", by=robot)
        # "@echo-bot" as Discord's autocomplete may write it: the bot's managed role.
        role = bot_role(GUILD)
        await chat.fake.push_message(f"<@&{role}> say:role", author=OWNER, channel_id=CHANNEL,
                                     guild_id=GUILD, roles=[role])  # fmt: skip
        await chat.mention("say:last")
        await eventually(lambda: "echo: last" in chat.replies(CHANNEL), timeout=15,
                         what="the last answer")  # fmt: skip
        assert "echo: role" in chat.replies(CHANNEL)
        texts = await chat.inbound_texts()
    for left in ("unaddressed", "elsewhere", "other", "robot"):
        assert not any(f"say:{left}" in t for t in texts), left
    assert all(f"<@{BOT_ID}>" not in t for t in texts)  # the bot's own mention left out
    assert all(f"<@&{role}>" not in t for t in texts)  # and its role's
    assert chat.sent(ELSEWHERE) == [] and chat.sent(OTHER_CHANNEL) == []


async def test_a_replayed_message_and_a_resumed_session_are_answered_once(chat: Chat) -> None:
    async with chat.running():
        said = await chat.say("say:twice")
        await chat.wait_received("echo: twice")
        # The same message delivered again (as a RESUME from an older sequence would).
        await chat.fake.push_message("say:twice", author=OWNER, channel_id=chat.dm(),
                                     message_id=said["id"])  # fmt: skip
        await chat.fake.drop_gateway()
        await chat.say("say:meanwhile")  # kept for the RESUME
        await chat.wait_received("echo: meanwhile")
        await chat.say("say:after")
        await chat.wait_received("echo: after")
    assert chat.fake.resumed >= 1 and chat.fake.identified == 1
    assert chat.received() == ["echo: twice", "echo: meanwhile", "echo: after"]


async def test_a_new_session_reads_back_over_rest_what_came_while_it_was_gone(
    chat: Chat,
) -> None:
    async with chat.running():
        await chat.say("say:before")
        await chat.wait_received("echo: before")
        # Kept: the first session's read-back has run by then (discord.py readies a
        # session once its guilds came, up to 2 s). Shorter tests less, never fails wrongly.
        await asyncio.sleep(2.5)
        chat.fake.history_delay = 1.0  # the read-back slower than a message sent now
        await chat.fake.invalidate()  # the session ends: what comes now is never dispatched
        for word in ("gap1", "gap2"):
            await chat.fake.push_message(f"say:{word}", author=OWNER, channel_id=chat.dm(),
                                         dispatch=False)  # fmt: skip
        await eventually(lambda: chat.fake.identified == 2, timeout=20, what="a new IDENTIFY")
        await chat.say("say:live")  # at once: it waits behind what is read back
        await chat.wait_received("echo: gap1", "echo: gap2", "echo: live")
        await chat.say("say:after")
        await chat.wait_received("echo: after")
    assert chat.received() == [
        "echo: before", "echo: gap1", "echo: gap2", "echo: live", "echo: after",
    ]  # fmt: skip
    assert chat.fake.calls_to("GET /channels/{id}/messages")


async def test_a_restart_reads_back_what_came_while_the_daemon_was_down(chat: Chat) -> None:
    async with chat.running():
        await chat.say("say:before")
        await chat.wait_received("echo: before")
    await chat.fake.push_message("say:down", author=OWNER, channel_id=chat.dm(), dispatch=False)
    async with chat.running():
        await chat.wait_received("echo: down")
        await asyncio.sleep(0.5)
    assert chat.received() == ["echo: before", "echo: down"]


async def test_a_mention_made_while_the_bot_was_down_in_a_busy_channel_is_read_back(
    chat: Chat,
) -> None:
    """More messages than a read-back takes (1,000) since the bot last answered in the
    channel, then a mention: the newest are read back, the mention with them."""
    async with chat.running():
        await chat.mention("say:before")
        await eventually(lambda: "echo: before" in chat.replies(CHANNEL), timeout=15,
                         what="the answer before")  # fmt: skip
    for n in range(1_050):
        await chat.fake.push_message(f"chatter {n}", author=OWNER, channel_id=CHANNEL,
                                     guild_id=GUILD, dispatch=False)  # fmt: skip
    await chat.fake.push_message(f"<@{BOT_ID}> say:missed", author=OWNER, channel_id=CHANNEL,
                                 guild_id=GUILD, mentions=[BOT_USER], dispatch=False)  # fmt: skip
    async with chat.running():
        await eventually(lambda: "echo: missed" in chat.replies(CHANNEL), timeout=20,
                         what="the mention read back")  # fmt: skip


async def test_a_read_back_that_failed_is_tried_again_and_its_gap_answered(chat: Chat) -> None:
    """The read-back at the start refused once: a message that arrives meanwhile is
    answered without moving the channel's position past the gap, which is read back
    again after a pause."""
    async with chat.running():
        await chat.say("say:before")
        await chat.wait_received("echo: before")
    await chat.fake.push_message("say:gap", author=OWNER, channel_id=chat.dm(), dispatch=False)
    chat.fake.fail_next("GET /channels/{id}/messages", 403)
    async with chat.running():
        await eventually(lambda: any(c.status == 403 for c in chat.fake.calls), timeout=15,
                         what="the refused read-back")  # fmt: skip
        await chat.say("say:live")
        await chat.wait_received("echo: live", "echo: gap")
    assert sorted(chat.received()) == ["echo: before", "echo: gap", "echo: live"]


async def test_a_first_message_sent_while_the_bot_was_down_is_read_back(
    chat: Chat, caplog: pytest.LogCaptureFixture
) -> None:
    """Chats the bot never answered in have no position: an allowed user's first DM and
    a first mention in a listed channel, made while it was down, are read back at the
    start; what in that channel does not mention it is not answered."""
    chat.keys = f'channels = ["{CHANNEL}", "{CATEGORY}"]'  # a category holds no messages
    await chat.fake.push_message("say:firstdm", author=FRIEND, channel_id=dm_of(FRIEND["id"]),
                                 dispatch=False)  # fmt: skip
    await chat.fake.push_message("chatter", author=OWNER, channel_id=CHANNEL, guild_id=GUILD,
                                 dispatch=False)  # fmt: skip
    await chat.fake.push_message(f"<@{BOT_ID}> say:firstmention", author=OWNER,
                                 channel_id=CHANNEL, guild_id=GUILD, mentions=[BOT_USER],
                                 dispatch=False)  # fmt: skip
    async with chat.running():
        await eventually(lambda: "echo: firstdm" in chat.replies(dm_of(FRIEND["id"])),
                         timeout=20, what="the first DM read back")  # fmt: skip
        await eventually(lambda: "echo: firstmention" in chat.replies(CHANNEL), timeout=20,
                         what="the first mention read back")  # fmt: skip
        await chat.say("say:live")
        await chat.wait_received("echo: live")
    assert chat.replies(CHANNEL) == ["echo: firstmention"]
    assert chat.replies(dm_of(FRIEND["id"])) == ["echo: firstdm"]
    assert f"/channels/{CATEGORY}" in [c.path for c in chat.fake.calls]  # looked at, and
    assert f"/channels/{CATEGORY}/messages" not in [c.path for c in chat.fake.calls]  # not read
    assert not [r for r in caplog.records if CATEGORY in r.getMessage()]  # nor tried again


async def test_a_first_dm_whose_read_back_failed_is_read_again_and_answered(chat: Chat) -> None:
    """No position yet, and its read-back refused once: the DM is read again after a
    pause, and a message answered meanwhile does not move it past the first one."""
    await chat.fake.push_message("say:gap", author=OWNER, channel_id=chat.dm(), dispatch=False)
    chat.fake.fail_next("GET /channels/{id}/messages", 403)  # the owner's DM is read first
    async with chat.running():
        await eventually(lambda: any(c.status == 403 for c in chat.fake.calls), timeout=15,
                         what="the refused read-back")  # fmt: skip
        await chat.say("say:live")
        await chat.wait_received("echo: live", "echo: gap")
    assert sorted(chat.received()) == ["echo: gap", "echo: live"]


async def test_a_channel_deleted_while_the_bot_was_down_is_not_read_back_again(
    chat: Chat,
) -> None:
    async with chat.running():
        await chat.mention("say:before")
        await eventually(lambda: "echo: before" in chat.replies(CHANNEL), timeout=15,
                         what="the answer before")  # fmt: skip
    chat.fake.fail_next("GET /channels/{id}/messages", 404)  # Unknown Channel: its only one
    before = len(chat.fake.calls)
    async with chat.running() as bot:
        read = f"/channels/{CHANNEL}/messages"

        async def forgotten() -> bool:
            note = await bot.store.run(lambda tx: tx.meta.note("discord.positions"))
            return note is not None and CHANNEL not in json.loads(note[0])

        await eventually(forgotten, timeout=15, what="the channel's position dropped")
        await asyncio.sleep(3.0)  # past the first pause before a failed read-back's next try
        reads = [c.status for c in chat.fake.calls[before:] if c.path == read]
    assert reads == [404]


async def test_429s_are_waited_out_and_a_lost_answer_makes_no_second_message(
    chat: Chat,
) -> None:
    async with chat.running():
        route = "POST /channels/{id}/messages"
        chat.fake.rate_limit_next(route, retry_after=0.5, glob=True)
        chat.fake.rate_limit_next(route, retry_after=0.5)
        await chat.say("say:limited")
        await chat.wait_received("echo: limited")
        chat.fake.lose_answers = 1  # made, then answered 500: tried again with its nonce
        await chat.say("say:lost")
        await chat.wait_received("echo: lost")
        await asyncio.sleep(0.5)
    assert chat.received() == ["echo: limited", "echo: lost"]
    statuses = [c.status for c in chat.fake.calls_to(route)]
    assert statuses == [429, 429, 200, 500, 200], statuses


async def test_markdown_is_written_as_discords_and_nothing_mentions_anyone(chat: Chat) -> None:
    async with chat.running():
        await chat.say("md: please")
        await eventually(lambda: chat.sent(), timeout=15, what="the reply")
    [sent] = chat.sent()
    wire = sent.content
    assert wire.startswith("**bold** \\@everyone \\<\\@1100000000000000002\\>")
    assert not any(line.startswith(("#", "\\#")) for line in wire.split("\n"))  # no heading
    assert "](javascript" not in wire and "(<javascript" not in wire  # never a link
    assert "[click](javascript:alert(1))" in discord_read(wire)  # shown as written
    assert "[ok](<https://example.org/a_b>)" in wire
    assert sent.allowed_mentions == {"parse": []}  # no mention of anyone, ever
    assert sent.flags & 4  # SUPPRESS_EMBEDS: no link previews


async def test_a_stranger_is_told_their_id_once_and_can_pair(chat: Chat) -> None:
    stranger = user("1600000000000000001", "stranger")
    dm = dm_of(stranger["id"])
    async with chat.running():
        for _ in range(2):
            await chat.fake.push_message("say:hello", author=stranger, channel_id=dm)
        await eventually(lambda: chat.replies(dm), timeout=15, what="the refusal")
        await asyncio.sleep(0.5)
        [refusal] = chat.received_in(dm)
        assert stranger["id"] in refusal and "allowed_users" in refusal
        assert not any("say:hello" in t for t in await chat.inbound_texts())
        assert chat.bot is not None
        code = await chat.bot.store.run(lambda tx: tx.access.new_pairing_code())
        await chat.fake.push_message(f"pair {code}", author=stranger, channel_id=dm)
        await eventually(lambda: any("Paired" in t for t in chat.received_in(dm)), timeout=15,
                         what="paired")  # fmt: skip
        await chat.fake.push_message("say:paired", author=stranger, channel_id=dm)
        await eventually(lambda: "echo: paired" in chat.replies(dm), timeout=15,
                         what="the paired stranger answered")  # fmt: skip


async def test_hostile_payloads_neither_crash_nor_block_what_comes_after(chat: Chat) -> None:
    dm = dm_of(OWNER_ID)
    async with chat.running():
        base = await chat.say("say:first")
        await chat.wait_received("echo: first")
        hostile: list[tuple[str, dict[str, Any]]] = [
            ("MESSAGE_CREATE", {"id": "1", "channel_id": dm}),  # no author: discord.py fails
            ("MESSAGE_CREATE", {**base, "id": "not-a-snowflake"}),
            ("MESSAGE_CREATE", {**base, "content": {"not": "a string"}}),
            ("INTERACTION_CREATE", {"id": "5", "type": 3, "application_id": "1"}),
            ("SOMETHING_NEW", {"what": "an event no version knows"}),
        ]
        for kind, data in hostile:
            await chat.fake.dispatch(kind, data)
        await chat.say("heard: " + "\ud800 \x00 " + "y" * 60_000)
        await chat.wait_received("heard")
        await chat.say("say:still")
        await chat.wait_received("echo: still")
    # Discord's own limit (4,000 characters) kept, a lone surrogate replaced, NUL dropped.
    assert [t for t in chat.received() if t.startswith("heard")] == ["heard 3999 characters"]
    assert [t for t in chat.received() if not t.startswith(("heard", "echo"))] == []


async def test_an_attached_file_is_saved_in_the_senders_inbox_and_the_bot_sends_files(
    chat: Chat,
) -> None:
    content = b"quarterly numbers: 42\n" * 50
    attached = chat.fake.add_file("q3.txt", content)
    workspace = chat.state_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "report.txt").write_bytes(b"the report body\n")
    async with chat.running():
        await chat.fake.push_message("here it is", author=OWNER, channel_id=chat.dm(),
                                     attachments=[attached])  # fmt: skip
        await chat.wait_received("q3.txt")
        saved = sorted(p for p in (workspace / "inbox").rglob("*") if p.is_file())
        assert [p.read_bytes() for p in saved] == [content]
        assert f"discord-{OWNER_ID}" in str(saved[0])
        args = {"path": "report.txt", "caption": "the **report**"}
        await chat.say(f"!tool send_file {json.dumps(args)}")  # the owner's own DM: unasked
        await eventually(lambda: any(s.files for s in chat.sent()), timeout=15,
                         what="the upload")  # fmt: skip
    [upload] = [s for s in chat.sent() if s.files]
    assert upload.files == [("report.txt", b"the report body\n")]
    assert discord_read(upload.content) == "the **report**"  # as written: a caption is plain


async def test_a_file_over_max_download_is_refused_before_its_download(chat: Chat) -> None:
    chat.keys = 'max_download = "1KB"'
    big = chat.fake.add_file("big.bin", b"x" * 3000, "application/octet-stream")
    async with chat.running():
        await chat.fake.push_message("a file", author=OWNER, channel_id=chat.dm(),
                                     attachments=[big])  # fmt: skip
        await chat.wait_received("big.bin")
    [reply] = [t for t in chat.received() if "big.bin" in t]
    assert "max_download" in reply or "limit" in reply, reply
    assert chat.fake.downloads == []  # refused by its announced size: never fetched


async def test_the_message_content_intent_asked_but_off_for_the_app_is_said_plainly(
    chat: Chat,
) -> None:
    chat.keys = "message_content = true"
    chat.fake.app_flags = 0
    async with chat.running(connected=False):
        await eventually(lambda: chat.health() == "down", timeout=20, what="the channel down")
        assert chat.bot is not None
        state = next(c for c in chat.bot.daemon.channels if c.name == "discord").health()
        assert "Message Content" in str(state) and "message_content" in str(state), state
        await asyncio.sleep(2.0)  # refused: never tried again (each try is one of 1,000 a day)
        assert chat.fake.identify_tries == 1


async def test_a_cloudflare_ban_at_login_is_waited_out_not_taken_for_a_refused_token(
    chat: Chat,
) -> None:
    chat.fake.cloudflare_bans = 1  # a 429 without Discord's Via header: Cloudflare's
    async with chat.running(connected=False):
        await eventually(lambda: chat.fake.session is not None, timeout=30, what="the login")
        await chat.say("say:unbanned")
        await chat.wait_received("echo: unbanned")
    assert chat.fake.calls[0].status == 429


async def test_a_cloudflare_ban_while_running_holds_the_replies_until_it_lifts(
    chat: Chat,
) -> None:
    """Calls turned away (a 429 without Discord's Via: a ban that may last an hour): the
    channel says it is away, and the reply waits for it without using up its attempts."""
    async with chat.running():
        chat.fake.cloudflare_bans = 2
        await chat.say("say:banned")
        await eventually(lambda: chat.health() != "ok", timeout=15, what="the channel away")
        await chat.wait_received("echo: banned")
        bot = chat.bot
        assert bot is not None

        async def marked_sent() -> bool:  # the fake has it before the daemon commits the mark
            sent = await bot.store.run(lambda tx: tx.outbox.deliveries())
            return [d.status for d in sent] == ["sent"]

        await eventually(marked_sent, timeout=10, what="the delivery marked sent")
        sent = await bot.store.run(lambda tx: tx.outbox.deliveries())
    assert chat.fake.cloudflare_bans == 0 and chat.received() == ["echo: banned"]
    assert [d.attempts for d in sent] == [1]  # the send that went: the bans not counted


async def test_a_message_discord_sent_without_its_text_is_not_answered_blind(chat: Chat) -> None:
    """A sticker, a forward, or a reply when the bot reads only what mentions it: Discord
    sends no text and no files. The sender is told, once; nothing reaches the brain."""
    async with chat.running():
        await chat.fake.push_message("", author=OWNER, channel_id=chat.dm())
        await chat.wait_received("could not read that message")
        await chat.say("say:after")
        await chat.wait_received("echo: after")
        texts = await chat.inbound_texts()
    assert texts == ["say:after"], texts


async def test_a_bare_mention_is_asked_for_its_message_not_told_it_was_unreadable(
    chat: Chat,
) -> None:
    async with chat.running():
        await chat.mention("")
        await eventually(lambda: chat.replies(CHANNEL), timeout=15, what="an answer")
        await chat.say("say:after")
        await chat.wait_received("echo: after")
        texts = await chat.inbound_texts()
    [said] = chat.replies(CHANNEL)
    assert "after the mention" in said and "could not read" not in said, said
    assert texts == ["say:after"], texts


def test_the_discord_section_is_checked_and_a_wrong_token_named() -> None:
    from channels.discord.settings import environment_problems
    from echo_bot.config import channel_section, parse_config
    from echo_bot.errors import ConfigError

    with pytest.raises(ConfigError, match="not a Discord ID"):
        parse_config({"discord": {"allowed_users": ["@alice"]}})
    with pytest.raises(ConfigError, match="not a Discord ID"):
        parse_config({"discord": {"guilds": ["my server"]}})
    with pytest.raises(ConfigError, match=r"discord\.proxy"):
        parse_config({"discord": {"proxy": "socks5://127.0.0.1:1080"}})
    with pytest.raises(ConfigError, match=r"discord\.tokn_env"):
        parse_config({"discord": {"tokn_env": "X"}})
    config = parse_config({"discord": {"enabled": True, "allowed_users": [OWNER_ID],
                                       "ca_file": "/nonexistent/ca.pem"}})  # fmt: skip
    section = channel_section(config, "discord")
    assert section.approver_ids == [OWNER_ID]
    assert environment_problems(section, {}, None) == [
        "token_env: environment variable DISCORD_BOT_TOKEN is not set (the bot's token)",
        "ca_file: /nonexistent/ca.pem is not a file",
    ]
    # The application's client secret or public key pasted for the bot's token.
    for pasted, looks in (("a" * 32, "client secret"), ("0f" * 32, "public key")):
        [problem] = environment_problems(section, {"DISCORD_BOT_TOKEN": pasted}, None)[:1]
        assert looks in problem and "Reset Token" in problem, problem
    assert environment_problems(section, {"DISCORD_BOT_TOKEN": "MTAx.Gx.abc"}, None) == [
        "ca_file: /nonexistent/ca.pem is not a file"
    ]


def test_a_ca_file_that_is_no_certificate_is_said_before_a_start_and_a_proxy_login_never_shown(
    tmp_path: Path,
) -> None:
    """A ca_file that is not PEM made `doctor` die with an SSLError traceback, and
    `run` try to connect again for ever; a proxy's password showed in check-config."""
    from channels.discord.settings import environment_problems, summary
    from channels.email.settings import environment_problems as email_problems
    from echo_bot.config import channel_section, parse_config

    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    proxy = "http://me:s3cret@proxy.example:3128"
    config = parse_config({"discord": {"enabled": True, "ca_file": str(garbage), "proxy": proxy}})
    section = channel_section(config, "discord")
    [problem] = environment_problems(section, {"DISCORD_BOT_TOKEN": "MTAx.Gx.abc"}, None)
    assert problem.startswith(f"ca_file: {garbage} holds no PEM certificate that loads")
    assert "s3cret" not in summary(section) and "proxy.example:3128" in summary(section)
    mail = parse_config({"email": {"enabled": True, "address": "bot@example.org",
                                   "imap_host": "imap.example.org", "smtp_host": "smtp.example.org",
                                   "trust_from": True, "ca_file": str(garbage)}})  # fmt: skip
    environ = {"ECHO_BOT_EMAIL_PASSWORD": "x"}
    [problem] = email_problems(channel_section(mail, "email"), environ, None)
    assert "holds no PEM certificate" in problem


def test_markdown_to_discords_escapes_everything_but_its_own_markup() -> None:
    from channels.discord.formatting import TEXT, escape, shown
    from echo_bot.richtext import parts as richtext

    hostile = "@everyone <@1> *a* _b_ ~~c~~ ||d|| `e` # f\n- g\n1. h\n> i \\ [j](k)"
    wire = escape(hostile)
    assert shown(wire).split("\n")[: hostile.count("\n") + 1] == hostile.split("\n")
    marks = ["*a\\*", "\\_b\\_", "\\~\\~c", "\\|\\|d", "\\`e\\`", "\\# f", "\\- g", "1\\. h"]
    marks += ["\\> i", "\\\\", "\\[j\\]\\(k\\)", "\\@everyone", "\\<\\@1\\>"]
    for mark in marks:
        assert mark in wire, (mark, wire)
    [part] = richtext.message_parts("**bold** and `co``de` and\n```py\nx = '```'\n```", True,
                                    None, TEXT)  # fmt: skip
    assert part.startswith("**bold** and `co''de` and\n\n```py\n")
    assert part.count("```") == 2  # the fence inside the block cannot end it
    # A link only for http(s); a long text cut within Discord's 2,000 characters.
    [link] = richtext.message_parts("[x](ftp://h/) [y](https://h/a)", True, None, TEXT)
    assert link.startswith("x ") and link.endswith(" [y](<https://h/a>)"), link
    parts = richtext.message_parts("*" * 5000, False, None, TEXT)
    assert len(parts) > 2 and all(len(p) <= 2000 for p in parts)
    # A bare URL is linked whole, nothing escaped in it, its punctuation left outside.
    [urls] = richtext.message_parts(
        "see https://my-site.com/a_b#c, https://en.wikipedia.org/wiki/Foo_(bar). (https://x.org/y)",
        False, None, TEXT,
    )  # fmt: skip
    assert urls == (
        "see <https://my-site.com/a_b#c>, <https://en.wikipedia.org/wiki/Foo_(bar)>."
        " \\(<https://x.org/y>\\)"
    )
    # A code block inside a quote stays inside it, its fences too.
    [quoted] = richtext.message_parts("> said:\n>\n> ```\n> x = 1\n> ```\n\nafter", True, None,
                                      TEXT)  # fmt: skip
    assert quoted == "> said:\n> \n> ```\n> x = 1\n> ```\n\nafter"


def streaming_chat(state_dir: Path, llm: Any) -> Chat:
    """A chat whose brain is the config's: the openai SDK against the fake server."""
    chat = Chat(state_dir)
    chat.brain = None
    chat.extra = (
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "gpt-test"\ntimeout = "5s"\n'
        'max_retries = 0\n[brain]\nkind = "openai"\n'
    )
    return chat


async def held_preview(chat: Chat, llm: Any) -> Any:
    """Asked for a long story, the model held a third written: its preview message."""
    from echo_bot.chat_sends import PREVIEW_MARK

    await chat.say("tell me a long story")
    await llm.wait_until(lambda: llm.stream_holding == 1, timeout=30)
    preview = await eventually(lambda: chat.sent()[0] if chat.sent() else None, timeout=15,
                               what="the preview message")  # fmt: skip
    assert preview.content.endswith(PREVIEW_MARK)
    return preview


async def test_a_streamed_reply_grows_in_one_message_that_becomes_the_reply(
    state_dir: Path,
) -> None:
    """The real openai SDK streams from the fake OpenAI server (held a third written): the
    bot posts one message, edits it as the reply grows, and the reply takes its place."""
    from echo_bot.chat_sends import PREVIEW_MARK
    from tests.fakes.openai_api import FakeOpenAI

    answer = " ".join(f"word{i}" for i in range(120))
    async with FakeOpenAI(model="gpt-test") as llm:
        chat = streaming_chat(state_dir, llm)
        llm.reply(answer)
        llm.stream_hold_after = 40
        async with chat.peer():
            async with chat.running():
                preview = await held_preview(chat, llm)
                written = preview.content.removesuffix(PREVIEW_MARK)
                assert written and answer.startswith(written) and written != answer
                llm.stream_release.set()
                await eventually(lambda: preview.content == answer, timeout=20,
                                 what="the reply in place")  # fmt: skip
                assert [s.id for s in chat.sent()] == [preview.id]  # one message: the reply
                edits = preview.edits
                assert all(answer.startswith(e.removesuffix(PREVIEW_MARK)) for e in edits)
                assert not any(c.status == 429 for c in chat.fake.calls)
            async with chat.running():  # the reply is no preview left over: kept
                await asyncio.sleep(2.0)
            assert not preview.deleted


async def test_a_preview_a_stop_left_mid_stream_is_removed_at_the_next_start(
    state_dir: Path,
) -> None:
    """Stopped while a reply was written (the model held past its timeout: the turn ends
    offline), the daemon left its preview ending in the mark; the next start removes it,
    and the reply comes in a message of its own."""
    from echo_bot.chat_sends import PREVIEW_MARK
    from tests.fakes.openai_api import FakeOpenAI

    answer = " ".join(f"word{i}" for i in range(120))
    async with FakeOpenAI(model="gpt-test") as llm:
        chat = streaming_chat(state_dir, llm)
        llm.reply(answer)
        llm.stream_hold_after = 40
        async with chat.peer():
            async with chat.running():
                preview = await held_preview(chat, llm)
            async with chat.running():
                await eventually(lambda: preview.deleted, timeout=20, what="the preview gone")
                await eventually(chat.sent, timeout=20, what="the reply")
        assert not [s for s in chat.sent() if s.content.endswith(PREVIEW_MARK)], chat.sent()


async def test_long_code_goes_as_a_file_masked_and_short_code_stays_in_the_text(
    chat: Chat,
) -> None:
    async with chat.running():
        await chat.say("code: please")
        await chat.wait_received("the end")
    [code, text] = chat.sent()
    assert code.content == "" and [name for name, _ in code.files] == ["code-1.py"]
    data = code.files[0][1].decode()
    assert data.count("\n") == 300 and "x299 = '299'" in data
    assert SECRET not in data and "x7 = '" in data  # masked in the file as in any text
    shown = discord_read(text.content)
    assert "(the code, 300 lines, is attached: code-1.py)" in shown
    assert "print(1)" in shown and shown.endswith("the end")


async def test_a_reply_tried_again_after_the_nonce_window_posts_its_code_file_once(
    chat: Chat,
) -> None:
    """The code file went, the text after it was turned away (a Cloudflare 429) and the
    reply is tried again later, when Discord no longer knows the file's nonce: the file
    is not posted a second time."""
    chat.fake.nonces_kept = False
    async with chat.running():
        chat.fake.banned_posts = [False, True]
        await chat.say("code: please")
        await chat.wait_received("the end")
    assert [[n for n, _ in s.files] for s in chat.sent()] == [["code-1.py"], []]


async def test_a_message_the_store_refused_is_committed_when_it_takes_it_again(
    chat: Chat,
) -> None:
    """The gateway never sends a message again: one the store could not take (another
    process holding SQLite's write lock past the store's busy timeout) is tried again
    until it is taken, and answered once, before what came after it."""
    import sqlite3

    from echo_bot.store.db import BUSY_TIMEOUT_MS, DB_FILENAME

    async with chat.running():
        await chat.say("say:first")
        await chat.wait_received("echo: first")
        other = sqlite3.connect(chat.state_dir / DB_FILENAME, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # another process's write lock
        try:
            await chat.say("say:locked")
            await chat.say("say:behind")
            await asyncio.sleep(BUSY_TIMEOUT_MS / 1000 + 2)  # past the store's patience
            assert chat.received() == ["echo: first"]
        finally:
            other.execute("COMMIT")
            other.close()
        await chat.wait_received("echo: locked", "echo: behind")
        await asyncio.sleep(0.5)
    assert chat.received() == ["echo: first", "echo: locked", "echo: behind"]


async def test_an_outage_is_said_once_not_with_a_traceback_at_each_try(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    chat = Chat(state_dir)
    chat.proxied = True  # Discord reached through a TCP proxy the test cuts
    async with chat.peer(), chat.running():
        await chat.peer_away()
        await eventually(lambda: chat.health() != "ok", timeout=20, what="the channel down")
        await asyncio.sleep(4)  # several tries to reconnect
        await chat.peer_back()
        await chat.say("say:back")
        await chat.wait_received("echo: back")
    tries = [r for r in caplog.records if r.name == "discord.client"]
    assert any("Attempting a reconnect" in r.getMessage() for r in tries)
    assert not [r for r in tries if r.exc_info or r.levelno >= logging.ERROR]
    assert not any("voice will NOT be supported" in r.getMessage() for r in caplog.records)


async def test_a_token_reset_while_running_is_said_and_sends_wait_not_crash(chat: Chat) -> None:
    async with chat.running():
        await chat.say("say:before")
        await chat.wait_received("echo: before")
        chat.fake.token = "MTAx.reset.token"  # the owner reset the token in the portal
        await chat.fake.drop_gateway()  # the RESUME is refused, the IDENTIFY closed 4004
        await eventually(lambda: chat.health() == "down", timeout=30, what="the channel down")
        assert chat.bot is not None
        state = str(next(c for c in chat.bot.daemon.channels if c.name == "discord").health())
        assert "4004" in state and "Reset Token" in state, state


async def test_a_reply_refused_401_waits_for_the_new_token_and_goes_after_the_restart(
    chat: Chat,
) -> None:
    """The token reset while the gateway still runs: a send is refused 401. The reply
    waits (the channel says it is down), and goes once the daemon runs with the new token."""
    async with chat.running():
        await chat.say("say:before")
        await chat.wait_received("echo: before")
        chat.fake.token = "MTAx.reset.token"  # the owner reset the token in the portal
        assert chat.bot is not None
        kept = OutboundMessage(to=Address(channel="discord", chat_id=chat.dm()),
                               text="kept for the new token")  # fmt: skip
        await chat.bot.store.run(lambda tx: tx.outbox.add(kept))
        await eventually(lambda: [c for c in chat.fake.calls if c.status == 401], timeout=15,
                         what="a send refused 401")  # fmt: skip
        await eventually(lambda: chat.health() == "down", timeout=15, what="the channel down")
        await asyncio.sleep(1.0)
        sent = await chat.bot.store.run(lambda tx: tx.outbox.deliveries())
        assert [d.status for d in sent if d.id == kept.id] == ["queued"], sent
    async with chat.running():  # restarted with the new token, as the owner does
        await chat.wait_received("kept for the new token")


async def test_a_file_over_discords_upload_limit_fails_once_saying_why(chat: Chat) -> None:
    chat.fake.upload_limit = 1000
    workspace = chat.state_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "big.bin").write_bytes(b"x" * 5000)
    async with chat.running():
        await chat.say(f"!tool send_file {json.dumps({'path': 'big.bin'})}")
        assert chat.bot is not None
        store = chat.bot.store

        async def failed() -> list[Any]:
            return list(await store.run(lambda tx: tx.outbox.deliveries("failed")))

        async def one_failed() -> bool:
            return len(await failed()) == 1

        await eventually(one_failed, timeout=20, what="the upload failed")
        [delivery] = await failed()
    assert "upload limit" in str(delivery.last_error) and delivery.attempts == 1
    assert not any(s.files for s in chat.fake.sent)
