"""Turns through the real core: brain, tools, approvals, replies."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_bot.events import DecisionVerb, approval_action
from tests.conftest import running_bot

# Each test runs on SQLite and on a real PostgreSQL server.
pytestmark = pytest.mark.usefixtures("on_both_engines")


SHELL = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
allow_commands = ["true"]
"""


async def test_current_time_by_trigger(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        inbound = await bot.channel.say("what time is it?")
        reply = await bot.channel.reply_to(inbound)
        assert reply.text.startswith("It is ")


async def test_approved_call_runs_once_and_prompt_is_edited(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        inbound = await bot.channel.say("/run touch approved.txt")
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert [b.label for b in prompt.buttons[0]] == ["Approve once", "Deny"]
        assert not (state_dir / "workspace" / "approved.txt").exists()
        await bot.channel.press(approval_action(DecisionVerb.APPROVE_ONCE, request_id))
        reply = await bot.channel.reply_to(inbound)
        assert "exit code 0" in reply.text
        assert (state_dir / "workspace" / "approved.txt").exists()
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert edit.text.startswith("✅ Approved") and not edit.buttons


async def test_send_message_to_own_chat_needs_no_approval(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        inbound = await bot.channel.say('/tool send_message {"text": "hello there"}')
        note = await bot.channel.wait_for(lambda m: m.text == "hello there")
        assert note.to == bot.channel.address()
        reply = await bot.channel.reply_to(inbound)
        assert reply.text == "Sent to cli:local."


async def test_send_message_to_another_chat_asks_first(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        inbound = await bot.channel.say('/tool send_message {"text": "psst", "to": "cli:other"}')
        prompt = await bot.channel.prompt_for(inbound)
        assert not any(m.text == "psst" for m in bot.channel.sent)
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        note = await bot.channel.wait_for(lambda m: m.text == "psst")
        assert str(note.to) == "cli:other"


async def test_send_message_to_a_channel_that_is_not_running(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        inbound = await bot.channel.say('/tool send_message {"text": "x", "to": "nowhere:1"}')
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        reply = await bot.channel.reply_to(inbound)
        assert "INVALID_PARAMETER" in reply.text and "nowhere" in reply.text


async def test_approvals_command_shows_pending_prompts_again_with_buttons(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        first = await bot.channel.say("/run touch later.txt")
        prompt = await bot.channel.prompt_for(first)
        asked = await bot.channel.say("/approvals")
        listing = await bot.channel.reply_to(asked)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert request_id in listing.text
        again = await bot.channel.wait_for(
            lambda m: m.kind == "approval" and m.id != prompt.id and m.edit_of is None
        )
        assert again.approval is not None
        assert again.approval.request_id == request_id
        assert [b.action for b in again.buttons[0]] == [b.action for b in prompt.buttons[0]]
        await bot.channel.press(again.buttons[0][0].action)
        reply = await bot.channel.reply_to(first)
        assert "exit code 0" in reply.text
