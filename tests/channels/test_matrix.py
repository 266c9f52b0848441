"""The Matrix channel against a real Synapse, for what the contract suite does not cover
(tests/channels/contract runs the shared cases): an encrypted chat end to end with an
approval by reaction, invites, undecryptable messages, Markdown as sanitised HTML,
hostile input. The people are matrix-nio clients with E2EE (tests/matrix_people.py)."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote
from uuid import uuid4

import pytest

from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.config import LoadedConfig, channel_section, parse_config, secrets_in_use
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.errors import ConfigError
from echo_bot.events import Address, new_id
from echo_bot.tools.base import Tool
from tests.channels.contract.drivers import TOOLS, ContractBrain, MatrixDriver
from tests.conftest import running_bot
from tests.matrix_people import Person, open_room
from tests.matrix_server import Synapse, unique
from tests.test_matrix_harness import raw_event, send_encrypted
from tests.waiting import eventually

HOSTILE_MARKDOWN = (
    "**bold** and `code`\n\n<script>alert(1)</script> <img src=x onerror=alert(2)>\n\n"
    "[click](javascript:alert(3)) [ok](https://example.org/)"
)


class MarkdownBrain(ContractBrain):
    """``md:`` → a model-ish Markdown reply with hostile HTML in it; else the contract's."""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "user" and "md:" in (last.content or ""):
            return BrainReply(text=HOSTILE_MARKDOWN, route_reason="test", markdown=True)
        return await super().step(conversation, tools, context)


class HeldBrain(ContractBrain):
    """``hold:`` → waits until the test releases it, then the contract's answer."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        if "hold:" in (conversation[-1].content or ""):
            await self.release.wait()
            return BrainReply(text="released", route_reason="test")
        return await super().step(conversation, tools, context)


class Chat(MatrixDriver):
    """The contract's Matrix driver with a brain that also answers in Markdown."""

    def __init__(self, state_dir: Path, synapse: Synapse) -> None:
        super().__init__(state_dir)
        self.fixtures = {"synapse": synapse}
        self.brain = MarkdownBrain()

    @property
    def owner(self) -> Person:
        return self.people[0]  # type: ignore[no-any-return]

    @property
    def bot_id(self) -> str:
        return str(self.account.user_id)


@pytest.fixture
async def chat(synapse: Synapse, state_dir: Path) -> AsyncIterator[Chat]:
    made = Chat(state_dir, synapse)
    async with made.peer():
        yield made


def api(method: str, url: str, token: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def send_raw(person: Person, room_id: str, kind: str, content: dict[str, Any]) -> str:
    """An event exactly as given (no client-side checks or encryption)."""
    path = f"/_matrix/client/v3/rooms/{quote(room_id)}/send/{quote(kind)}/{uuid4().hex}"
    answer = api("PUT", person.client.homeserver + path, person.client.access_token, content)
    return str(answer["event_id"])


async def test_an_encrypted_chat_end_to_end_with_an_approval_by_reaction(chat: Chat) -> None:
    async with chat.running():
        said = await chat.say("say:secret")
        await chat.wait_received("echo: secret")
        # In and out, the homeserver held ciphertext only.
        stored = await asyncio.to_thread(raw_event, chat.owner, chat.room_id, said)
        assert stored["type"] == "m.room.encrypted"
        [reply_id] = [e for e, b in chat.owner.received_events(chat.room_id, chat.bot_id)
                      if b == "echo: secret"]  # fmt: skip
        reply = await asyncio.to_thread(raw_event, chat.owner, chat.room_id, reply_id)
        assert reply["type"] == "m.room.encrypted", reply
        assert "secret" not in json.dumps(reply)
        # It mentions no one: "@room" or a name in what the model wrote notifies nobody.
        [shown] = [e for _room, e in chat.owner.seen if e.event_id == reply_id]
        assert shown.source["content"]["m.mentions"] == {}

        await chat.say("run:approved")
        shown = await chat.prompt()
        assert "React ✅ to approve once" in shown.text
        assert "reply `approve` / `deny`" in shown.text
        await chat.decide(shown, approve=True)  # an encrypted reaction, as Element sends
        await chat.wait_received("ran: approved")
        assert (chat.state_dir / "workspace" / "contract.txt").exists()

        # The prompt is edited (m.replace) to show the decision.
        def edit() -> str | None:
            for _room, event in chat.owner.seen:
                content = event.source.get("content", {})
                relation = content.get("m.relates_to") or {}
                if (
                    relation.get("rel_type") == "m.replace"
                    and relation.get("event_id") == shown.handle
                ):
                    return str(content.get("m.new_content", {}).get("body", ""))
            return None

        shown_after = await eventually(edit, timeout=15, what="the prompt edited")
        assert "Approved" in shown_after or "✅" in shown_after, shown_after


async def test_a_reply_approve_to_the_prompt_decides_it(chat: Chat) -> None:
    async with chat.running():
        await chat.say("run:replied")
        shown = await chat.prompt()
        await chat.owner.say(
            chat.room_id, "> <bot> the prompt\n\napprove",
            **{"m.relates_to": {"m.in_reply_to": {"event_id": shown.handle}}},
        )  # fmt: skip
        await chat.wait_received("ran: replied")


async def test_approve_typed_without_replying_says_how_to_answer(chat: Chat) -> None:
    """Matrix has no buttons: `approve` typed on its own while a request waits is told
    how to answer (reply to the prompt, or react), not handed to the brain."""
    async with chat.running():
        await chat.say("run:typed")
        shown = await chat.prompt()
        await chat.say("approve")
        await chat.wait_received("To answer a request, reply to its prompt")
        assert "echo: ?" not in chat.received()
        await chat.decide(shown, approve=False)
        await chat.wait_received("not run: typed")


async def test_a_non_approvers_typed_answer_is_refused_as_their_reaction_is(
    synapse: Synapse, state_dir: Path
) -> None:
    chat = Chat(state_dir, synapse)
    chat.brain = ContractBrain()
    chat.friend_allowed = False  # in the room, not among the allowed users
    async with chat.peer(), chat.running():
        _owner, friend = chat.people
        await chat.say("run:guarded")
        shown = await chat.prompt()
        before = len(chat.received())
        await friend.say(
            chat.room_id, "> <bot> the prompt\n\napprove",
            **{"m.relates_to": {"m.in_reply_to": {"event_id": shown.handle}}},
        )  # fmt: skip

        def refusal() -> str | None:
            return next((t for t in chat.received()[before:] if t.startswith("⚠️")), None)

        said = await eventually(refusal, timeout=30, what="the refusal of the typed answer")
        assert "not allowed" in said, said
        assert not (chat.state_dir / "workspace" / "contract.txt").exists()
        await chat.decide(shown, approve=False)
        await chat.wait_received("not run: guarded")


async def test_a_reload_that_allows_someone_applies_without_a_restart(chat: Chat) -> None:
    """[matrix] allowed_users changed and SIGHUP'd: applied live, the new person's
    devices trusted from the next sync, and no "needs restart to apply: matrix"."""
    owner, friend = chat.people
    async with chat.running() as bot:
        await chat.say("say:up")
        await chat.wait_received("echo: up")
        newcomer = "@newcomer:localhost"
        (chat.state_dir / "test.toml").write_text(f"""
[matrix]
enabled = true
homeserver = "{chat.homeserver}"
user_id = "{chat.account.user_id}"
allowed_users = ["{owner.user_id}", "{friend.user_id}", "{newcomer}"]
approvers = ["{owner.user_id}"]
{TOOLS}""")
        restart = await bot.daemon.reload()
        assert not any("matrix" in change for change in restart), restart
        channel = next(c for c in bot.daemon.channels if c.name == "matrix")
        assert newcomer in channel.syncer.trusted  # type: ignore[attr-defined]
        assert await bot.daemon.runtime.access.is_allowed("matrix", newcomer)


async def test_an_invite_from_a_stranger_is_refused(chat: Chat, synapse: Synapse) -> None:
    stranger = Person(synapse, "stranger", chat.state_dir.parent / "stranger")
    try:
        async with chat.running():
            await chat.say("say:up")
            await chat.wait_received("echo: up")
            created = await stranger.client.room_create(invite=[chat.bot_id])
            room_id = created.room_id
            path = (f"/_matrix/client/v3/rooms/{quote(room_id)}/state/m.room.member/"
                    f"{quote(chat.bot_id)}")  # fmt: skip

            def membership() -> str:
                url = stranger.client.homeserver + path
                return str(api("GET", url, stranger.client.access_token)["membership"])

            async def left() -> bool:
                return await asyncio.to_thread(membership) == "leave"

            await eventually(left, timeout=15, what="the bot refused the stranger's invite")
    finally:
        await stranger.client.close()


async def test_a_stranger_pairs_in_a_direct_chat_while_a_code_waits(
    chat: Chat, synapse: Synapse
) -> None:
    """With a code from `echo-bot pair` unused, a stranger's invite to a direct chat is
    taken: the bot says how to get in, the stranger sends the code there, and is then
    answered as any allowed user."""
    stranger = Person(synapse, "stranger", chat.state_dir.parent / "stranger")
    try:
        await stranger.step()
        async with chat.running() as bot, stranger.syncing():
            await chat.say("say:up")
            await chat.wait_received("echo: up")
            code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
            room_id = await open_room(stranger, [chat.bot_id])

            def said(text: str) -> bool:
                return any(text in t for t in stranger.received(room_id, chat.bot_id))

            await eventually(lambda: said("send here as `pair CODE`"), timeout=30,
                             what="the refusal that says how to pair")  # fmt: skip
            assert said(f"Your Matrix user ID is {stranger.user_id}")
            await eventually(lambda: chat.bot_id in stranger.client.rooms[room_id].users and
                             list(stranger.client.device_store.active_user_devices(chat.bot_id)),
                             timeout=30, what="the bot's device known")  # fmt: skip
            await stranger.say(room_id, f"pair {code}")
            await eventually(lambda: said("Paired. Welcome!"), timeout=30, what="paired")
            await stranger.say(room_id, "say:paired")
            await eventually(lambda: said("echo: paired"), timeout=30, what="answered")
    finally:
        await stranger.client.close()


async def test_an_undecryptable_message_is_answered_with_a_notice(chat: Chat) -> None:
    async with chat.running():
        await chat.say("say:first")
        await chat.wait_received("echo: first")
        # Encrypted with a Megolm session the bot never received a key for.
        bogus = {
            "algorithm": "m.megolm.v1.aes-sha2",
            "sender_key": "a" * 43,
            "ciphertext": "AwgAEnA" + "b" * 100,
            "session_id": "c" * 43,
            "device_id": "NOWHERE",
        }
        await asyncio.to_thread(send_raw, chat.owner, chat.room_id, "m.room.encrypted", bogus)
        got = await chat.wait_received("I could not decrypt your message")
        assert sum("could not decrypt" in t for t in got) == 1
        # Not an inbound, and the chat goes on.
        await chat.say("say:after")
        await chat.wait_received("echo: after")
        texts = await chat.inbound_texts()
        assert texts == ["say:first", "say:after"], texts


async def test_a_markdown_reply_arrives_as_sanitised_html(chat: Chat, state_dir: Path) -> None:
    async with chat.running():
        await chat.say("md:please")

        def formatted() -> dict[str, Any] | None:
            for _room, event in chat.owner.seen:
                content = event.source.get("content", {})
                mine = event.sender == chat.bot_id and "formatted_body" in content
                if mine and "bold" in content.get("body", ""):
                    return dict(content)
            return None

        content = await eventually(formatted, timeout=15, what="the Markdown reply")
        html = content["formatted_body"]
        assert content["format"] == "org.matrix.custom.html"
        assert "<strong>bold</strong>" in html and "<code>code</code>" in html
        assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
        assert "&lt;script&gt;" in html
        assert '<a href="https://example.org/">ok</a>' in html


async def test_hostile_input_neither_crashes_nor_loses_anything(chat: Chat) -> None:
    owner = chat.owner
    async with chat.running():
        await chat.say("say:ready")
        await chat.wait_received("echo: ready")
        room = chat.room_id
        [(not_a_prompt, _)] = owner.received_events(room, chat.bot_id)  # "echo: ready"
        huge = "say:huge " + "x" * 30_000
        await owner.say(room, huge)
        for kind, content in cast(list[tuple[str, dict[str, Any]]], [
            ("org.example.odd", {"anything": [1, 2, 3]}),
            ("m.room.message", {"msgtype": "m.text"}),  # no body
            ("m.room.message", {"body": 42, "msgtype": "m.text"}),  # not a string
            ("m.room.message", {"msgtype": "m.mystery", "body": "say:mystery"}),
            ("m.reaction", {"m.relates_to": {"rel_type": "m.annotation"}}),  # no target
            ("m.reaction", {"m.relates_to": {"rel_type": "m.annotation",
                                             "event_id": not_a_prompt, "key": "✅"}}),
        ]):  # fmt: skip
            # Encrypted: the homeserver cannot check what it cannot read (it refuses a
            # clear m.room.message without a string body), so the bot gets them all.
            await send_encrypted(owner, room, kind, content)
        await chat.say("say:after")
        received = await chat.wait_received("echo: huge", "echo: after")
        assert received.count("echo: after") == 1
        texts = await chat.inbound_texts()
        assert texts.count(huge) == 1  # whole, once
        assert texts[-1] == "say:after"
        assert chat.bot is not None
        health = next(c for c in chat.bot.daemon.channels if c.name == "matrix").health()
        assert health["status"] == "ok", health


async def test_an_edited_message_is_not_run_again(chat: Chat) -> None:
    """Element sends an edit as a new event (``m.replace``): the bot takes the message
    once, as on Telegram and Slack; the edit is no second turn (a second tool call)."""
    owner = chat.owner
    async with chat.running():
        said = await chat.say("say:first")
        await chat.wait_received("echo: first")
        await owner.say(
            chat.room_id, "* say:edited",
            **{"m.new_content": {"msgtype": "m.text", "body": "say:edited"},
               "m.relates_to": {"rel_type": "m.replace", "event_id": said}},
        )  # fmt: skip
        await chat.say("say:after")
        received = await chat.wait_received("echo: after")
        assert not [text for text in received if "edited" in text], received
        texts = await chat.inbound_texts()
        assert [t for t in texts if t.startswith(("say:", "* say:"))] == ["say:first", "say:after"]


async def test_the_bot_types_while_a_turn_runs(chat: Chat) -> None:
    brain = chat.brain = HeldBrain()
    async with chat.running():
        await chat.say("hold:on")

        def typing() -> list[str]:
            room = chat.owner.client.rooms.get(chat.room_id)
            return list(room.typing_users) if room is not None else []

        await eventually(lambda: chat.bot_id in typing(), timeout=15, what="the bot typing")
        brain.release.set()
        await chat.wait_received("released")
        await eventually(lambda: chat.bot_id not in typing(), timeout=15, what="typing ended")


async def test_a_first_login_by_password_keeps_its_device_in_private_files(
    synapse: Synapse, state_dir: Path
) -> None:
    user = unique("pwbot")
    account = await asyncio.to_thread(synapse.register, user, "first-password")
    config = f"""
[matrix]
enabled = true
homeserver = "{synapse.url}"
user_id = "{account.user_id}"
password_env = "MX_PASSWORD"
device_name = "echo-bot test"
"""
    devices = []
    for _run in range(2):  # the second run uses what the first login kept
        async with running_bot(
            state_dir, config, environ={"MX_PASSWORD": "first-password"}, channels=["matrix"],
            channel_options={"matrix": {"sync_timeout": 1}},
        ) as bot:  # fmt: skip
            channel = next(c for c in bot.daemon.channels if c.name == "matrix")
            devices.append(channel.client.device_id)  # type: ignore[attr-defined]
    assert devices[0] and devices[0] == devices[1], devices
    directory = state_dir / "matrix"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    kept = json.loads((directory / "login.json").read_text())
    assert kept["device_id"] == devices[0]
    files = [p for p in directory.iterdir() if p.is_file()]
    assert any(p.suffix == ".db" for p in files), files  # the key store
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), files


LONG = "".join(f"line {n:03d}: the quick brown fox jumps over the lazy dog. " for n in range(75))


class LongBrain(ContractBrain):
    """``long:`` → a file_write of 4,500 characters, too long for a chat prompt."""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "user" and (last.content or "").startswith("long:"):
            call = ToolCall(id=new_id(), name="file_write", args={"path": "l.txt", "content": LONG})
            return BrainReply(tool_calls=[call], route_reason="test: a long call")
        if last.role == "tool":
            return BrainReply(text=f"tool: {last.content}", route_reason="test: report")
        return await super().step(conversation, tools, context)


async def test_a_call_too_long_to_show_offers_deny_only_and_links_to_the_console(
    synapse: Synapse, state_dir: Path
) -> None:
    made = Chat(state_dir, synapse)
    made.brain = LongBrain()
    made.extra = "[http]\nport = 0\n[console]\nenabled = true\n"
    async with made.peer(), made.running():
        await made.say("long:")
        shown = await made.prompt()
        assert "React ❌ to deny — or reply `deny` to this message." in shown.text
        assert "✅" not in shown.text and LONG not in shown.text
        link = re.search(r"https?://\S+/console/approvals/([0-9a-f]{32})", shown.text)
        assert link is not None, shown.text
        await made.owner.react(made.room_id, shown.handle, "✅", encrypted=True)
        await made.wait_received("⚠️ That answer is not one this request offers.")
        assert not (state_dir / "workspace" / "l.txt").exists()
        await made.decide(shown, approve=False)
        await made.wait_received("tool:")
        assert not (state_dir / "workspace" / "l.txt").exists()


# -- config ---------------------------------------------------------------------------------
def test_matrix_config_rejects_unknown_keys_and_bad_ids() -> None:
    with pytest.raises(ConfigError, match=r"matrix\.tokn_env: unknown key"):
        parse_config({"matrix": {"tokn_env": "X"}})
    with pytest.raises(ConfigError, match="not a Matrix user ID"):
        parse_config({"matrix": {"allowed_users": ["bob"]}})
    with pytest.raises(ConfigError, match=r"matrix\.homeserver"):
        parse_config({"matrix": {"homeserver": "ftp://example.org"}})
    with pytest.raises(ConfigError, match="user_id is needed"):
        parse_config({"matrix": {"enabled": True}})


def test_matrix_approvers_default_to_allowed_users_and_secrets_are_named() -> None:
    config = parse_config(
        {"matrix": {"enabled": True, "user_id": "@bot:example.org",
                    "allowed_users": ["@me:example.org"], "password_env": "MX_PASSWORD"}}
    )  # fmt: skip
    assert channel_section(config, "matrix").approver_ids == ["@me:example.org"]
    loaded = LoadedConfig(config=config, path=Path("x.toml"))
    assert dict(secrets_in_use(loaded, {})) == {"MATRIX_ACCESS_TOKEN": False, "MX_PASSWORD": False}
    assert Address.parse("matrix:!room:example.org").chat_id == "!room:example.org"


# -- answers and HTML, without a homeserver -------------------------------------------------
def test_answers_to_a_prompt_are_read_and_a_deny_only_prompt_offers_deny_only() -> None:
    from echo_bot.events import DecisionVerb
    from echo_bot.prompt_answers import instructions, verb_of_reaction, verb_of_reply

    assert verb_of_reaction("✅\ufe0f") == DecisionVerb.APPROVE_ONCE  # Element's variant
    assert verb_of_reaction("👍") is None
    assert verb_of_reply("> <@bot:x> Request …\n\nApprove!") == DecisionVerb.APPROVE_ONCE
    assert verb_of_reply("approved it? no idea") is None
    assert verb_of_reply("> <@bot:x> Request …\n\nyes but what does it do?") is None
    assert verb_of_reply("\n  No.\nI'd rather not") == DecisionVerb.DENY  # its first line
    deny_only = instructions(["deny:" + "a" * 32])
    assert "✅" not in deny_only and "approve" not in deny_only and "❌" in deny_only


def test_the_html_has_only_the_spans_tags_and_every_text_escaped() -> None:
    from channels.matrix.formatting import TEXT
    from echo_bot.richtext.parts import message_parts

    hostile = '<p onclick="x()">a<iframe src=//e></iframe>[b](javascript:x) **c**'
    [content] = message_parts(hostile, True, None, TEXT)
    assert content["formatted_body"] == (
        '&lt;p onclick="x()"&gt;a&lt;iframe src=//e&gt;&lt;/iframe&gt;'
        "[b](javascript:x) <strong>c</strong>"
    )
    parts = message_parts("word " * 10_000, False, None, TEXT)
    assert all(len(p["body"]) <= 16_000 for p in parts)
    assert "".join(p["body"] for p in parts).count("word") == 10_000
