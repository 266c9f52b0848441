"""One chat's burst must not hurt the others: turns are taken round-robin across sessions,
and typing indicators are paced.

No timing is asserted: the dispatcher tests read the order in which the brain was asked,
the typing tests the calls the fake Bot API recorded (counts and the gaps between its
own timestamps, which the pacer's minimum interval bounds from below)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from pathlib import Path

from channels.telegram.render import TYPING_INTERVAL
from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import new_id
from echo_bot.tools.base import Tool
from tests.channels.test_telegram import OWNER, GateBrain, chat_of, say, telegram_bot
from tests.conftest import Bot, running_bot
from tests.fakes.telegram_api import Call, FakeTelegramAPI
from tests.waiting import eventually


class OrderBrain:
    """Records which message it is asked about, in order; the first turn waits for the
    test to open the gate, so a backlog builds up behind it."""

    name = "order"

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        text = str(conversation[-1].content)
        if conversation[-1].role == "tool":
            self.asked.append("resumed")
            return BrainReply(text="resumed and done", route_reason="test: resumed")
        if text == "write":  # asks for a call that needs the owner's approval
            self.asked.append(text)
            call = ToolCall(id=new_id(), name="file_write", args={"path": "f.txt", "content": "x"})
            return BrainReply(tool_calls=[call], route_reason="test: needs approval")
        self.asked.append(text)
        self.entered.set()
        await self.gate.wait()
        return BrainReply(text=f"ok {text}", route_reason="test: order")


CODING = '\n[tools]\nprofile = "coding"\n'


def concurrency(turns: int) -> str:
    return f'[bot]\nmax_concurrent_turns = {turns}\nshutdown_timeout = "1s"\n'


async def test_attack_a_burst_from_one_chat_does_not_delay_another_chats_turn(
    state_dir: Path,
) -> None:
    brain = OrderBrain()
    async with running_bot(state_dir, concurrency(1), brain=brain) as bot:
        channel = bot.channel
        await channel.say("a 0", chat="A")
        await asyncio.wait_for(brain.entered.wait(), 10)  # A's first turn holds the slot
        for n in range(1, 200):
            await channel.say(f"a {n}", chat="A")
        b_id = await channel.say("b", chat="B")
        brain.gate.set()
        await channel.reply_to(b_id, timeout=60)
        # One turn was running when B arrived; B is next, not after A's 199 queued turns.
        assert brain.asked.index("b") <= 2, brain.asked[:10]


async def test_attack_many_chats_with_backlogs_are_served_round_robin(state_dir: Path) -> None:
    brain = OrderBrain()
    async with running_bot(state_dir, concurrency(2), brain=brain) as bot:
        channel = bot.channel
        await channel.say("x 0", chat="X")
        await asyncio.wait_for(brain.entered.wait(), 10)
        for chat in ("A", "B", "C"):
            for n in range(30):
                await channel.say(f"{chat.lower()} {n}", chat=chat)
        last = await channel.say("d", chat="D")
        brain.gate.set()
        await channel.reply_to(last, timeout=60)
        # Every session with work takes one turn per round: no session's second turn
        # comes before every session with queued work has had its first.
        first_round = brain.asked[:5]
        assert sorted(text.split()[0] for text in first_round) == ["a", "b", "c", "d", "x"], (
            brain.asked[:12]
        )


async def test_attack_a_backlog_found_at_start_does_not_go_ahead_of_another_chat(
    state_dir: Path,
) -> None:
    held = OrderBrain()  # nothing finishes in the first run: all of it is left unfinished
    async with running_bot(state_dir, concurrency(1), brain=held) as bot:
        await bot.channel.say("a 0", chat="A")
        await asyncio.wait_for(held.entered.wait(), 10)
        for n in range(1, 200):
            await bot.channel.say(f"a {n}", chat="A")
        b_id = await bot.channel.say("b", chat="B")
    brain = OrderBrain()
    brain.gate.set()
    async with running_bot(state_dir, concurrency(1), brain=brain) as bot:
        await bot.channel.reply_to(b_id, timeout=60)
        # Recovery queues A's 200 turns and B's one: B goes second, not 201st.
        assert brain.asked.index("b") <= 1, brain.asked[:6]


async def approved(bot: Bot, action: str) -> None:
    """Until the request of ``action`` is approved, then a few store round trips: the
    store runs jobs in order, so the dispatcher's read of the turn (asked right after the
    decision's commit) is done, and the turn is queued again."""
    request_id = action.split(":")[1]

    async def approved() -> bool:
        row = await bot.store.run(lambda tx: tx.approvals.get(request_id))
        return row is not None and row.status == "approved"

    await eventually(
        approved, 10, f"approval {request_id} approved", woken_by=lambda: asyncio.sleep(0.02)
    )
    for _ in range(3):
        await bot.db.run(lambda db: None)


async def test_attack_an_approved_turn_is_not_queued_behind_its_chats_later_backlog(
    state_dir: Path,
) -> None:
    brain = OrderBrain()
    async with running_bot(state_dir, concurrency(1) + CODING, brain=brain) as bot:
        channel = bot.channel
        write = await channel.say("write")
        prompt = await channel.prompt_for(write)
        await channel.say("a 0")
        await asyncio.wait_for(brain.entered.wait(), 10)  # holds the only slot
        for n in range(1, 30):
            await channel.say(f"a {n}")
        approve = next(b.action for row in prompt.buttons for b in row if b.label == "Approve once")
        await channel.press(approve)
        await approved(bot, approve)
        brain.gate.set()
        await channel.reply_to(write, timeout=60)
        # The approved turn arrived before the backlog: it goes on right after the turn
        # that was running, not after the 29 messages queued while it waited.
        assert brain.asked.index("resumed") == brain.asked.index("a 0") + 1, brain.asked[:6]


# -- typing ---------------------------------------------------------------------------------
def typing_in(api: FakeTelegramAPI, chat: int) -> list[Call]:
    return [c for c in api.calls_of("sendChatAction") if chat_of(c) == chat]


async def test_attack_a_burst_in_one_chat_sends_one_typing_per_interval(state_dir: Path) -> None:
    friend = 7
    brain = GateBrain()  # every turn waits: the burst stays queued behind the first
    async with telegram_bot(state_dir, brain=brain, allowed=(OWNER, friend)) as (_bot, api):
        for n in range(20):
            say(api, f"burst {n}", user_id=OWNER)
        last = api.pushed_updates[-1]["update_id"]
        # The offset moves past an update only after it was committed (and typing began).
        await api.wait_for_call("getUpdates", lambda c: int(c.params.get("offset") or 0) > last)
        await asyncio.wait_for(brain.entered.wait(), 10)
        # Another chat shows typing of its own at once, whatever the first one sent.
        say(api, "hello", user_id=friend)
        await api.wait_for_call("sendChatAction", lambda c: chat_of(c) == friend)
        # The running turn keeps the indicator on: a second one comes, an interval later.
        await api.wait_for_calls(
            "sendChatAction", 2, lambda c: chat_of(c) == OWNER, timeout=4 * TYPING_INTERVAL
        )
        calls = typing_in(api, OWNER)
        brain.release.set()
    # 20 queued turns, yet one indicator per interval (from the fake's own clock; a
    # second of tolerance for requests that take different times on their way).
    gaps = [b.at - a.at for a, b in itertools.pairwise(calls)]
    assert gaps and all(gap >= TYPING_INTERVAL - 1.0 for gap in gaps), gaps
    elapsed = calls[-1].at - calls[0].at
    assert len(calls) <= elapsed / TYPING_INTERVAL + 2, (len(calls), elapsed)
