"""The Telegram channel: the real aiogram client against a fake Bot API server.

Every test asserts what a Telegram user would see: the Bot API calls the fake recorded
(messages sent and edited, button presses answered, chat actions), plus the store where
"nothing reached the agent" or "marked failed" is the point.
"""

from __future__ import annotations

import asyncio
import re
import time
import tomllib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from echo_bot.app import Daemon
from echo_bot.brains.base import Brain, BrainContext, BrainReply
from echo_bot.config import LoadedConfig, parse_config
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.errors import ConfigError
from echo_bot.events import (
    Address,
    Button,
    InboundKind,
    InboundMessage,
    OutboundMessage,
    new_id,
)
from echo_bot.runtime import build
from echo_bot.tools.base import Tool
from tests.conftest import Bot, inbound_of, running_bot
from tests.fakes.telegram_api import Call, FakeTelegramAPI, RateLimits, utf16_len
from tests.waiting import eventually

TOKEN = "123456:TEST-token-value"
OWNER = 42
FRIEND = 7  # allowed in some tests
STRANGER = 77  # never configured
SECRET = "hook-secret_123"
RAN = "ran.txt"
RUN_ONCE = f'/run sh -c "echo x >> {RAN}"'  # appends one line per run: counts the runs
APPROVE_ONCE = re.compile(r"approve_once:[0-9a-f]{32}")
DENY = re.compile(r"deny:[0-9a-f]{32}")


def telegram_config(
    api: FakeTelegramAPI,
    extra: str = "",
    *,
    allowed: Sequence[int] = (OWNER,),
    telegram: str = "",
    http: str = "",
) -> str:
    return f"""
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{", ".join(str(u) for u in allowed)}]
{telegram}
[http]
enabled = true
port = 0
{http}
[tools]
profile = "coding"
[tools.shell]
enabled = true
{extra}
"""


@asynccontextmanager
async def telegram_bot(
    state_dir: Path,
    extra: str = "",
    *,
    allowed: Sequence[int] = (OWNER,),
    telegram: str = "",
    brain: Brain | None = None,
    tools: Sequence[Tool] = (),
    environ: dict[str, str] | None = None,
    api: FakeTelegramAPI | None = None,
    api_options: dict[str, Any] | None = None,
    http: str = "",
) -> AsyncIterator[tuple[Bot, FakeTelegramAPI]]:
    """The daemon with the Telegram channel on, against a fake Bot API (``api`` to reuse
    one across restarts; otherwise a new one built with ``api_options``)."""
    if api is None:
        async with (
            FakeTelegramAPI(token=TOKEN, **(api_options or {})) as own,
            telegram_bot(
                state_dir,
                extra,
                allowed=allowed,
                telegram=telegram,
                brain=brain,
                tools=tools,
                environ=environ,
                api=own,
                http=http,
            ) as pair,
        ):
            yield pair
        return
    async with running_bot(
        state_dir,
        telegram_config(api, extra, allowed=allowed, telegram=telegram, http=http),
        environ={"TELEGRAM_BOT_TOKEN": TOKEN, **(environ or {})},
        channels=["telegram"],
        channel_options={"telegram": {"poll_timeout": 1}},
        brain=brain,
        tools=tools,
    ) as bot:
        yield bot, api


# -- helpers --------------------------------------------------------------------------------
def replied_to(call: Call) -> int | None:
    params = call.params.get("reply_parameters")
    if isinstance(params, dict) and "message_id" in params:
        return int(params["message_id"])
    return None


def text_of(call: Call) -> str:
    return str(call.params.get("text", ""))


def chat_of(call: Call) -> int:
    return int(call.params["chat_id"])


def sent_id(call: Call) -> int:
    assert call.response is not None
    return int(call.response["result"]["message_id"])


def sends(api: FakeTelegramAPI, chat_id: int | None = None, *, ok: bool = True) -> list[Call]:
    return [
        c
        for c in api.calls
        if c.method == "sendMessage"
        and (c.ok or not ok)
        and (chat_id is None or chat_of(c) == chat_id)
    ]


def replies(api: FakeTelegramAPI, message_id: int, chat_id: int = OWNER) -> list[Call]:
    return [c for c in sends(api, chat_id) if replied_to(c) == message_id]


def say(api: FakeTelegramAPI, text: str, **kwargs: Any) -> int:
    """A user writes ``text``; returns the Telegram message id of what they wrote."""
    api.push_message(text, **kwargs)
    return int(api.pushed_updates[-1]["message"]["message_id"])


async def reply_to(
    api: FakeTelegramAPI,
    message_id: int,
    contains: str = "",
    *,
    chat_id: int = OWNER,
    timeout: float = 10.0,
) -> Call:
    return await api.wait_for_call(
        "sendMessage",
        lambda c: (
            c.ok
            and chat_of(c) == chat_id
            and replied_to(c) == message_id
            and contains in text_of(c)
        ),
        timeout,
    )


async def barrier(api: FakeTelegramAPI, user_id: int = OWNER, **kwargs: Any) -> None:
    """Send a message through the agent and wait for its answer: turns and outbound of
    this chat are handled in order, so whatever came before is done by now."""
    message_id = say(api, "what time is it?", user_id=user_id, **kwargs)
    chat_id = kwargs.get("chat_id", user_id)
    await reply_to(api, message_id, "It is", chat_id=chat_id)


def keyboard(call: Call) -> list[tuple[str, str]]:
    markup = call.params.get("reply_markup") or {}
    return [
        (button["text"], button["callback_data"])
        for row in markup.get("inline_keyboard", [])
        for button in row
    ]


def action(call: Call, verb: str) -> str:
    return next(data for _label, data in keyboard(call) if data.startswith(verb + ":"))


async def prompt_in(api: FakeTelegramAPI, chat_id: int = OWNER, *, after: int = 0) -> Call:
    """The next approval prompt (a message with an inline keyboard) sent to ``chat_id``."""
    return await api.wait_for_call(
        "sendMessage",
        lambda c: c.ok and chat_of(c) == chat_id and bool(keyboard(c)),
        after=after,
    )


def press(
    api: FakeTelegramAPI,
    data: str,
    message_id: int | None,
    *,
    user_id: int = OWNER,
    chat_id: int | None = None,
) -> str:
    _update_id, callback_id = api.push_callback(
        data, user_id=user_id, message_id=message_id, chat_id=chat_id
    )
    return callback_id


async def answer_of(api: FakeTelegramAPI, callback_id: str) -> str:
    call = await api.wait_for_call(
        "answerCallbackQuery", lambda c: c.params.get("callback_query_id") == callback_id
    )
    assert call.ok
    return str(call.params.get("text") or "")


def edits(api: FakeTelegramAPI, message_id: int, chat_id: int = OWNER) -> list[Call]:
    return [
        c
        for c in api.calls_of("editMessageText")
        if c.ok and chat_of(c) == chat_id and int(c.params["message_id"]) == message_id
    ]


async def edited(
    api: FakeTelegramAPI, message_id: int, starts: str, chat_id: int = OWNER
) -> dict[str, Any]:
    """Wait for the edit of a message that makes it start with ``starts``; its new state."""
    await api.wait_for_call(
        "editMessageText",
        lambda c: (
            c.ok
            and chat_of(c) == chat_id
            and int(c.params["message_id"]) == message_id
            and text_of(c).startswith(starts)
        ),
    )
    state = api.message(chat_id, message_id)
    assert state is not None
    return state


async def approval_status(bot: Bot, data: str) -> str:
    request_id = data.split(":")[1]
    row = await bot.store.run(lambda tx: tx.approvals.get(request_id))
    assert row is not None, f"no approval {request_id}"
    return str(row.status)


async def inbound(bot: Bot) -> list[InboundMessage]:
    """Every inbound of the Telegram channel, oldest first."""
    return await bot.store.run(lambda tx: inbound_of(tx, "telegram"))


async def failed_outbound(bot: Bot) -> int:
    return (await bot.store.run(lambda tx: tx.meta.queue_counts()))["outbox_failed"]


def ran(bot: Bot) -> str | None:
    path = bot.state_dir / "workspace" / RAN
    return path.read_text() if path.exists() else None


def raw_message(
    chat_id: int, message_id: int, user_id: int = OWNER, **content: Any
) -> dict[str, Any]:
    chat: dict[str, Any] = {"id": chat_id, "type": "private", "first_name": "User"}
    return {
        "message_id": message_id,
        "date": int(time.time()),
        "chat": chat,
        "from": {"id": user_id, "is_bot": False, "first_name": "User"},
        **content,
    }


# -- a chat --------------------------------------------------------------------------------
async def test_chat_round_trip(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        update_id = api.push_message("what time is it?", user_id=OWNER)
        call = await api.wait_for_call("sendMessage", lambda c: "It is" in c.params.get("text", ""))
        assert int(call.params["chat_id"]) == OWNER
        assert call.params.get("reply_parameters")
        assert update_id


class GateBrain:
    """Answers only when the test opens the gate: a turn that is visibly running."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        self.entered.set()
        await self.release.wait()
        return BrainReply(text=f"done: {conversation[-1].content}", route_reason="test: gate")


async def test_reply_goes_to_the_same_chat_as_a_reply_and_typing_shows_meanwhile(
    state_dir: Path,
) -> None:
    brain = GateBrain()
    async with telegram_bot(state_dir, brain=brain) as (_bot, api):
        message_id = say(api, "hello there", user_id=OWNER)
        typing = await api.wait_for_call(
            "sendChatAction", lambda c: c.params.get("action") == "typing"
        )
        assert chat_of(typing) == OWNER
        await asyncio.wait_for(brain.entered.wait(), 10)
        assert sends(api) == []  # the turn is still running: nothing answered yet
        brain.release.set()

        reply = await reply_to(api, message_id, "done: hello there")
        assert chat_of(reply) == OWNER
        assert replied_to(reply) == message_id
        stored = api.message(OWNER, sent_id(reply))
        assert stored is not None
        assert stored["reply_to_message_id"] == message_id
        assert api.calls.index(typing) < api.calls.index(reply)
        assert len(replies(api, message_id)) == 1


async def test_forum_topic_message_is_answered_in_the_same_thread(state_dir: Path) -> None:
    brain = GateBrain()
    async with telegram_bot(state_dir, brain=brain) as (_bot, api):
        group = -(10**12 + OWNER)
        # A mention, not a command: commands are answered before any brain is asked.
        message_id = say(api, "@echo_test_bot news?", chat_type="supergroup", message_thread_id=5)
        typing = await api.wait_for_call("sendChatAction")
        assert chat_of(typing) == group and typing.params.get("message_thread_id") == 5
        brain.release.set()
        reply = await reply_to(api, message_id, "done: news?", chat_id=group)
        assert reply.params.get("message_thread_id") == 5
        stored = api.message(group, sent_id(reply))
        assert stored is not None
        assert stored["message_thread_id"] == 5


# -- who may talk ---------------------------------------------------------------------------
async def test_unknown_user_is_refused_once_with_their_id_and_nothing_reaches_the_agent(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        first = say(api, "hello, who are you?", user_id=STRANGER)
        refusal = await reply_to(api, first, chat_id=STRANGER)
        assert str(STRANGER) in text_of(refusal)
        assert "allowed" in text_of(refusal)

        say(api, "please answer me", user_id=STRANGER)
        whoami = say(api, "/whoami", user_id=STRANGER)
        await reply_to(api, whoami, chat_id=STRANGER)  # answered after anything earlier
        texts = [text_of(c) for c in sends(api, STRANGER)]
        assert len(texts) == 2, texts
        assert texts[0] == text_of(refusal)

        stored = await inbound(bot)
        assert not [m for m in stored if m.kind == "message" and m.sender.id == str(STRANGER)]
        assert not [c for c in api.calls_of("sendChatAction") if chat_of(c) == STRANGER]


async def test_whoami_answers_anyone_with_their_id(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        stranger = say(api, "/whoami", user_id=STRANGER)
        owner = say(api, "/whoami", user_id=OWNER)
        assert f"is {STRANGER}." in text_of(await reply_to(api, stranger, chat_id=STRANGER))
        assert f"is {OWNER}." in text_of(await reply_to(api, owner))


async def test_pairing_lets_a_stranger_talk_but_never_approve(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
        before = say(api, "hi", user_id=STRANGER)
        await reply_to(api, before, "allowed", chat_id=STRANGER)

        paired = say(api, f"/pair {code}", user_id=STRANGER)
        assert "Paired" in text_of(await reply_to(api, paired, chat_id=STRANGER))
        again = say(api, f"/pair {code}", user_id=STRANGER)
        assert "already" in text_of(await reply_to(api, again, chat_id=STRANGER))
        await barrier(api, STRANGER)

        # A paired user is no approver (approvers are unset: the config's allowed_users),
        # and with no default_chat no chat can ask an approver: the request waits for
        # `echo-bot approvals`, and the paired user is told so.
        say(api, RUN_ONCE, user_id=STRANGER)
        await api.wait_for_call(
            "sendMessage",
            lambda c: chat_of(c) == STRANGER and "waits for the owner" in text_of(c),
        )
        assert not [c for c in api.calls if c.method == "sendMessage" and keyboard(c)]
        approvals = await bot.store.run(lambda tx: tx.approvals.list(status=None))
        assert [(a.prompt_to, a.status) for a in approvals] == [("echo-bot:approvals", "pending")]
        assert ran(bot) is None


async def test_pairing_refuses_wrong_used_and_expired_codes(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
        old = await bot.store.run(lambda tx: tx.access.new_pairing_code(now=time.time() - 700))

        wrong = say(api, "/pair ABCD-EFGH", user_id=STRANGER)
        assert "not valid" in text_of(await reply_to(api, wrong, chat_id=STRANGER))
        expired = say(api, f"/pair {old}", user_id=STRANGER)
        assert "not valid" in text_of(await reply_to(api, expired, chat_id=STRANGER))

        used = say(api, f"/pair {code}", user_id=FRIEND)
        assert "Paired" in text_of(await reply_to(api, used, chat_id=FRIEND))
        reuse = say(api, f"/pair {code}", user_id=STRANGER)
        assert "not valid" in text_of(await reply_to(api, reuse, chat_id=STRANGER))

        still_out = say(api, "hello?", user_id=STRANGER)
        await reply_to(api, still_out, "allowed", chat_id=STRANGER)
        paired = await bot.store.run(lambda tx: tx.access.paired_users())
        assert sorted(u.user_id for u in paired if u.channel == "telegram") == [str(FRIEND)]


async def test_five_wrong_codes_lock_the_user_out_even_for_the_right_code(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
        answers = []
        for n in range(5):
            message_id = say(api, f"/pair WRNG-COD{n + 2}", user_id=STRANGER)
            answers.append(text_of(await reply_to(api, message_id, chat_id=STRANGER)))
        assert all("not valid" in a for a in answers[:4]), answers
        assert "Too many" in answers[4]

        right = say(api, f"/pair {code}", user_id=STRANGER)
        assert "Too many" in text_of(await reply_to(api, right, chat_id=STRANGER))
        assert await bot.store.run(lambda tx: tx.access.paired_users()) == []
        # The code itself was not spent by the refused try: someone else may still use it.
        other = say(api, f"/pair {code}", user_id=FRIEND)
        assert "Paired" in text_of(await reply_to(api, other, chat_id=FRIEND))


# -- approvals with inline buttons ----------------------------------------------------------
async def test_approve_once_runs_once_and_edits_the_prompt(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        data = [d for _label, d in keyboard(prompt)]
        assert any(APPROVE_ONCE.fullmatch(d) for d in data)
        assert any(DENY.fullmatch(d) for d in data)
        assert all(len(d.encode()) <= 64 for d in data)
        assert "shell_exec" in text_of(prompt)
        assert "echo x >> ran.txt" in text_of(prompt)
        assert ran(bot) is None

        callback = press(api, action(prompt, "approve_once"), sent_id(prompt))
        answer = await answer_of(api, callback)
        assert not answer.startswith("⚠️"), answer
        state = await edited(api, sent_id(prompt), "✅ Approved")
        assert state["reply_markup"] is None
        reply = await reply_to(api, run, "exit code 0")
        await barrier(api)

        assert ran(bot) == "x\n"
        assert replies(api, run) == [reply]
        assert len(edits(api, sent_id(prompt))) == 1
        assert await approval_status(bot, action(prompt, "approve_once")) == "approved"


async def test_deny_edits_the_prompt_and_nothing_runs(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        callback = press(api, action(prompt, "deny"), sent_id(prompt))
        await answer_of(api, callback)
        state = await edited(api, sent_id(prompt), "❌ Denied")
        assert state["reply_markup"] is None
        await reply_to(api, run, "APPROVAL_DENIED")
        await barrier(api)
        assert ran(bot) is None
        assert len(replies(api, run)) == 1
        assert await approval_status(bot, action(prompt, "deny")) == "denied"


async def test_expired_request_says_so_and_a_late_press_is_refused(state_dir: Path) -> None:
    async with telegram_bot(state_dir, '[approvals]\ntimeout = "1s"') as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        state = await edited(api, sent_id(prompt), "⌛ Expired")
        assert state["reply_markup"] is None
        await reply_to(api, run, "APPROVAL_EXPIRED")

        late = press(api, action(prompt, "approve_once"), sent_id(prompt))
        answer = await answer_of(api, late)
        assert "expired" in answer.lower() or "decided" in answer.lower(), answer
        await barrier(api)
        assert ran(bot) is None
        assert all(not text_of(c).startswith("✅") for c in api.calls_of("editMessageText"))
        stored = api.message(OWNER, sent_id(prompt))
        assert stored is not None
        assert stored["plain_text"].startswith("⌛ Expired")
        assert await approval_status(bot, action(prompt, "approve_once")) == "expired"


async def test_double_press_decides_once(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        data = action(prompt, "approve_once")
        first = press(api, data, sent_id(prompt))
        second = press(api, data, sent_id(prompt))
        answers = [await answer_of(api, first), await answer_of(api, second)]
        assert sum("already decided" in a.lower() for a in answers) == 1, answers

        await reply_to(api, run, "exit code 0")
        after_first = await answer_of(api, press(api, data, sent_id(prompt)))
        assert "already decided" in after_first.lower()
        await barrier(api)
        assert ran(bot) == "x\n"
        assert len(replies(api, run)) == 1
        approved = [c for c in edits(api, sent_id(prompt)) if text_of(c).startswith("✅ Approved")]
        assert len(approved) == 1


async def test_a_non_approver_press_is_refused_and_changes_nothing(state_dir: Path) -> None:
    async with telegram_bot(
        state_dir, allowed=(OWNER, FRIEND), telegram=f"approvers = [{OWNER}]"
    ) as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        data = action(prompt, "approve_once")
        answer = await answer_of(
            api, press(api, data, sent_id(prompt), user_id=FRIEND, chat_id=OWNER)
        )
        assert "not allowed" in answer
        assert await approval_status(bot, data) == "pending"
        # Refused before the store: no decision row, nothing for the gate to refuse.
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=200))
        assert not [r for r in rows if r.kind == "approval.refused"]
        assert edits(api, sent_id(prompt)) == []
        assert ran(bot) is None
        assert replies(api, run) == []

        await answer_of(api, press(api, data, sent_id(prompt)))
        await reply_to(api, run, "exit code 0")
        await edited(api, sent_id(prompt), "✅ Approved")
        assert ran(bot) == "x\n"


async def test_forged_and_foreign_callback_data_is_refused(state_dir: Path) -> None:
    async with telegram_bot(state_dir, allowed=(OWNER, FRIEND)) as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        data = action(prompt, "approve_once")
        for forged in ("approve_once:" + "0" * 32, "rm -rf", "x" * 64, data + ":60", data[:-1]):
            answer = await answer_of(api, press(api, forged, sent_id(prompt)))
            assert "Unknown or expired request." in answer, (forged, answer)

        # FRIEND approves in their own chat, but this request was asked in the owner's.
        friend_message = say(api, "what time is it?", user_id=FRIEND)
        friend_reply = await reply_to(api, friend_message, chat_id=FRIEND)
        answer = await answer_of(
            api, press(api, data, sent_id(friend_reply), user_id=FRIEND, chat_id=FRIEND)
        )
        assert "not allowed" in answer

        assert await approval_status(bot, data) == "pending"
        assert api.calls_of("editMessageText") == []
        assert ran(bot) is None
        assert replies(api, run) == []
        assert len([c for c in sends(api, OWNER) if keyboard(c)]) == 1

        await answer_of(api, press(api, data, sent_id(prompt)))  # the real press still works
        await reply_to(api, run, "exit code 0")
        assert ran(bot) == "x\n"


async def test_a_callback_without_a_message_is_answered_and_the_bot_goes_on(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        data = action(prompt, "approve_once")
        answer = await answer_of(api, press(api, data, None))
        assert answer
        assert await approval_status(bot, data) == "pending"
        await barrier(api)
        assert ran(bot) is None


class TwinCallsBrain:
    """Asks for the same dangerous call three times in one step, then reports."""

    name = "twins"

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        if conversation and conversation[-1].role == "tool":
            return BrainReply(text="twins finished", route_reason="test: report")
        args = {"command": "touch twins.txt"}
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name="shell_exec", args=dict(args)) for _ in "abc"],
            route_reason="test: three identical calls",
        )


async def test_identical_calls_in_one_turn_produce_one_prompt(state_dir: Path) -> None:
    async with telegram_bot(state_dir, brain=TwinCallsBrain()) as (bot, api):
        message_id = say(api, "touch it three times")
        prompt = await prompt_in(api)
        await answer_of(api, press(api, action(prompt, "approve_once"), sent_id(prompt)))
        await reply_to(api, message_id, "twins finished")
        assert len([c for c in sends(api) if keyboard(c)]) == 1
        assert (bot.state_dir / "workspace" / "twins.txt").exists()


async def test_approvals_command_shows_the_pending_prompt_again_with_buttons(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        run = say(api, RUN_ONCE)
        prompt = await prompt_in(api)
        after = len(api.calls)
        listing = say(api, "/approvals")
        summary = await reply_to(api, listing, "1 pending")
        again = await prompt_in(api, after=after)
        assert again is not prompt and sent_id(again) != sent_id(prompt)
        assert keyboard(again) == keyboard(prompt)
        request_id = action(prompt, "approve_once").split(":")[1]
        assert request_id in text_of(summary) and "shell_exec" in text_of(again)

        await answer_of(api, press(api, action(again, "approve_once"), sent_id(again)))
        await reply_to(api, run, "exit code 0")
        await edited(api, sent_id(prompt), "✅ Approved")
        assert ran(bot) == "x\n"


# -- delivery under Telegram's limits and errors --------------------------------------------
async def test_a_429_is_waited_out_and_the_reply_arrives_once(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        api.fail_next("sendMessage", status=429, retry_after=1)
        message_id = say(api, "what time is it?")
        await reply_to(api, message_id, "It is")
        await barrier(api)
        limited = [c for c in sends(api, ok=False) if c.status == 429]
        assert len(limited) == 1 and replied_to(limited[0]) == message_id
        assert len(replies(api, message_id)) == 1


class FixedTextBrain:
    """Answers every message with ``text`` (but the barrier's question as the rules do)."""

    name = "fixed"

    def __init__(self, text: str) -> None:
        self.text = text

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        if conversation[-1].content == "what time is it?":
            return BrainReply(text="It is now.", route_reason="test: barrier")
        return BrainReply(text=self.text, route_reason="test: fixed text")


def long_text() -> str:
    paragraphs = []
    for p in range(16):
        lines = [f"paragraph {p} line {n} " + "abcdefghij" * (n % 7 + 1) for n in range(12)]
        paragraphs.append("\n".join(lines))
    text = "\n\n".join(paragraphs)
    assert len(text) > 10_000
    return text


async def test_a_long_reply_is_split_on_line_boundaries(state_dir: Path) -> None:
    text = long_text()
    async with telegram_bot(state_dir, brain=FixedTextBrain(text)) as (_bot, api):
        message_id = say(api, "tell me everything")
        await reply_to(api, message_id)
        await barrier(api)
        parts = [c for c in sends(api) if text_of(c).startswith("paragraph")]
        assert len(parts) >= 3
        assert replied_to(parts[0]) == message_id
        assert all(utf16_len(text_of(c)) <= 4096 for c in parts)
        lines = set(text.split("\n"))
        for call in parts:
            assert set(text_of(call).strip("\n").split("\n")) <= lines  # no line cut in two
        joined = "".join(text_of(c) for c in parts)
        assert joined.replace("\n", "") == text.replace("\n", "")


async def test_long_text_with_buttons_carries_them_on_the_last_part_only(
    state_dir: Path,
) -> None:
    text = long_text()
    async with telegram_bot(state_dir) as (bot, api):
        assert bot.daemon.bus is not None
        await bot.daemon.bus.send(
            OutboundMessage(
                to=Address(channel="telegram", chat_id=str(OWNER)),
                text=text,
                buttons=[[Button(label="OK", action="ok:1"), Button(label="Big", action="b" * 65)]],
            )
        )
        await barrier(api)
        parts = [c for c in sends(api) if text_of(c).startswith("paragraph")]
        assert [bool(keyboard(c)) for c in parts] == [False] * (len(parts) - 1) + [True]
        assert keyboard(parts[-1]) == [("OK", "ok:1")]  # over 64 bytes: left out


async def test_an_interrupted_split_reply_resumes_without_repeating_parts(
    state_dir: Path,
) -> None:
    text = long_text()
    limits = RateLimits(per_chat_burst=2)  # the third part meets a 429
    async with telegram_bot(
        state_dir,
        brain=FixedTextBrain(text),
        api_options={"enforce_limits": True, "limits": limits},
    ) as (_bot, api):
        say(api, "tell me everything")
        await api.wait_for_call("sendMessage", lambda c: c.status == 429)
        await api.wait_for_calls("sendMessage", 3, lambda c: c.ok)
        await barrier(api)
        parts = [text_of(c) for c in sends(api) if text_of(c).startswith("paragraph")]
        assert len(parts) == len(set(parts)) >= 3
        assert "".join(parts).replace("\n", "") == text.replace("\n", "")


async def test_a_reply_of_wide_characters_fits_telegrams_utf16_limit(state_dir: Path) -> None:
    text = "🙂" * 3000 + "\n" + "𝕏" * 3000  # each one is two UTF-16 code units
    async with telegram_bot(state_dir, brain=FixedTextBrain(text)) as (bot, api):
        message_id = say(api, "emoji please")
        await reply_to(api, message_id)
        await barrier(api)
        parts = [text_of(c) for c in sends(api) if text_of(c)[:1] in ("🙂", "𝕏")]
        assert all(utf16_len(p) <= 4096 for p in parts)
        assert "".join(parts).replace("\n", "") == text.replace("\n", "")
        assert await failed_outbound(bot) == 0


async def test_odd_and_oversized_text_from_a_user_is_answered(state_dir: Path) -> None:
    texts = [
        "x" * 5000,
        "🙂" * 2500,
        "\u202eRTL override\u202c مرحبا بالعالم שלום עולם",
        "zero\u200bwidth\u200d joiner\ufeff and\u2060 friends",
        "lone \ud83d high surrogate",
        "\udc00 lone low surrogate",
        "/\ud800",
        "e\u0301\u0301\u0301 combining, \x00 nul, \x7f del",
    ]
    users = [100 + n for n in range(len(texts))]  # one chat each: no pacing between them
    async with telegram_bot(state_dir, allowed=users) as (_bot, api):
        sent = []
        for user, text in zip(users, texts, strict=True):
            command = [{"type": "bot_command", "offset": 0, "length": 2}]  # the fake can't count it
            entities = command if text[0] == "/" else None
            sent.append(say(api, text, user_id=user, entities=entities))
        for user, message_id in zip(users, sent, strict=True):
            await reply_to(api, message_id, chat_id=user)
        for user in users:
            await barrier(api, user)
            assert len(sends(api, user)) == 2


async def test_updates_of_every_kind_are_answered_or_left_without_a_crash(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        await api.wait_for_call("getUpdates")
        photo = raw_message(
            OWNER,
            1000,
            photo=[{"file_id": "p1", "file_unique_id": "u1", "width": 90, "height": 90}],
        )
        sticker = raw_message(
            OWNER,
            1001,
            sticker={
                "file_id": "s1",
                "file_unique_id": "us1",
                "type": "regular",
                "width": 512,
                "height": 512,
                "is_animated": False,
                "is_video": False,
            },
        )
        api.push_update({"message": photo})  # a file the fake does not have: a clear note
        notice = await reply_to(api, 1000, "could not download your photo")
        api.push_update({"message": sticker})
        await reply_to(api, 1001)
        api.push_update({"edited_message": raw_message(OWNER, 1000, text="what time is it?")})
        api.push_update(
            {
                "channel_post": {
                    "message_id": 5,
                    "date": int(time.time()),
                    "chat": {"id": -100123, "type": "channel", "title": "news"},
                    "text": "hello channel",
                }
            }
        )
        api.push_update({"future_update_type": {"id": 1, "anything": [1, 2]}})
        await barrier(api)
        assert chat_of(notice) == OWNER
        texts = [text_of(c) for c in sends(api)]
        assert len(texts) == 3, texts  # photo note, sticker answer, the barrier's reply


async def test_a_400_marks_the_message_failed_and_the_next_reply_goes_out(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        api.fail_next("sendMessage", status=400, description="Bad Request: chat not found")
        lost = say(api, "what time is it?")
        await api.wait_for_call("sendMessage", lambda c: c.status == 400)

        async def failed() -> bool:
            return await failed_outbound(bot) == 1

        await eventually(failed)
        await barrier(api)
        assert replies(api, lost) == []
        assert len([c for c in sends(api, ok=False) if replied_to(c) == lost]) == 1

        async def settled() -> bool:
            stored = await bot.store.run(lambda tx: tx.outbox.deliveries())
            return sorted(d.status for d in stored) == ["failed", "sent"]

        await eventually(settled)


async def test_a_user_who_blocked_the_bot_is_not_retried_forever(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        api.block_chat(OWNER)
        lost = say(api, "what time is it?")
        await api.wait_for_call("sendMessage", lambda c: c.status == 403)

        async def failed() -> bool:
            rows = await bot.store.run(lambda tx: tx.outbox.deliveries("failed"))
            return len(rows) == 1 and "forbidden" in (rows[0].last_error or "")

        await eventually(failed)
        api.unblock_chat(OWNER)
        await barrier(api)
        assert len([c for c in sends(api, ok=False) if replied_to(c) == lost]) == 1
        assert replies(api, lost) == []


@pytest.mark.parametrize("fault", ["502", "disconnect"])
async def test_server_errors_and_dropped_connections_are_retried(
    state_dir: Path, fault: str
) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        if fault == "502":
            api.fail_next("sendMessage", status=502)
        else:
            api.disconnect_next("sendMessage")
        message_id = say(api, "what time is it?")
        await reply_to(api, message_id, "It is")
        await barrier(api)
        attempts = [c for c in sends(api, ok=False) if replied_to(c) == message_id]
        assert [c.ok for c in attempts] == [False, True]
        assert await failed_outbound(bot) == 0


async def healthz(bot: Bot) -> tuple[int, dict[str, Any]]:
    assert bot.daemon.http is not None
    url = f"http://127.0.0.1:{bot.daemon.http.port}/healthz"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json()


async def test_polling_recovers_from_bad_gateways_and_health_shows_it(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        await barrier(api)
        assert (await healthz(bot))[0] == 200
        api.fail_next("getUpdates", status=502, count=2, body="<html>502 Bad Gateway</html>")

        async def degraded() -> bool:
            assert bot.daemon.http is not None
            return not bot.daemon.http.health()[0]

        await eventually(degraded)
        status, body = await healthz(bot)
        assert status == 503
        assert body["status"] == "degraded"
        assert body["components"]["telegram"]["status"] == "degraded"

        message_id = say(api, "what time is it?")
        await reply_to(api, message_id, "It is", timeout=15)

        async def healthy() -> bool:
            assert bot.daemon.http is not None
            return bot.daemon.http.health()[0]

        await eventually(healthy)
        status, body = await healthz(bot)
        assert status == 200 and body["components"]["telegram"]["status"] == "ok"


async def test_a_bad_token_stops_the_start_with_a_clear_error(state_dir: Path) -> None:
    # Not through running_bot: that waits for a start that never comes.
    async with FakeTelegramAPI(token=TOKEN) as api:
        text = telegram_config(api)
        config = parse_config(tomllib.loads(text), "test.toml")
        env = {"TELEGRAM_BOT_TOKEN": "123456:WRONG-token-value"}
        runtime = build(LoadedConfig(config=config, path=state_dir / "t.toml"), state_dir, env)
        daemon = Daemon(runtime, channel_names=["telegram"], banner=False)
        with pytest.raises(ConfigError) as caught:
            await asyncio.wait_for(daemon.run(), 15)
        assert "401" in str(caught.value)
        assert "WRONG" not in str(caught.value)  # the token is a secret
        assert api.calls_of("getMe") and api.calls_of("getUpdates") == []


# -- receiving ------------------------------------------------------------------------------
async def test_the_offset_moves_past_a_processed_update_and_a_redelivery_is_ignored(
    state_dir: Path,
) -> None:
    async with FakeTelegramAPI(token=TOKEN) as api:
        async with telegram_bot(state_dir, api=api) as (_bot, _api):
            update_id = api.push_message("what time is it?")
            raw = api.pushed_updates[-1]
            message_id = raw["message"]["message_id"]
            await reply_to(api, message_id, "It is")
            await api.wait_for_call("getUpdates", lambda c: c.params.get("offset") == update_id + 1)
            assert update_id + 1 in api.offsets

        async with telegram_bot(state_dir, api=api) as (_bot, _api):
            restarted = len(api.calls)
            api.push_update(raw)  # Telegram delivers the same update again
            await barrier(api)
            # It was fetched and acknowledged again, but not answered again.
            await api.wait_for_call(
                "getUpdates", lambda c: (c.params.get("offset") or 0) > update_id, after=restarted
            )
            assert len(replies(api, message_id)) == 1


async def barrier_via_webhook(api: FakeTelegramAPI, url: str) -> None:
    update_id = api.push_message("what time is it?")
    message_id = int(api.pushed_updates[-1]["message"]["message_id"])
    assert await api.deliver_webhook(url, update_id) == 200
    await reply_to(api, message_id, "It is")


# -- webhook mode ---------------------------------------------------------------------------
WEBHOOK = """mode = "webhook"
webhook_url = "https://bot.example.org/telegram"
"""


@pytest.mark.filterwarnings("ignore:Detected unknown update type:RuntimeWarning")
async def test_webhook_mode_registers_checks_the_secret_and_answers(state_dir: Path) -> None:
    async with telegram_bot(
        state_dir, telegram=WEBHOOK, environ={"TELEGRAM_WEBHOOK_SECRET": SECRET}
    ) as (bot, api):
        registered = await api.wait_for_call("setWebhook")
        assert registered.params["url"] == "https://bot.example.org/telegram"
        assert registered.params["secret_token"] == SECRET
        assert registered.params.get("drop_pending_updates") is False
        assert api.calls_of("getUpdates") == []
        assert bot.daemon.http is not None
        url = f"http://127.0.0.1:{bot.daemon.http.port}/telegram"

        forged = api.push_message("what time is it?")
        forged_id = int(api.pushed_updates[-1]["message"]["message_id"])
        assert await api.deliver_webhook(url, forged, secret_token="wrong") == 401
        assert await api.deliver_webhook(url, forged, secret_token=None) == 401
        assert await inbound(bot) == []

        async with aiohttp.ClientSession() as session:
            for body in (b"not json {", b"[1, 2]", b'{"update_id": "x"}', b'{"message": {}}'):
                async with session.post(
                    url,
                    data=body,
                    headers={
                        "X-Telegram-Bot-Api-Secret-Token": SECRET,
                        "Content-Type": "application/json",
                    },
                ) as resp:
                    assert resp.status == 400, body
        # An update with its id that aiogram cannot read: skipped, not sent again and
        # again (Telegram holds the updates after one it is answered an error for).
        garbled = {"update_id": 8999, "message": {"message_id": "x", "chat": None}}
        assert await api.deliver_webhook(url, garbled) == 200

        update_id = api.push_message("what time is it?")
        raw = api.pushed_updates[-1]
        message_id = int(raw["message"]["message_id"])
        assert await api.deliver_webhook(url, update_id) == 200
        await reply_to(api, message_id, "It is")
        unknown = {"update_id": 9000, "future_update_type": {"x": 1}}
        assert await api.deliver_webhook(url, unknown) == 200
        assert await api.deliver_webhook(url, raw) == 200  # Telegram retries a delivery
        # What is answered without an inbox row is not answered again either.
        api.push_message("/whoami")
        whoami_raw = api.pushed_updates[-1]
        for _ in range(2):
            assert await api.deliver_webhook(url, whoami_raw) == 200
        await barrier_via_webhook(api, url)
        assert replies(api, forged_id) == []
        assert len(replies(api, message_id)) == 1
        told = [c for c in sends(api, OWNER) if "Your Telegram user id" in text_of(c)]
        assert len(told) == 1, told


async def test_webhook_mode_refuses_a_stranger_before_reading_the_body(state_dir: Path) -> None:
    """Without the secret token a sender is answered 401 at once, so stalled bodies from
    strangers cannot hold the route's body slots and turn Telegram's deliveries away."""
    bound = 'max_concurrent_bodies = 1\nbody_timeout = "60s"'
    async with telegram_bot(
        state_dir, telegram=WEBHOOK, http=bound, environ={"TELEGRAM_WEBHOOK_SECRET": SECRET}
    ) as (bot, api):
        assert bot.daemon.http is not None
        port = bot.daemon.http.port
        url = f"http://127.0.0.1:{port}/telegram"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /telegram HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
            b"\r\nContent-Length: 100000\r\n\r\n" + b"{" * 10
        )  # and never the rest
        async with asyncio.timeout(30):
            assert (await reader.readline()).startswith(b"HTTP/1.1 401")
        update_id = api.push_message("what time is it?")
        message_id = int(api.pushed_updates[-1]["message"]["message_id"])
        assert await api.deliver_webhook(url, update_id) == 200
        await reply_to(api, message_id, "It is")
        writer.close()


# -- commands and groups --------------------------------------------------------------------
async def test_commands_are_registered_and_pending_updates_are_never_dropped(
    state_dir: Path,
) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        call = await api.wait_for_call("setMyCommands")
        names = {c["command"] for c in call.params["commands"]}
        assert {"help", "tools", "approvals", "run", "pair", "whoami"} <= names
        await api.wait_for_call("getUpdates")
        for cleanup in api.calls_of("deleteWebhook"):
            assert cleanup.params.get("drop_pending_updates") in (None, False)


async def test_in_groups_only_mentions_replies_and_commands_are_answered(
    state_dir: Path,
) -> None:
    group = -(10**12 + OWNER)
    async with telegram_bot(state_dir) as (bot, api):
        plain = say(api, "what time is it?", chat_type="group", chat_id=group)
        stranger = say(api, "hello bot?", user_id=STRANGER, chat_type="group", chat_id=group)
        # Neither is a command to this bot: a path, another bot's command.
        path = say(api, "/etc/hosts got overwritten again", chat_type="group", chat_id=group)
        theirs = say(api, "/help@some_other_bot", chat_type="group", chat_id=group)
        command = say(api, "/help", chat_type="group", chat_id=group)
        help_reply = await reply_to(api, command, "/approvals", chat_id=group)

        mention = say(api, "@echo_test_bot what time is it?", chat_type="group", chat_id=group)
        await reply_to(api, mention, "It is", chat_id=group)
        answer = say(
            api,
            "what time is it?",
            chat_type="group",
            chat_id=group,
            reply_to_message=sent_id(help_reply),
        )
        await reply_to(api, answer, "It is", chat_id=group)
        await barrier(api, chat_type="group", chat_id=group, reply_to_message=sent_id(help_reply))

        assert replies(api, plain, group) == [] and replies(api, stranger, group) == []
        assert replies(api, path, group) == [] and replies(api, theirs, group) == []
        assert len(sends(api, group)) == 4
        stored = api.message(group, sent_id(help_reply))
        assert stored is not None
        assert stored["from_bot"]
        texts = [m.text for m in await inbound(bot) if m.kind == InboundKind.MESSAGE]
        assert texts[:3] == ["/help", "what time is it?", "what time is it?"]
