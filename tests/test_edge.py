"""The inbound edge every channel's traffic passes (echo_bot/edge.py), on a real daemon
and store: a stranger's message is never committed, they are told their ID once per
interval (audited), a pairing code lets them in, and an allowed person's message is
committed once however often the network delivers it. A decision given on a message
counts only when that message is a kept prompt offering it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from echo_bot.edge import Edge
from echo_bot.events import (
    Address,
    Button,
    DecisionVerb,
    MessageInbound,
    OutboundKind,
    OutboundMessage,
    Sender,
)
from echo_bot.store import Tx
from tests.conftest import Bot, running_bot

CHAT = Address(channel="cli", chat_id="stranger-chat")


class Host:
    """The parts of the daemon's channel host the edge uses."""

    def __init__(self, bot: Bot) -> None:
        self.bus = bot.daemon.runtime.bus
        self.access = bot.daemon.runtime.access
        self.commands = [("help", "what I can do"), ("tools", "the tools")]
        self._store = bot.store

    async def remember_note(self, name: str, value: str, *, replace: bool = True) -> None:
        await self._store.run(lambda tx: tx.meta.set_note(name, value, replace=replace))

    async def recall_note(self, name: str) -> tuple[str, float] | None:
        return await self._store.run(lambda tx: tx.meta.note(name))

    async def audit(self, event: str, **data: Any) -> None:
        await self._store.run(
            lambda tx: tx.audit.write(event, trace_id=None, session_key=None, **data)
        )


def said(text: str, external_id: str, user: str = "u-9") -> MessageInbound:
    return MessageInbound(
        address=CHAT, sender=Sender(id=user), text=text, external_id=external_id,
        message_id=external_id,
    )  # fmt: skip


async def test_a_stranger_is_refused_once_and_nothing_of_theirs_is_committed(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("telegram", Host(bot))  # type: ignore[arg-type]  # a chat network's
        assert await edge.take(said("hello", "e1")) is None
        assert await edge.take(said("hello again", "e2")) is None
        await bot.channel.wait_for(lambda m: m.kind == OutboundKind.NOTICE)
        notices = [m for m in bot.channel.sent if m.kind == OutboundKind.NOTICE]
        assert len(notices) == 1 and "u-9" in notices[0].text and "pair CODE" in notices[0].text
        assert notices[0].quote == "e1"  # an answer to what they said
        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert inbox == []
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=10))
        assert [r.kind for r in rows if r.kind.endswith(".refused")] == ["telegram.refused"]


async def test_a_pairing_code_lets_a_stranger_in_and_then_they_are_heard_once(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("telegram", Host(bot), prefix="!")  # type: ignore[arg-type]
        code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
        assert await edge.take(said("pair wrong-code", "e1")) is None
        assert await edge.take(said(f"!pair {code}", "e2")) is None
        await bot.channel.wait_for(lambda m: "Paired" in m.text)
        answers = [m.text for m in bot.channel.sent if m.kind == OutboundKind.NOTICE]
        assert "not valid" in answers[0] and "Send !help" in answers[1], answers
        first = await edge.take(said("now me", "e3"))
        again = await edge.take(said("now me", "e3"))  # the network delivered it twice
        assert first is not None and again == first
        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert len(inbox) == 1


async def test_the_terminal_and_a_webhook_have_no_allowlist_and_commit_once(
    state_dir: Path,
) -> None:
    """The terminal's person is the owner, a webhook's request proved its signature:
    their edges commit what comes, once, and ``commit`` says a repeat is one."""
    async with running_bot(state_dir) as bot:
        terminal, webhook = (Edge(name, Host(bot)) for name in ("cli", "webhook"))  # type: ignore[arg-type]
        assert await terminal.take(said("hello", "t1")) is not None
        first = await webhook.commit(said("a delivery", "w1"))
        again = await webhook.commit(said("a delivery", "w1"))
        assert not first.duplicate and again.duplicate and again.inbound_id == first.inbound_id
        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert len(inbox) == 2 and not [m for m in bot.channel.sent if "allowed" in m.text]


REQUEST = "0123456789abcdef" * 2
PROMPT = OutboundMessage(
    to=CHAT, text="shell_exec: touch x", kind=OutboundKind.APPROVAL,
    buttons=[[Button(label="Approve once", action=f"approve_once:{REQUEST}"),
              Button(label="Deny", action=f"deny:{REQUEST}")]],
)  # fmt: skip


async def test_a_decision_counts_only_on_a_kept_prompt_that_offers_it(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        await Edge("cli", Host(bot)).keep_prompt("m-1", PROMPT)  # type: ignore[arg-type]
        edge = Edge("cli", Host(bot))  # type: ignore[arg-type]  # as after a restart
        owner = Sender(id="owner")

        taken = await edge.decide("m-1", owner, "p1", action=f"deny:{REQUEST}")
        assert (taken.outcome, taken.chat) == ("taken", CHAT)
        by_verb = await edge.decide("m-1", owner, "p2", verb=DecisionVerb.APPROVE_ONCE)
        assert by_verb.outcome == "taken"
        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert len(inbox) == 2

        forged = await edge.decide("m-1", owner, "p3", action=f"approve_once:{'f' * 32}")
        not_offered = await edge.decide("m-1", owner, "p4", verb=DecisionVerb.ALLOW_FOR)
        elsewhere = await edge.decide("m-2", owner, "p5", action=f"approve_once:{REQUEST}",
                                      at=CHAT)  # fmt: skip
        assert [forged.outcome, not_offered.outcome, elsewhere.outcome] == ["refused"] * 3
        a_reply = await edge.decide("m-2", owner, "p6", verb=DecisionVerb.DENY)
        assert a_reply.outcome == "no_prompt"  # a reply to another message: no decision

        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert len(inbox) == 2  # nothing refused reached the gate
        await bot.channel.wait_for(
            lambda m: sum("not one this request offers" in s.text for s in bot.channel.sent) == 3
        )
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=20))
        assert [r.kind for r in rows].count("cli.forged_action") == 3


async def test_attack_presses_by_someone_who_approves_nothing_commit_nothing_and_are_told_once(
    state_dir: Path,
) -> None:
    """Anyone who sees a prompt in a group sees its buttons. Each press by someone who
    is no approver here went to the gate: an inbox row, an audit row and a notice in
    the chat, every time. Refused in the edge now, and told once per REFUSAL_INTERVAL."""
    async with running_bot(state_dir) as bot:
        edge = Edge("telegram", Host(bot))  # type: ignore[arg-type]  # u-9 approves nothing
        await edge.keep_prompt("m-1", PROMPT)
        presser = Sender(id="u-9")
        for n in range(8):
            pressed = await edge.decide("m-1", presser, f"x{n}", action=f"approve_once:{REQUEST}")
            assert pressed.outcome == "refused" and pressed.chat == CHAT
        typed = await edge.reply("m-1", presser, "x9", "approve", CHAT)
        assert typed  # an answer, refused: not a message for the brain
        await bot.channel.wait_for(lambda m: "not allowed to decide" in m.text)
        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert inbox == []
        assert sum("not allowed to decide" in m.text for m in bot.channel.sent) == 1
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=20))
        assert [r.kind for r in rows].count("telegram.not_approver") == 1


async def test_an_answer_given_in_another_chat_than_its_prompts_is_refused(
    state_dir: Path,
) -> None:
    """A network whose message ids are global (Matrix) and that does not check what a
    reply or a reaction points at: an approver's answer in a team room to a prompt in
    someone's direct chat is refused, said where it was given, and audited."""
    team = Address(channel="cli", chat_id="team-room")
    async with running_bot(state_dir) as bot:
        edge = Edge("cli", Host(bot))  # type: ignore[arg-type]
        await edge.keep_prompt("m-1", PROMPT)
        approver = Sender(id="owner")
        assert await edge.reply("m-1", approver, "r1", "approve", team)
        await edge.react("m-1", approver, "r2", "✅", team)
        pressed = await edge.decide("m-1", approver, "r3", action=f"approve_once:{REQUEST}",
                                    at=team)  # fmt: skip
        assert pressed.outcome == "refused" and pressed.chat == team
        here = await edge.reply(
            "m-1", approver, "r4", "deny", CHAT.model_copy(update={"thread_id": "a-thread"})
        )  # the same chat, any thread: its own
        assert here
        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert len(inbox) == 1  # the deny in the prompt's own chat only
        await bot.channel.wait_for(lambda m: "asked in another chat" in m.text)
        assert {m.to for m in bot.channel.sent if "another chat" in m.text} == {team}
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=20))
        assert sum(r.kind == "cli.forged_action" for r in rows) == 3


async def test_reactions_and_typed_replies_answer_a_prompt_and_anything_else_is_a_message(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("cli", Host(bot))  # type: ignore[arg-type]
        await edge.keep_prompt("m-1", PROMPT)
        owner = Sender(id="owner")

        await edge.react("m-1", owner, "r1", "👍", CHAT)  # means nothing: no decision
        await edge.react("m-1", owner, "r2", "❌\ufe0f", CHAT)  # Element's variant of ❌
        assert await edge.reply("m-1", owner, "r3", "> quoted prompt\n\nApprove!", CHAT)
        assert not await edge.reply("m-1", owner, "r4", "what does it do?", CHAT)
        assert not await edge.reply("m-9", owner, "r5", "deny", CHAT)  # no prompt of ours

        inbox = await bot.store.run(lambda tx: tx.inbox.recent("cli", limit=10))
        assert len(inbox) == 2  # ❌ and the typed approve: decisions, the rest none


class Waiting(Host):
    """A host where an approval request waits in ``CHAT``."""

    async def pending_prompts(self, to: Address) -> list[OutboundMessage]:
        return [PROMPT] if to == CHAT else []


async def test_approve_typed_alone_while_a_request_waits_is_told_how_to_answer(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("cli", Waiting(bot))  # type: ignore[arg-type]
        how = "Reply to the prompt with approve or deny."
        assert await edge.lone_answer(CHAT, " Approve. ", how)
        assert not await edge.lone_answer(CHAT, "approve the merge please", how)
        elsewhere = Address(channel="cli", chat_id="other")
        assert not await edge.lone_answer(elsewhere, "deny", how)  # nothing waits there
        await bot.channel.wait_for(lambda m: m.text == how)
        assert [m.text for m in bot.channel.sent].count(how) == 1


async def test_a_command_typed_with_the_networks_prefix_is_the_cores_command(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("cli", Host(bot), prefix="!")  # type: ignore[arg-type]
        typed = ["!help", "!TOOLS please", "!important: read this", "!", "/help"]
        ids = [await edge.take(said(text, f"c{n}")) for n, text in enumerate(typed)]

        def read(tx: Tx) -> list[str | None]:
            rows = [tx.inbox.get(i) for i in ids if i is not None]
            return [
                row.message.text if row and isinstance(row.message, MessageInbound) else None
                for row in rows
            ]

        texts = await bot.store.run(read)
        assert texts == ["/help", "/TOOLS please", "!important: read this", "!", "/help"]


async def test_an_invite_is_joined_for_the_allowed_and_a_stranger_only_to_pair(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("telegram", Host(bot))  # type: ignore[arg-type]
        assert await edge.invited("u-9", direct=True, where="room-1") == "refuse"
        code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
        assert await edge.invited("u-9", direct=False, where="room-2") == "refuse"
        assert await edge.invited("u-9", direct=True, where="room-3") == "pair"
        assert (await edge.pair("u-9", code)).startswith("Paired.")
        assert await edge.invited("u-9", direct=False, where="room-4") == "join"
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=20))
        refused = [r for r in rows if r.kind == "telegram.invite_refused"]
        assert len(refused) == 2


async def test_a_seldom_notice_is_said_once_a_while_per_chat(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        edge = Edge("cli", Host(bot))  # type: ignore[arg-type]
        other = Address(channel="cli", chat_id="other")
        for to in (CHAT, CHAT, other, CHAT):
            await edge.notice(to, "I could not read that.", seldom=True)
        await edge.notice(CHAT, "Something else.", seldom=True)
        await bot.channel.wait_for(lambda m: m.text == "Something else.")
        await bot.channel.wait_for(lambda m: m.to == other)
        said_to = [m.to.chat_id for m in bot.channel.sent if m.text == "I could not read that."]
        assert sorted(said_to) == ["other", CHAT.chat_id]
