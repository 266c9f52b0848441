"""Approvals through the real core: who is asked, where the prompt goes, who may decide,
what each decision does, and what can never be approved."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from echo_bot.approvals.display import CALL_LIMIT
from echo_bot.events import (
    Address,
    DecisionVerb,
    InboundMessage,
    InboundStatus,
    OutboundKind,
    OutboundMessage,
    Sender,
    ToolCallInbound,
    ToolCallRequest,
    approval_action,
    new_id,
    parse_approval_action,
)
from echo_bot.statuses import ApprovalStatus
from echo_bot.store import Tx
from echo_bot.store.approvals import ApprovalRow
from echo_bot.tools.base import Risk, Tool, ToolContext, ToolGroup, ToolResult
from tests.conftest import Bot, running_bot
from tests.fakes.channel import RecordingChannel
from tests.waiting import eventually

# Each test runs on SQLite and on a real PostgreSQL server.
pytestmark = pytest.mark.usefixtures("on_both_engines")


CODING = """
[tools]
profile = "coding"
"""

SHELL = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""

EXPIRING = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
[approvals]
timeout = "1s"
"""

TELEGRAM = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
[telegram]
allowed_users = [1, 2]
approvers = [1]
"""

APPEND_X = '/tool file_write {"path": "count.txt", "content": "x", "append": true}'


# -- helpers ------------------------------------------------------------------------------
def workspace(bot: Bot) -> Path:
    return bot.state_dir / "workspace"


async def approval(bot: Bot, approval_id: str) -> ApprovalRow:
    row = await bot.store.run(lambda tx: tx.approvals.get(approval_id))
    assert row is not None
    return row


async def inbox_status(bot: Bot, inbound_id: str) -> InboundStatus:
    row = await bot.store.run(lambda tx: tx.inbox.get(inbound_id))
    assert row is not None
    return row.status


async def notice_for(channel: RecordingChannel, press_id: str) -> OutboundMessage:
    """The refusal notice the core sends back for one button press."""
    return await channel.wait_for(
        lambda m: m.kind == "notice" and m.metadata.get("inbound_id") == press_id
    )


def labels(message: OutboundMessage) -> list[str]:
    return [b.label for row in message.buttons for b in row]


def action_of(message: OutboundMessage, label: str) -> str:
    return next(b.action for row in message.buttons for b in row if b.label == label)


def edits_of(channel: RecordingChannel, prompt: OutboundMessage) -> list[OutboundMessage]:
    return [m for m in channel.sent if m.edit_of == prompt.id]


def pending_rows(tx: Tx) -> list[ApprovalRow]:
    return tx.approvals.list(ApprovalStatus.PENDING, 100)


def all_requests(tx: Tx) -> list[ApprovalRow]:
    return tx.approvals.list(None, 100)


def approvals_for(channel: RecordingChannel, inbound_id: str) -> list[OutboundMessage]:
    return [
        m
        for m in channel.sent
        if m.kind == "approval" and m.edit_of is None and m.metadata.get("inbound_id") == inbound_id
    ]


# -- approve, deny, decide twice ----------------------------------------------------------
async def test_approve_once_runs_the_tool_exactly_once(state_dir: Path) -> None:
    async with running_bot(state_dir, CODING) as bot:
        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert labels(prompt) == ["Approve once", "Allow here for 1 h", "Deny"]
        assert not (workspace(bot) / "count.txt").exists()

        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        reply = await bot.channel.reply_to(inbound)
        assert "Appended 1 bytes to count.txt" in reply.text
        assert (workspace(bot) / "count.txt").read_text() == "x"

        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert edit.text.startswith("✅ Approved") and not edit.buttons
        assert edit.to == prompt.to


async def test_deny_answers_approval_denied_and_nothing_runs(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        inbound = await bot.channel.say("/run touch denied.txt")
        prompt = await bot.channel.prompt_for(inbound)
        await bot.channel.press(action_of(prompt, "Deny"))

        reply = await bot.channel.reply_to(inbound)
        assert "APPROVAL_DENIED" in reply.text
        assert not (workspace(bot) / "denied.txt").exists()
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert edit.text.startswith("❌ Denied") and not edit.buttons
        assert prompt.approval is not None
        assert (await approval(bot, prompt.approval.request_id)).status == "denied"


async def test_second_decision_is_refused_and_the_tool_ran_once(state_dir: Path) -> None:
    async with running_bot(state_dir, CODING) as bot:
        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        await bot.channel.press(action_of(prompt, "Approve once"))
        await bot.channel.reply_to(inbound)

        again = await bot.channel.press(action_of(prompt, "Approve once"))
        deny = await bot.channel.press(action_of(prompt, "Deny"))
        for press in (again, deny):
            notice = await notice_for(bot.channel, press)
            assert notice.text.startswith("⚠️") and "Already decided" in notice.text
            assert notice.to == bot.channel.address()

        assert (await approval(bot, request_id)).status == "approved"
        assert (workspace(bot) / "count.txt").read_text() == "x"
        assert len(edits_of(bot.channel, prompt)) == 1
        replies = [m for m in bot.channel.sent if m.metadata.get("inbound_id") == inbound]
        assert [m.kind for m in replies].count(OutboundKind.REPLY) == 1


async def test_racing_presses_decide_once(state_dir: Path) -> None:
    """Approve and Deny pressed back to back: exactly one wins, the other is refused."""
    async with running_bot(state_dir, CODING) as bot:
        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        presses = [
            await bot.channel.press(action_of(prompt, "Approve once")),
            await bot.channel.press(action_of(prompt, "Deny")),
        ]
        reply = await bot.channel.reply_to(inbound)
        assert prompt.approval is not None
        row = await approval(bot, prompt.approval.request_id)
        assert row.status in ("approved", "denied")
        loser = presses[1] if row.status == "approved" else presses[0]
        notice = await notice_for(bot.channel, loser)
        assert "Already decided" in notice.text
        count = workspace(bot) / "count.txt"
        if row.status == "approved":
            assert count.read_text() == "x" and "Appended 1 bytes" in reply.text
        else:
            assert not count.exists() and "APPROVAL_DENIED" in reply.text
        assert len(edits_of(bot.channel, prompt)) == 1


# -- forged and malformed decisions -------------------------------------------------------
async def test_unknown_request_id_is_refused_and_changes_nothing(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        inbound = await bot.channel.say("/run touch forged.txt")
        prompt = await bot.channel.prompt_for(inbound)
        forged = new_id()
        assert prompt.approval is not None
        assert forged != prompt.approval.request_id

        press = await bot.channel.press(approval_action(DecisionVerb.APPROVE_ONCE, forged))
        notice = await notice_for(bot.channel, press)
        assert notice.text == "⚠️ Unknown or expired request."
        assert (await approval(bot, prompt.approval.request_id)).status == "pending"
        assert await inbox_status(bot, inbound) == InboundStatus.WAITING_APPROVAL
        assert await inbox_status(bot, press) == InboundStatus.FAILED
        assert not (workspace(bot) / "forged.txt").exists()
        assert edits_of(bot.channel, prompt) == []


GOOD_ID = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "action",
    [
        "",
        "approve_once",
        f"approve_once:{GOOD_ID}:1:2",
        f"approve_once:{GOOD_ID}" + "0" * 40,  # too long an id (and over 64 characters)
        "x" * 65,
        f"deny:{GOOD_ID}" + ":" + "1" * 60,  # too long
        f"approve:{GOOD_ID}",  # wrong verb
        f"APPROVE_ONCE:{GOOD_ID}",
        f"delete:{GOOD_ID}",
        f"approve_once:{GOOD_ID[:-1]}g",  # not hex
        f"approve_once:{GOOD_ID.upper()}",
        f"approve_once:{GOOD_ID[:-1]}",  # 31 characters
        f"approve_once:../../{GOOD_ID[:26]}",
        f"approve_once: {GOOD_ID[1:]}",
        f"allow_for:{GOOD_ID}",  # allow_for without seconds
        f"allow_for:{GOOD_ID}:",
        f"allow_for:{GOOD_ID}:0",
        f"allow_for:{GOOD_ID}:-60",
        f"allow_for:{GOOD_ID}:1e3",
        f"allow_for:{GOOD_ID}:99999999999",  # huge
        f"allow_for:{GOOD_ID}:{7 * 86400 + 1}",  # over a week
        f"approve_once:{GOOD_ID}:60",  # approve_once with seconds
        f"deny:{GOOD_ID}:60",
    ],
)
def test_malformed_actions_are_rejected(action: str) -> None:
    assert parse_approval_action(action) is None


@pytest.mark.parametrize("seconds", ["\u00b2", "\u0661\u0662", "\uff11\uff12", " 60", "60 "])
def test_non_ascii_digit_seconds_are_rejected_not_raised(seconds: str) -> None:
    """Regression: str.isdigit() accepted '²', and int() then raised ValueError out of a
    parser that must answer None for anything malformed."""
    assert parse_approval_action(f"allow_for:{GOOD_ID}:{seconds}") is None


def test_well_formed_actions_round_trip() -> None:
    assert parse_approval_action(approval_action(DecisionVerb.APPROVE_ONCE, GOOD_ID)) == (
        DecisionVerb.APPROVE_ONCE,
        GOOD_ID,
        None,
    )
    assert parse_approval_action(approval_action(DecisionVerb.ALLOW_FOR, GOOD_ID, 3600)) == (
        DecisionVerb.ALLOW_FOR,
        GOOD_ID,
        3600,
    )
    assert parse_approval_action(approval_action(DecisionVerb.DENY, GOOD_ID)) == (
        DecisionVerb.DENY,
        GOOD_ID,
        None,
    )


# -- expiry -------------------------------------------------------------------------------
async def test_unanswered_request_expires_and_the_turn_resumes(state_dir: Path) -> None:
    async with running_bot(state_dir, EXPIRING) as bot:
        inbound = await bot.channel.say("/run touch late.txt")
        prompt = await bot.channel.prompt_for(inbound)

        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert edit.text.startswith("⌛ Expired") and not edit.buttons
        reply = await bot.channel.reply_to(inbound)
        assert "APPROVAL_EXPIRED" in reply.text
        assert prompt.approval is not None
        assert (await approval(bot, prompt.approval.request_id)).status == "expired"
        assert not (workspace(bot) / "late.txt").exists()


async def test_decision_after_expiry_is_refused(state_dir: Path) -> None:
    async with running_bot(state_dir, EXPIRING) as bot:
        inbound = await bot.channel.say("/run touch late.txt")
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        row = await approval(bot, prompt.approval.request_id)
        # Press just after the deadline (the gate's clock moved past it, no waiting):
        # whether the decision or the sweeper sees the expiry first, the request must
        # end expired and never approved.
        bot.daemon.runtime.gate.clock = lambda: max(time.time(), row.expires_at + 0.01)
        press = await bot.channel.press(action_of(prompt, "Approve once"))

        notice = await notice_for(bot.channel, press)
        assert notice.text.startswith("⚠️") and "expired" in notice.text
        reply = await bot.channel.reply_to(inbound)
        assert "APPROVAL_EXPIRED" in reply.text
        edits = edits_of(bot.channel, prompt)
        assert [e.text.split("\n")[0] for e in edits] == ["⌛ Expired"]
        assert (await approval(bot, row.id)).status == "expired"
        assert not (workspace(bot) / "late.txt").exists()


# -- who may decide -----------------------------------------------------------------------
async def test_non_approver_press_is_refused(state_dir: Path) -> None:
    channel = RecordingChannel("telegram")
    async with running_bot(state_dir, TELEGRAM, channel=channel) as bot:
        inbound = await channel.say("/run touch t1.txt", chat="1", sender="1")
        prompt = await channel.prompt_for(inbound)
        assert prompt.to == Address(channel="telegram", chat_id="1")
        assert prompt.approval is not None
        request_id = prompt.approval.request_id

        press = await channel.press(action_of(prompt, "Approve once"), chat="1", sender="2")
        notice = await notice_for(channel, press)
        assert notice.text.startswith("⚠️") and "not allowed" in notice.text
        assert (await approval(bot, request_id)).status == "pending"
        assert not (workspace(bot) / "t1.txt").exists()
        assert edits_of(channel, prompt) == []

        await channel.press(action_of(prompt, "Approve once"), chat="1", sender="1")
        reply = await channel.reply_to(inbound)
        assert "exit code 0" in reply.text
        assert (workspace(bot) / "t1.txt").exists()


async def test_press_from_another_chat_is_refused(state_dir: Path) -> None:
    channel = RecordingChannel("telegram")
    async with running_bot(state_dir, TELEGRAM, channel=channel) as bot:
        inbound = await channel.say("/run touch t2.txt", chat="1", sender="1")
        prompt = await channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id

        # The same approver, but pressing from a different chat than the prompt's.
        press = await channel.press(action_of(prompt, "Approve once"), chat="2", sender="1")
        notice = await notice_for(channel, press)
        assert notice.to == Address(channel="telegram", chat_id="2")
        assert "not allowed" in notice.text
        assert (await approval(bot, request_id)).status == "pending"
        assert not (workspace(bot) / "t2.txt").exists()


async def test_press_from_another_local_chat_is_refused(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        inbound = await bot.channel.say("/run touch t3.txt")
        prompt = await bot.channel.prompt_for(inbound)
        press = await bot.channel.press(action_of(prompt, "Approve once"), chat="elsewhere")
        notice = await notice_for(bot.channel, press)
        assert "not allowed" in notice.text
        assert prompt.approval is not None
        assert (await approval(bot, prompt.approval.request_id)).status == "pending"
        assert not (workspace(bot) / "t3.txt").exists()


# -- where the prompt goes ----------------------------------------------------------------
async def test_non_approver_request_goes_to_default_chat(state_dir: Path) -> None:
    channel = RecordingChannel("telegram")
    config = TELEGRAM + '\n[approvals]\ndefault_chat = "telegram:1"\n'
    async with running_bot(state_dir, config, channel=channel) as bot:
        inbound = await channel.say("/run touch t4.txt", chat="2", sender="2")
        prompt = await channel.prompt_for(inbound)
        assert prompt.to == Address(channel="telegram", chat_id="1")
        waiting = await channel.wait_for(
            lambda m: m.kind == "notice" and m.metadata.get("inbound_id") == inbound
        )
        assert waiting.to == Address(channel="telegram", chat_id="2")
        assert waiting.text.startswith("⏳") and "needs approval" in waiting.text
        assert not (workspace(bot) / "t4.txt").exists()

        # The requester cannot approve their own request from their chat.
        press = await channel.press(action_of(prompt, "Approve once"), chat="2", sender="2")
        assert "not allowed" in (await notice_for(channel, press)).text

        await channel.press(action_of(prompt, "Approve once"), chat="1", sender="1")
        reply = await channel.reply_to(inbound)
        assert reply.to == Address(channel="telegram", chat_id="2")
        assert "exit code 0" in reply.text
        assert (workspace(bot) / "t4.txt").exists()


async def test_non_approver_without_default_chat_waits_for_echo_bot_approvals(
    state_dir: Path,
) -> None:
    """No chat can ask an approver: no prompt goes anywhere, the request waits for the
    owner at the server (`echo-bot approvals`, via "admin"), and the requester is told."""
    channel = RecordingChannel("telegram")
    async with running_bot(state_dir, TELEGRAM, channel=channel) as bot:
        inbound = await channel.say("/run touch t5.txt", chat="2", sender="2")
        waiting = await channel.wait_for(
            lambda m: m.kind == "notice" and m.metadata.get("inbound_id") == inbound
        )
        assert waiting.to == Address(channel="telegram", chat_id="2")
        (row,) = await bot.store.run(pending_rows)
        assert waiting.text == (
            "⏳ shell_exec needs approval; no chat can ask an approver, so it waits for the "
            f"owner at the server: echo-bot approvals approve {row.id} (or deny), until "
            f"{time.strftime('%H:%M UTC', time.gmtime(row.expires_at))}."
        )
        assert row.prompt_to == "echo-bot:approvals" and row.prompt_outbound_id is None
        assert approvals_for(channel, inbound) == []
        assert await inbox_status(bot, inbound) == InboundStatus.WAITING_APPROVAL
        # Nobody in a chat may decide it; the owner at the server may.
        press = await channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, row.id), chat="1", sender="1"
        )
        assert "not allowed" in (await notice_for(channel, press)).text
        assert not (workspace(bot) / "t5.txt").exists()
        await channel.press(approval_action(DecisionVerb.APPROVE_ONCE, row.id), via="admin")
        reply = await channel.reply_to(inbound)
        assert reply.to == Address(channel="telegram", chat_id="2")
        assert "exit code 0" in reply.text
        assert (workspace(bot) / "t5.txt").exists()
        assert approvals_for(channel, inbound) == []  # and no prompt was edited either
        assert not [m for m in channel.sent if m.to.channel == "echo-bot"]


# -- allow for a time ---------------------------------------------------------------------
async def test_allow_for_lets_the_same_tool_run_in_the_same_session(state_dir: Path) -> None:
    async with running_bot(state_dir, CODING) as bot:
        first = await bot.channel.say('/tool file_write {"path": "a.txt", "content": "1"}')
        prompt = await bot.channel.prompt_for(first)
        assert labels(prompt) == ["Approve once", "Allow here for 1 h", "Deny"]
        await bot.channel.press(action_of(prompt, "Allow here for 1 h"))
        assert "Wrote 1 bytes" in (await bot.channel.reply_to(first)).text
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert edit.text.startswith("✅ Approved")
        assert "file_write runs unasked in this chat until" in edit.text  # the grant shows

        # No prompt this time: the reply comes without anyone pressing anything.
        second = await bot.channel.say('/tool file_write {"path": "b.txt", "content": "22"}')
        assert "Wrote 2 bytes" in (await bot.channel.reply_to(second)).text
        assert approvals_for(bot.channel, second) == []
        assert (workspace(bot) / "b.txt").read_text() == "22"

        # The grant is for this session only.
        other = await bot.channel.say(
            '/tool file_write {"path": "c.txt", "content": "3"}', chat="other"
        )
        await bot.channel.prompt_for(other)
        assert not (workspace(bot) / "c.txt").exists()


async def test_attack_a_forged_longer_allow_for_grants_one_hour_at_most(state_dir: Path) -> None:
    """Button data can be forged: an approver asking for a week gets the hour offered."""
    async with running_bot(state_dir, CODING) as bot:
        first = await bot.channel.say('/tool file_write {"path": "a.txt", "content": "1"}')
        prompt = await bot.channel.prompt_for(first)
        week = 7 * 24 * 3600
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.ALLOW_FOR, prompt.approval.request_id, week)
        )
        assert "Wrote 1 bytes" in (await bot.channel.reply_to(first)).text
        [grant] = await bot.store.run(lambda tx: tx.grants.all())
        assert grant.until <= time.time() + 3600


async def test_allow_for_is_neither_offered_nor_accepted_for_dangerous(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        inbound = await bot.channel.say("/run touch d.txt")
        prompt = await bot.channel.prompt_for(inbound)
        assert labels(prompt) == ["Approve once", "Deny"]
        assert prompt.approval is not None
        request_id = prompt.approval.request_id

        forged = approval_action(DecisionVerb.ALLOW_FOR, request_id, 3600)
        press = await bot.channel.press(forged)
        notice = await notice_for(bot.channel, press)
        assert notice.text.startswith("⚠️") and "only for write tools" in notice.text
        assert (await approval(bot, request_id)).status == "pending"
        assert not (workspace(bot) / "d.txt").exists()

        await bot.channel.press(action_of(prompt, "Approve once"))
        assert "exit code 0" in (await bot.channel.reply_to(inbound)).text
        # No grant was left behind: the next dangerous call asks again.
        again = await bot.channel.say("/run touch e.txt")
        await bot.channel.prompt_for(again)
        assert not (workspace(bot) / "e.txt").exists()


# -- the shell allowlist ------------------------------------------------------------------
async def test_allowlisted_command_runs_without_asking_and_lookalikes_ask(
    state_dir: Path,
) -> None:
    config = SHELL + 'allow_commands = ["true"]\n'
    async with running_bot(state_dir, config) as bot:
        plain = await bot.channel.say("/run true")
        assert "exit code 0" in (await bot.channel.reply_to(plain)).text
        assert approvals_for(bot.channel, plain) == []

        chained = await bot.channel.say("/run true; rm -rf ~")
        prompt = await bot.channel.prompt_for(chained)
        assert "rm -rf ~" in prompt.text

        dotted = await bot.channel.say("/run /usr/bin/../bin/true")
        prompt = await bot.channel.prompt_for(dotted)
        assert "/usr/bin/../bin/true" in prompt.text
        assert await inbox_status(bot, chained) == InboundStatus.WAITING_APPROVAL
        assert await inbox_status(bot, dotted) == InboundStatus.WAITING_APPROVAL


# -- direct tool calls (webhook, cron) ----------------------------------------------------
def tool_call(tool: str, args: dict[str, Any], deliver_to: Address) -> InboundMessage:
    return ToolCallInbound(
        tool_call=ToolCallRequest(tool=tool, args=args),
        address=Address(channel="webhook", chat_id="ci"),
        deliver_to=deliver_to,
        sender=Sender(id="ci", name="ci"),
        external_id=new_id(),
    )


async def test_direct_read_call_delivers_its_result_to_reply_to(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        assert bot.channel.bus is not None
        published = await bot.channel.bus.publish(
            tool_call("current_time", {}, bot.channel.address())
        )
        reply = await bot.channel.reply_to(published.inbound_id)
        assert reply.to == bot.channel.address()
        assert reply.text.startswith("current_time: It is ")
        assert await inbox_status(bot, published.inbound_id) == InboundStatus.DONE


async def test_direct_write_call_prompts_reply_to_and_deny_ends_denied(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        assert bot.channel.bus is not None
        call = tool_call("file_write", {"path": "hook.txt", "content": "x"}, bot.channel.address())
        published = await bot.channel.bus.publish(call)
        prompt = await bot.channel.prompt_for(published.inbound_id)
        assert prompt.to == bot.channel.address()
        assert "webhook:ci" in prompt.text

        await bot.channel.press(action_of(prompt, "Deny"))
        reply = await bot.channel.reply_to(published.inbound_id)
        assert "APPROVAL_DENIED" in reply.text
        assert await inbox_status(bot, published.inbound_id) == InboundStatus.DENIED
        assert not (workspace(bot) / "hook.txt").exists()


async def test_direct_dangerous_call_approved_ends_done(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        assert bot.channel.bus is not None
        call = tool_call("shell_exec", {"command": "touch hook.txt"}, bot.channel.address())
        published = await bot.channel.bus.publish(call)
        prompt = await bot.channel.prompt_for(published.inbound_id)
        assert prompt.to == bot.channel.address()
        assert labels(prompt) == ["Approve once", "Deny"]
        assert await inbox_status(bot, published.inbound_id) == InboundStatus.WAITING_APPROVAL

        await bot.channel.press(action_of(prompt, "Approve once"))
        reply = await bot.channel.reply_to(published.inbound_id)
        assert reply.text.startswith("shell_exec: ") and "exit code 0" in reply.text
        assert await inbox_status(bot, published.inbound_id) == InboundStatus.DONE
        assert (workspace(bot) / "hook.txt").exists()


async def test_direct_call_without_an_approver_chat_waits_and_expires_unrun(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir, EXPIRING) as bot:
        assert bot.channel.bus is not None
        nobody = Address(channel="webhook", chat_id="elsewhere")
        call = tool_call("file_write", {"path": "hook.txt", "content": "x"}, nobody)
        published = await bot.channel.bus.publish(call)

        async def finished() -> bool:
            return (await inbox_status(bot, published.inbound_id)).terminal

        await eventually(finished)
        row = await bot.store.run(lambda tx: tx.inbox.get(published.inbound_id))
        assert row is not None and row.status == InboundStatus.EXPIRED
        assert "APPROVAL_EXPIRED" in (row.error or "")
        (request,) = await bot.store.run(all_requests)
        assert request.prompt_to == "echo-bot:approvals" and request.status == "expired"
        assert approvals_for(bot.channel, published.inbound_id) == []
        assert not (workspace(bot) / "hook.txt").exists()


# -- what the prompt shows ----------------------------------------------------------------
async def test_dangerous_arguments_are_shown_in_full(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        word = "y" * (CALL_LIMIT - 100)
        inbound = await bot.channel.say(f"/run echo {word}")
        prompt = await bot.channel.prompt_for(inbound)
        assert f'shell_exec(command="echo {word}")' in prompt.text
        assert "…" not in prompt.text
        assert labels(prompt) == ["Approve once", "Deny"]


# A chat (not the terminal, which shows a call of any length): a prompt holds what fits.
CHAT = SHELL + "[telegram]\nallowed_users = [42]\n"
IN_CHAT = {"chat": "42", "sender": "42"}


async def test_too_long_dangerous_arguments_offer_only_deny(state_dir: Path) -> None:
    chat = RecordingChannel("telegram")
    async with running_bot(state_dir, CHAT, channel=chat):
        word = "z" * (CALL_LIMIT + 100)
        inbound = await chat.say(f"/run echo {word}", **IN_CHAT)
        prompt = await chat.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert labels(prompt) == ["Deny"]
        assert f"echo-bot approvals show {request_id}" in prompt.text
        assert "z" * 100 not in prompt.text  # never a silently shortened version

        await chat.press(action_of(prompt, "Deny"), **IN_CHAT)
        assert "APPROVAL_DENIED" in (await chat.reply_to(inbound)).text


async def test_the_terminal_shows_a_call_of_any_length_and_approves_it(state_dir: Path) -> None:
    """The terminal has no message limit: the owner there reads the whole call and may
    approve it (a chat offers Deny only, above)."""
    async with running_bot(state_dir, SHELL) as bot:
        word = "z" * (CALL_LIMIT + 100)
        inbound = await bot.channel.say(f"/run echo {word}")
        prompt = await bot.channel.prompt_for(inbound)
        assert "Approve once" in labels(prompt) and word in prompt.text
        await bot.channel.press(action_of(prompt, "Approve once"))
        assert word in (await bot.channel.reply_to(inbound)).text


async def test_too_long_dangerous_arguments_cannot_be_approved_from_chat(
    state_dir: Path,
) -> None:
    """Regression: an "Approve once" forged for a request whose arguments the chat never
    showed used to be accepted."""
    chat = RecordingChannel("telegram")
    async with running_bot(state_dir, CHAT, channel=chat) as bot:
        word = "z" * (CALL_LIMIT + 100)
        # sh -c 'touch marker.txt' zzz…: the long word is only $0 of the script.
        inbound = await chat.say(f"/run sh -c 'touch marker.txt' {word}", **IN_CHAT)
        prompt = await chat.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert labels(prompt) == ["Deny"]

        press = await chat.press(approval_action(DecisionVerb.APPROVE_ONCE, request_id), **IN_CHAT)
        notice = await notice_for(chat, press)
        assert notice.text.startswith("⚠️") and "echo-bot approvals" in notice.text
        assert (await approval(bot, request_id)).status == "pending"
        assert not (workspace(bot) / "marker.txt").exists()

        # The owner at the server, who can read the arguments, may still approve.
        await chat.press(
            approval_action(DecisionVerb.APPROVE_ONCE, request_id), via="admin", **IN_CHAT
        )
        assert "exit code 0" in (await chat.reply_to(inbound)).text
        assert (workspace(bot) / "marker.txt").exists()


class StoreTokenTool(Tool):
    name: ClassVar[str] = "token_store"
    description: ClassVar[str] = "Store a service token."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"service": {"type": "string"}, "token": {"type": "string"}},
        "required": ["service", "token"],
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "basic"

    def __init__(self) -> None:
        self.stored: list[str] = []

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.stored.append(args["token"])
        return ToolResult.success(f"stored the token for {args['service']}")


async def test_secrets_are_masked_in_the_prompt(state_dir: Path) -> None:
    """Configured secret values are masked in a prompt that can still be approved; a
    value under a secret-named key is never shown in a chat, so that chat can only deny
    (it would be approved unseen) and approving goes through ``echo-bot approvals``."""
    tool = StoreTokenTool()
    environ = {"TELEGRAM_BOT_TOKEN": "tg-secret-value-123"}
    async with running_bot(state_dir, CODING, tools=[tool], environ=environ) as bot:
        inbound = await bot.channel.say(
            '/tool token_store {"service": "ci", "token": "hunter2-abcdef"}'
        )
        prompt = await bot.channel.prompt_for(inbound)
        assert "hunter2" not in prompt.text
        assert labels(prompt) == ["Deny"] and "secret-named keys" in prompt.text

        note = await bot.channel.say(
            '/tool file_write {"path": "n.txt", "content": "key tg-secret-value-123"}'
        )
        note_prompt = await bot.channel.prompt_for(note)
        assert "tg-secret-value-123" not in note_prompt.text
        assert 'content="key ***"' in note_prompt.text
        assert "Approve once" in labels(note_prompt)

        await bot.channel.press(action_of(prompt, "Deny").replace("deny", "approve_once"))
        assert prompt.approval is not None
        assert (await approval(bot, prompt.approval.request_id)).status == "pending"
        await bot.channel.press(
            action_of(prompt, "Deny").replace("deny", "approve_once"), via="admin"
        )
        assert "stored the token for ci" in (await bot.channel.reply_to(inbound)).text
        assert tool.stored == ["hunter2-abcdef"]  # masked for people, not for the tool
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert "hunter2" not in edit.text


async def test_prompt_and_outcome_times_are_in_the_chats_time_zone(state_dir: Path) -> None:
    """Issue 28: "expires …" and "Approved … at 08:24 UTC" ignored the chat's zone. A
    chat that chose one (``/timezone``) reads them in it; the others in [bot] timezone."""
    async with running_bot(state_dir, CODING + '\n[bot]\ntimezone = "Asia/Tokyo"\n') as bot:
        first = await bot.channel.say('/tool file_write {"path": "a.txt", "content": "1"}')
        prompt = await bot.channel.prompt_for(first)
        assert re.search(r"expires \d\d:\d\d Asia/Tokyo", prompt.text), prompt.text
        await bot.channel.press(action_of(prompt, "Deny"))
        await bot.channel.reply_to(first)

        await bot.channel.reply_to(await bot.channel.say("/timezone Europe/Berlin"))
        second = await bot.channel.say('/tool file_write {"path": "b.txt", "content": "2"}')
        prompt = await bot.channel.prompt_for(second)
        assert re.search(r"expires \d\d:\d\d Europe/Berlin", prompt.text), prompt.text
        listing = await bot.channel.reply_to(await bot.channel.say("/approvals"))
        assert re.search(r"expires \d\d:\d\d Europe/Berlin", listing.text), listing.text
        # Said alike for every channel (Matrix and the terminal have no buttons).
        assert "follow: answer each as it says" in listing.text and "button" not in listing.text
        await bot.channel.press(action_of(prompt, "Allow here for 1 h"))
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert re.search(r"at \d\d:\d\d Europe/Berlin; .* until \d\d:\d\d Europe/Berlin", edit.text)
