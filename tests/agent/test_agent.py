"""The agent through the real core: the inbox, per-session order, tools failing in every
way a tool can, several approvals in one step, step limits, brain failures, the audit."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from echo_bot.agent.runner import MAX_CALLS_PER_STEP
from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import InboundStatus, MessageInbound, OutboundMessage, ToolCallInbound, new_id
from echo_bot.tools.base import Risk, Tool, ToolContext, ToolGroup, ToolResult
from tests.conftest import Bot, calls_of_turn, inbound_of, running_bot, store_engine
from tests.fakes.channel import RecordingChannel
from tests.fakes.openai_api import FakeOpenAI
from tests.waiting import eventually

# Each test runs on SQLite and on a real PostgreSQL server.
pytestmark = pytest.mark.usefixtures("on_both_engines")


CODING = """
[tools]
profile = "coding"
"""


# -- helpers ------------------------------------------------------------------------------
async def inbox_status(bot: Bot, inbound_id: str) -> InboundStatus:
    row = await bot.store.run(lambda tx: tx.inbox.get(inbound_id))
    assert row is not None
    return row.status


def replies_to(channel: RecordingChannel, inbound_id: str) -> list[OutboundMessage]:
    return [
        m for m in channel.sent if m.kind == "reply" and m.metadata.get("inbound_id") == inbound_id
    ]


def prompts_for(channel: RecordingChannel, inbound_id: str) -> list[OutboundMessage]:
    return [
        m
        for m in channel.sent
        if m.kind == "approval" and m.edit_of is None and m.metadata.get("inbound_id") == inbound_id
    ]


def action_of(message: OutboundMessage, label: str) -> str:
    return next(b.action for row in message.buttons for b in row if b.label == label)


def tool_schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False}


# -- the inbox ----------------------------------------------------------------------------
async def test_the_same_external_id_twice_is_answered_once(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        first = await bot.channel.say("what time is it?", external_id="update-1")
        again = await bot.channel.say("what time is it?", external_id="update-1")
        assert again == first
        await bot.channel.reply_to(first)
        # A later message in the same chat is answered after anything queued before it,
        # so once it is answered a duplicate turn would have answered too.
        later = await bot.channel.say("/help", external_id="update-2")
        await bot.channel.reply_to(later)
        assert len(replies_to(bot.channel, first)) == 1

        stored = await bot.store.run(lambda tx: inbound_of(tx, bot.channel.name))
        assert len([m for m in stored if m.external_id == "update-1"]) == 1


class SleepTool(Tool):
    """A read tool that takes the given time: later messages finish sooner."""

    name: ClassVar[str] = "nap"
    description: ClassVar[str] = "Sleep a little, then say so."
    parameters: ClassVar[dict[str, Any]] = tool_schema(
        seconds={"type": "number", "minimum": 0, "maximum": 5}, tag={"type": "string"}
    )
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "basic"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(args.get("seconds", 0))
        return ToolResult.success(f"napped {args.get('tag', '')}")


async def test_turns_in_one_session_are_answered_in_arrival_order(state_dir: Path) -> None:
    async with running_bot(state_dir, tools=[SleepTool()]) as bot:
        ids = []
        for n in range(5):
            seconds = (4 - n) * 0.05  # if turns overlapped, the last would answer first
            ids.append(await bot.channel.say(f'/tool nap {{"seconds": {seconds}, "tag": "{n}"}}'))
        for inbound in ids:
            await bot.channel.reply_to(inbound)
        order = [
            m.metadata["inbound_id"]
            for m in bot.channel.sent
            if m.kind == "reply" and m.metadata.get("inbound_id") in ids
        ]
        assert order == ids
        for n, inbound in enumerate(ids):
            assert replies_to(bot.channel, inbound)[0].text == f"napped {n}"


class GateTool(Tool):
    """A read tool that waits until the test opens the gate."""

    name: ClassVar[str] = "wait_gate"
    description: ClassVar[str] = "Wait until released."
    parameters: ClassVar[dict[str, Any]] = tool_schema()
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "basic"
    timeout: ClassVar[float] = 30.0

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.entered.set()
        await self.release.wait()
        return ToolResult.success("released")


async def test_a_slow_session_does_not_block_another(state_dir: Path) -> None:
    gate = GateTool()
    async with running_bot(state_dir, tools=[gate]) as bot:
        slow = await bot.channel.say("/tool wait_gate {}", chat="a")
        await asyncio.wait_for(gate.entered.wait(), 10)

        quick = await bot.channel.say("what time is it?", chat="b")
        reply = await bot.channel.reply_to(quick)
        assert reply.text.startswith("It is ")
        assert replies_to(bot.channel, slow) == []
        assert await inbox_status(bot, slow) == InboundStatus.RUNNING

        gate.release.set()
        assert (await bot.channel.reply_to(slow)).text == "released"


# -- tools failing in every way -----------------------------------------------------------
async def test_arguments_failing_the_schema_get_invalid_parameter(state_dir: Path) -> None:
    async with running_bot(state_dir, CODING) as bot:
        wrong_type = await bot.channel.say('/tool file_read {"path": 5}')
        reply = await bot.channel.reply_to(wrong_type)
        assert "INVALID_PARAMETER" in reply.text and "path" in reply.text

        missing = await bot.channel.say('/tool file_read {"max_bytes": 10}')
        reply = await bot.channel.reply_to(missing)
        assert "INVALID_PARAMETER" in reply.text and "'path' is a required property" in reply.text

        extra = await bot.channel.say('/tool file_read {"path": "a", "mode": "rw"}')
        assert "INVALID_PARAMETER" in (await bot.channel.reply_to(extra)).text


async def test_unknown_tool_suggests_a_close_name(state_dir: Path) -> None:
    async with running_bot(state_dir, CODING) as bot:
        inbound = await bot.channel.say('/tool file_raed {"path": "a.txt"}')
        reply = await bot.channel.reply_to(inbound)
        assert "TOOL_NOT_FOUND" in reply.text
        assert "Did you mean" in reply.text and "file_read" in reply.text


async def test_invalid_json_arguments_get_a_clear_answer(state_dir: Path) -> None:
    async with running_bot(state_dir, CODING) as bot:
        broken = await bot.channel.say('/tool file_read {"path": }')
        assert "not valid JSON" in (await bot.channel.reply_to(broken)).text
        not_object = await bot.channel.say("/tool file_read [1, 2]")
        assert "must be a JSON object" in (await bot.channel.reply_to(not_object)).text


class RaisingTool(Tool):
    name: ClassVar[str] = "explode"
    description: ClassVar[str] = "Always raises."
    parameters: ClassVar[dict[str, Any]] = tool_schema()
    risk: ClassVar[Risk] = Risk.READ

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise RuntimeError("the flux capacitor melted")


class SlowTool(Tool):
    name: ClassVar[str] = "dawdle"
    description: ClassVar[str] = "Takes longer than it may."
    parameters: ClassVar[dict[str, Any]] = tool_schema()
    risk: ClassVar[Risk] = Risk.READ
    timeout: ClassVar[float] = 0.2

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(60)
        return ToolResult.success("finally")


class ChattyTool(Tool):
    name: ClassVar[str] = "chatter"
    description: ClassVar[str] = "Returns a lot of text."
    parameters: ClassVar[dict[str, Any]] = tool_schema()
    risk: ClassVar[Risk] = Risk.READ

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success("".join(f"{i % 10}" for i in range(100_000)))


async def test_a_raising_tool_is_a_tool_error_and_the_daemon_goes_on(state_dir: Path) -> None:
    async with running_bot(state_dir, tools=[RaisingTool()]) as bot:
        inbound = await bot.channel.say("/tool explode {}")
        reply = await bot.channel.reply_to(inbound)
        assert "TOOL_ERROR" in reply.text and "the flux capacitor melted" in reply.text
        assert await inbox_status(bot, inbound) == InboundStatus.DONE

        after = await bot.channel.say("what time is it?")
        assert (await bot.channel.reply_to(after)).text.startswith("It is ")


async def test_a_tool_over_its_timeout_answers_timeout(state_dir: Path) -> None:
    async with running_bot(state_dir, tools=[SlowTool()]) as bot:
        inbound = await bot.channel.say("/tool dawdle {}")
        reply = await bot.channel.reply_to(inbound)
        assert "TIMEOUT" in reply.text and "0.2 s" in reply.text
        assert "finally" not in reply.text


async def test_huge_output_is_truncated_for_the_model_and_kept_in_full(state_dir: Path) -> None:
    async with running_bot(state_dir, tools=[ChattyTool()]) as bot:
        inbound = await bot.channel.say("/tool chatter {}")
        reply = await bot.channel.reply_to(inbound)
        assert "truncated" in reply.text
        assert len(reply.text) < 20_000

        calls = await bot.store.run(lambda tx: calls_of_turn(tx, inbound))
        [output] = [c.result["output"] for c in calls if c.name == "chatter" and c.result]
        assert len(output) == 100_000
        assert output == "".join(f"{i % 10}" for i in range(100_000))


# -- brains that ask for several things, loop, or fail -------------------------------------
def trailing_tool_results(conversation: Sequence[ChatMessage]) -> list[ChatMessage]:
    results: list[ChatMessage] = []
    for message in reversed(conversation):
        if message.role != "tool":
            break
        results.append(message)
    return list(reversed(results))


class ThreeWritesBrain:
    """Asks for two identical file_write calls and a different one, then reports."""

    name = "three-writes"

    def __init__(self) -> None:
        self.calls = 0

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        self.calls += 1
        results = trailing_tool_results(conversation)
        if results:
            return BrainReply(
                text="results: " + " | ".join(m.content or "" for m in results),
                route_reason="test: reported results",
            )
        same = {"path": "same.txt", "content": "same"}
        other = {"path": "other.txt", "content": "o"}
        return BrainReply(
            tool_calls=[
                ToolCall(id=new_id(), name="file_write", args=dict(same)),
                ToolCall(id=new_id(), name="file_write", args=other),
                ToolCall(id=new_id(), name="file_write", args=dict(same)),
            ],
            route_reason="test: three writes",
        )


async def test_identical_calls_share_one_prompt_and_the_turn_waits_for_all(
    state_dir: Path,
) -> None:
    brain = ThreeWritesBrain()
    workspace = state_dir / "workspace"
    async with running_bot(state_dir, CODING, brain=brain) as bot:
        inbound = await bot.channel.say("write the files")

        async def two_prompts() -> bool:
            return len(prompts_for(bot.channel, inbound)) >= 2

        await eventually(two_prompts)
        prompts = prompts_for(bot.channel, inbound)
        assert len(prompts) == 2
        same = next(p for p in prompts if "same.txt" in p.text)
        other = next(p for p in prompts if "other.txt" in p.text)
        assert await inbox_status(bot, inbound) == InboundStatus.WAITING_APPROVAL

        await bot.channel.press(action_of(same, "Approve once"))

        async def resumed_and_suspended_again() -> bool:
            # The approved twins leave "waiting" only when the turn resumes; the inbox row
            # is "running" from then until the turn suspends again on the other request.
            calls = await bot.store.run(lambda tx: calls_of_turn(tx, inbound))
            twins = [c.status for c in calls if c.args["path"] == "same.txt"]
            resumed = all(s in ("approved", "done") for s in twins)
            suspended = await inbox_status(bot, inbound) == InboundStatus.WAITING_APPROVAL
            return resumed and suspended

        await eventually(resumed_and_suspended_again)
        assert replies_to(bot.channel, inbound) == []
        assert not (workspace / "other.txt").exists()
        assert brain.calls == 1  # not asked again while a call of the step still waits

        await bot.channel.press(action_of(other, "Deny"))
        reply = await bot.channel.reply_to(inbound)
        assert reply.text.startswith("results: ")
        assert reply.text.count("Wrote 4 bytes to same.txt") == 2
        assert "APPROVAL_DENIED" in reply.text
        assert (workspace / "same.txt").read_text() == "same"
        assert not (workspace / "other.txt").exists()
        assert len(prompts_for(bot.channel, inbound)) == 2
        assert brain.calls == 2
        assert await inbox_status(bot, inbound) == InboundStatus.DONE


class LoopingBrain:
    name = "looping"

    def __init__(self) -> None:
        self.calls = 0

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        self.calls += 1
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name="current_time", args={})],
            route_reason="test: again",
        )


async def test_max_steps_stops_a_brain_that_never_finishes(state_dir: Path) -> None:
    brain = LoopingBrain()
    async with running_bot(state_dir, "[brain]\nmax_steps = 2\n", brain=brain) as bot:
        inbound = await bot.channel.say("what time is it, forever?")
        reply = await bot.channel.reply_to(inbound)
        assert "stopped after 2 steps" in reply.text
        assert brain.calls == 2
        assert await inbox_status(bot, inbound) == InboundStatus.DONE


class FragileBrain:
    name = "fragile"

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        text = conversation[-1].content or ""
        if "boom" in text:
            raise RuntimeError("model exploded")
        return BrainReply(text=f"heard: {text}", route_reason="test: echo")


async def test_a_failing_brain_fails_the_turn_and_the_next_is_answered(state_dir: Path) -> None:
    async with running_bot(state_dir, brain=FragileBrain()) as bot:
        inbound = await bot.channel.say("boom")
        reply = await bot.channel.reply_to(inbound)
        assert reply.text.startswith("Sorry")
        assert await inbox_status(bot, inbound) == InboundStatus.FAILED

        after = await bot.channel.say("hello")
        assert (await bot.channel.reply_to(after)).text == "heard: hello"
        assert await inbox_status(bot, after) == InboundStatus.DONE


# -- the audit log and secrets ------------------------------------------------------------
async def test_one_turn_is_audited_under_one_trace_id(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        inbound = await bot.channel.say("/tool current_time {}")
        reply = await bot.channel.reply_to(inbound)
        trace_id = reply.trace_id
        assert trace_id

        rows = await bot.store.run(lambda tx: tx.audit.read(trace_id=trace_id))
        kinds = [r.kind for r in rows]
        for kind in ("turn.started", "brain.decision", "tool.result", "turn.finished"):
            assert kind in kinds, kinds
        assert kinds[0] == "turn.started" and kinds[-1] == "turn.finished"
        assert all(r.trace_id == trace_id for r in rows)
        assert rows[0].data["inbound_id"] == inbound
        decisions = [r for r in rows if r.kind == "brain.decision"]
        assert decisions[0].data["route_reason"] == "rules: command /tool current_time"
        [result] = [r for r in rows if r.kind == "tool.result"]
        assert result.data["tool"] == "current_time" and result.data["ok"] is True
        assert rows[-1].data["reply"] == reply.text


async def test_secret_values_are_masked_in_replies_and_audit(state_dir: Path) -> None:
    secret = "tg-secret-value-123"
    environ = {"TELEGRAM_BOT_TOKEN": secret}
    workspace = state_dir / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text(f"the token is {secret} (do not share)\n")
    async with running_bot(state_dir, CODING, environ=environ) as bot:
        inbound = await bot.channel.say('/tool file_read {"path": "notes.txt"}')
        reply = await bot.channel.reply_to(inbound)
        assert "the token is *** (do not share)" in reply.text
        assert secret not in reply.text
        pasted = await bot.channel.say(f"here is the bot token: {secret}")  # kept from history
        await bot.channel.reply_to(pasted)

        rows = await bot.store.run(lambda tx: tx.audit.read(tail=10_000))
        assert any(r.kind == "tool.result" for r in rows)
        for row in rows:
            assert secret not in json.dumps(row.data), row.kind

        def stored(db: Any) -> list[str]:
            texts = [r[0] or "" for r in db.execute("SELECT result FROM tool_calls")]
            texts += [r[0] or "" for r in db.execute("SELECT content FROM messages")]
            texts += [r[0] for r in db.execute("SELECT payload FROM outbox")]
            return texts

        assert not [t for t in await bot.db.run(stored) if secret in t]


async def test_an_external_id_older_than_the_dedup_window_is_new_again(state_dir: Path) -> None:
    """Telegram may reuse an update_id after a week of silence: it must be answered."""
    from echo_bot.store.inbox import DEDUP_WINDOW

    async with running_bot(state_dir) as bot:
        first = await bot.channel.say("what time is it?", external_id="update-7")
        await bot.channel.reply_to(first)
        again = await bot.channel.say("what time is it?", external_id="update-7")
        assert again == first  # within the window: a duplicate
        old = time.time() - DEDUP_WINDOW - 60
        await bot.db.run(
            lambda db: db.execute("UPDATE inbox SET received_at = ? WHERE id = ?", [old, first])
        )
        later = await bot.channel.say("what time is it?", external_id="update-7")
        assert later != first
        await bot.channel.reply_to(later)


async def test_every_message_is_taken_once_whether_handed_over_or_found_by_the_poll(
    state_dir: Path,
) -> None:
    """In-process messages reach the dispatcher in memory (InboundCommitted) right after
    their commit; rows other processes commit are found by the inbox poll. Neither path
    may run a message twice, nor miss one (the poll reads only rows another process
    wrote)."""
    from echo_bot import metrics
    from echo_bot.events import Address, Sender
    from echo_bot.secrets import Masker
    from echo_bot.store import Tx

    def adding(m: MessageInbound) -> Callable[[Any], object]:
        """Work for the other process's store that adds ``m`` (bound now)."""
        return lambda db: Tx(db, Masker()).inbox.add(m)

    def taken() -> float:
        value = metrics.REGISTRY.get_sample_value(
            "echo_bot_inbound_total", {"channel": "cli", "kind": "message"}
        )
        return value or 0.0

    nap = '/tool nap {"seconds": 0.15}'
    async with running_bot(state_dir, tools=[SleepTool()]) as bot:
        before = taken()
        # Another process (a management command, say) commits to the same store file.
        other = store_engine(bot.state_dir)
        await asyncio.to_thread(other.open_sync)  # as a management command opens it
        elsewhere = [
            MessageInbound(
                address=Address(channel="cli", chat_id=f"other{i % 3}"),
                sender=Sender(id="owner"),
                text=nap,
                external_id=new_id(),
            )
            for i in range(9)
        ]
        try:
            # Turns of one chat wait for each other, so many rows stay accepted in the
            # inbox across several polls.
            here, _ = await asyncio.gather(
                asyncio.gather(*(bot.channel.say(nap, chat=f"chat{i % 2}") for i in range(16))),
                asyncio.gather(*(other.run(adding(m)) for m in elsewhere)),
            )
            ids = [*here, *(m.id for m in elsewhere)]
            for inbound_id in ids:
                await bot.channel.reply_to(inbound_id)
            # Two more polls, each proven by a row the other process commits now being
            # answered (only the poll finds it): a row read twice would be taken again.
            later = []
            for n in range(2):
                marker = MessageInbound(
                    address=Address(channel="cli", chat_id=f"other{n}"),
                    sender=Sender(id="owner"),
                    text=nap,
                    external_id=new_id(),
                )
                await other.run(adding(marker))
                await bot.channel.reply_to(marker.id)
                later.append(marker.id)
        finally:
            await asyncio.to_thread(other.close_sync)
        assert all(len(replies_to(bot.channel, i)) == 1 for i in [*ids, *later])
        assert taken() - before == len(ids) + len(later)


async def test_a_tool_call_turn_whose_call_is_done_is_reported_not_run_again(
    state_dir: Path,
) -> None:
    """A webhook/cron call's result is stored when it is done, and the turn finishes in
    the next commit; a crash between them leaves the turn with its call done. After the
    restart the call's stored result is reported (it ran), not planned or run again."""
    from echo_bot.events import Address, Sender, ToolCallRequest
    from echo_bot.secrets import Masker
    from echo_bot.statuses import CallStatus
    from echo_bot.store import Tx

    inbound = ToolCallInbound(
        address=Address(channel="cli", chat_id="local"),
        sender=Sender(id="webhook:deploy"),
        tool_call=ToolCallRequest(tool="current_time"),
        external_id=new_id(),
    )

    def interrupted(db: Any) -> None:
        tx = Tx(db, Masker())
        tx.inbox.add(inbound)
        tx.turns.create(inbound.id, inbound.session_key, inbound.trace_id)
        call = ToolCall(id=f"{inbound.id}-0", name="current_time", args={})
        tx.turns.add_calls(inbound.id, 0, [(call, "hash")])
        result = ToolResult.success("It is the stored hour.").to_json()
        tx.turns.set_call(call.id, CallStatus.DONE, result=result)
        tx.flush()  # as Store.run ends a unit of work

    store = store_engine(state_dir)
    await store.open()
    try:
        await store.run(interrupted)
    finally:
        await store.close()
    async with running_bot(state_dir) as bot:
        reply = await bot.channel.reply_to(inbound.id)
        assert reply.text == "current_time: It is the stored hour."
        assert await inbox_status(bot, inbound.id) == InboundStatus.DONE
        calls = await bot.store.run(lambda tx: calls_of_turn(tx, inbound.id))
        assert len(calls) == 1  # not planned (nor run) a second time


async def test_a_long_backlog_in_one_session_is_answered_once_each_in_order(
    state_dir: Path,
) -> None:
    """Past a few dozen queued turns a session keeps ids instead of whole messages (and
    reads those back when their turn comes): the order and the answers stay the same."""
    async with running_bot(state_dir) as bot:
        ids = await asyncio.gather(
            *(bot.channel.say(f'/tool current_time {{"timezone": "UTC"}} #{n}') for n in range(90))
        )
        for inbound in ids:
            await bot.channel.reply_to(inbound)
        order = [
            m.metadata["inbound_id"]
            for m in bot.channel.sent
            if m.kind == "reply" and m.metadata.get("inbound_id") in ids
        ]
        assert order == list(ids)


async def test_replies_go_out_once_while_the_outbox_is_read_all_the_time(state_dir: Path) -> None:
    """A reply at the head of its chat is handed to the delivery worker right after its
    commit, while the worker's own reads of the outbox (woken here by a stream of other
    messages) may see the same row queued: each must still be sent exactly once."""
    async with running_bot(state_dir) as bot:
        bus = bot.channel.bus
        assert bus is not None
        side = bot.channel.address("side")

        async def notes() -> None:
            for n in range(80):
                await bus.send(OutboundMessage(to=side, text=f"note {n}"))

        ids, _ = await asyncio.gather(
            asyncio.gather(
                *(bot.channel.say("what time is it?", chat=f"chat{i % 8}") for i in range(64))
            ),
            notes(),
        )
        for inbound in ids:
            await bot.channel.reply_to(inbound)
        await bot.channel.wait_for(lambda m: m.text == "note 79")
        assert all(len(replies_to(bot.channel, i)) == 1 for i in ids)
        sent_notes = [m.text for m in bot.channel.sent if m.to == side]
        assert sent_notes == [f"note {n}" for n in range(80)]
        assert len(bot.channel.attempts) == len(bot.channel.sent)  # no send made twice


async def test_a_step_asking_for_hundreds_of_calls_runs_sixteen_and_keeps_the_question(
    state_dir: Path,
) -> None:
    """A model answer with 300 send_message calls (the real openai SDK, a scripted
    server): 16 run, the next request still carries the person's question, and the
    model can ask for more in its next step."""
    config = (
        '[brain]\nkind = "openai"\n[openai]\nbase_url = "{url}"\nmodel = "gpt-test"\n'
        "max_retries = 0\nstream = false\n"
    )
    async with FakeOpenAI(model="gpt-test", api_key="sk-test") as llm:
        llm.tool_calls([("send_message", {"text": f"spam {n}"}) for n in range(300)])
        llm.reply("done")
        async with running_bot(state_dir, config.format(url=llm.base_url),
                               environ={"OPENAI_API_KEY": "sk-test"}) as bot:  # fmt: skip
            inbound = await bot.channel.say("hello there")
            reply = await bot.channel.reply_to(inbound)
            spam = [m for m in bot.channel.sent if m.text.startswith("spam")]
        second = llm.chat_requests()[1]["messages"]
    assert reply.text == "done"
    assert len(spam) == MAX_CALLS_PER_STEP
    assert any(m["role"] == "user" and m.get("content") == "hello there" for m in second)
    [asked] = [m for m in second if m.get("tool_calls")]
    assert len(asked["tool_calls"]) == MAX_CALLS_PER_STEP
