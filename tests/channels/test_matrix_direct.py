"""A Matrix room that is the owner's alone with the bot is their direct chat, as a
Telegram private chat is: the gate trusts an approver's direct chat with the owner's
data (a workspace file read back to them runs unasked), while the same read in a room
with someone else asks, since every member reads the answer. A room ID never says which
a room is; the channel tells the core from the room's members (``Inbound.direct``).
"Allow for a time" is offered to the approver in their chat and covers the next call.

On the session's Synapse, in encrypted rooms as Element makes them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from nio import RoomCreateResponse, RoomPreset

from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import new_id
from echo_bot.tools.base import Tool
from tests.channels.contract.drivers import ContractBrain
from tests.channels.test_matrix import Chat
from tests.matrix_people import open_room
from tests.matrix_server import Synapse
from tests.waiting import eventually

SECRET = "the vault code is 4711"


class FilesBrain(ContractBrain):
    """``read:NAME`` → file_read; ``write:NAME`` → file_write; the tool's answer is
    reported as ``tool: …``; else the contract's brain."""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "tool":
            return BrainReply(text=f"tool: {last.content}", route_reason="test: report")
        text = last.content or ""
        for verb, tool in (("read:", "file_read"), ("write:", "file_write")):
            if text.startswith(verb):
                args = {"path": text.removeprefix(verb).strip()}
                if tool == "file_write":
                    args["content"] = "written from Element\n"
                call = ToolCall(id=new_id(), name=tool, args=args)
                return BrainReply(tool_calls=[call], route_reason="test: a file tool")
        return await super().step(conversation, tools, context)


@pytest.fixture
async def chat(synapse: Synapse, state_dir: Path) -> AsyncIterator[Chat]:
    made = Chat(state_dir, synapse)
    made.brain = FilesBrain()
    workspace = state_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text(SECRET + "\n")
    async with made.peer():
        yield made


async def direct_room(chat: Chat) -> str:
    """A direct chat of the owner's with the bot, as Element opens one; the bot joined
    and its device known to the owner."""
    await chat.say("say:ready")  # the bot is up in the shared room first
    await chat.wait_received("echo: ready")
    room_id = await open_room(chat.owner, [chat.bot_id])

    await eventually(
        lambda: chat.bot_id in _joined(chat, room_id), timeout=30, what="the bot joined"
    )
    return room_id


def from_bot(chat: Chat, room_id: str) -> list[tuple[str, str]]:
    return chat.owner.received_events(room_id, chat.bot_id)


async def test_the_owners_file_read_runs_unasked_in_their_direct_room_and_asks_with_others(
    chat: Chat,
) -> None:
    async with chat.running():
        room_id = await direct_room(chat)
        await chat.owner.say(room_id, "read:notes.txt")
        answer = await eventually(
            lambda: next((b for _, b in from_bot(chat, room_id) if SECRET in b), None),
            timeout=20, what="the file read back in the direct chat",
        )  # fmt: skip
        assert answer.startswith("tool:")
        assert not any("to deny" in b for _, b in from_bot(chat, room_id))  # not asked

        # The shared room holds a friend too: the same read waits for an approval.
        await chat.say("read:notes.txt")
        shown = await chat.prompt()
        assert "file_read" in shown.text and "notes.txt" in shown.text
        assert not any(SECRET in body for body in chat.received())
        await chat.decide(shown, approve=False)
        await chat.wait_received("tool:")
        assert not any(SECRET in body for body in chat.received())


async def test_allow_for_a_time_by_reaction_covers_the_next_write_in_the_direct_room(
    chat: Chat,
) -> None:
    async with chat.running():
        room_id = await direct_room(chat)
        await chat.owner.say(room_id, "write:drafts/a.txt")

        def prompt() -> tuple[str, str] | None:
            return next(((e, b) for e, b in from_bot(chat, room_id) if "to deny" in b), None)

        prompt_id, text = await eventually(prompt, timeout=20, what="the write's prompt")
        assert "⏱ to allow it here for 1 h" in text, text
        await chat.owner.react(room_id, prompt_id, "⏱", encrypted=True)
        await eventually(
            lambda: (chat.state_dir / "workspace" / "drafts" / "a.txt").exists(),
            timeout=20, what="the first write",
        )  # fmt: skip

        await chat.owner.say(room_id, "write:drafts/b.txt")  # covered: runs unasked
        await eventually(
            lambda: (chat.state_dir / "workspace" / "drafts" / "b.txt").exists(),
            timeout=20, what="the second write, unasked",
        )  # fmt: skip
        prompts = [b for _, b in from_bot(chat, room_id) if "to deny" in b]
        assert len(prompts) == 1, prompts


async def test_a_room_of_two_that_anyone_may_join_is_no_direct_chat(chat: Chat) -> None:
    async with chat.running():
        await chat.say("say:ready")
        await chat.wait_received("echo: ready")
        created = await chat.owner.client.room_create(
            preset=RoomPreset.public_chat, invite=[chat.bot_id]
        )
        assert isinstance(created, RoomCreateResponse), created
        room_id = created.room_id
        await eventually(
            lambda: chat.bot_id in _joined(chat, room_id), timeout=30, what="the bot joined"
        )
        await chat.owner.say(room_id, "read:notes.txt")
        prompt = await eventually(
            lambda: next((b for _, b in from_bot(chat, room_id) if "to deny" in b), None),
            timeout=20, what="the read's prompt",
        )  # fmt: skip
        assert "file_read" in prompt
        assert not any(SECRET in b for _, b in from_bot(chat, room_id))


def _joined(chat: Chat, room_id: str) -> set[str]:
    room = chat.owner.client.rooms.get(room_id)
    return {u for u, m in room.users.items() if not m.invited} if room else set()
