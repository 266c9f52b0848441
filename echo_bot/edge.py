"""The inbound edge every channel's traffic passes (``Edge``, one per channel, made by
``ChannelHost.edge``): who may write, what a stranger is told, the commit, and the
one error a channel acknowledges nothing on.

A channel parses its network's event into an ``InboundMessage`` and hands it to
``Edge.take``, which does in order and once: the allowlist (a message from someone not
allowed is never published), pairing (a stranger's ``pair CODE`` answered), a
stranger's refusal with their ID and the two ways in (at most once per
``REFUSAL_INTERVAL`` per person: anyone can write; audited), then the commit (deduplicated
by channel and ``external_id``). Only when ``take`` returns does the channel acknowledge
its peer; ``CommitFailed`` means the store did not take it, so nothing is acknowledged
and the peer sends it again.

A decision given on a message (a button pressed, a reaction, a typed reply to a prompt)
goes through ``Edge.decide``: it counts only when the message is a prompt this channel
sent (``keep_prompt``: where it went and its buttons' actions, kept in the store, so a
press after a restart still finds it) and offers that answer; anything else — a forged
action, a press on another message, an answer the prompt does not offer — is refused
here, audited and said in the chat, and never reaches the gate. What reaches it is
checked there for who decides, once, for every channel.
"""

from __future__ import annotations

import json
import logging
import time

from . import prompt_answers as answers
from .bus import ChannelHost, Decided, Published
from .errors import CommitFailed, StoreError
from .events import (
    Address,
    ApprovalDecision,
    DecisionInbound,
    DecisionVerb,
    InboundMessage,
    MessageInbound,
    OutboundKind,
    OutboundMessage,
    Sender,
    parse_approval_action,
)
from .plugins import is_local, is_machine
from .typing_shown import TypingShown

log = logging.getLogger(__name__)

REFUSAL_INTERVAL = 600.0  # seconds between two refusals to one stranger
REMEMBERED = 10_000  # strangers remembered, at most

ANSWERS = {
    "paired": "Paired. Welcome! Send {help} to see what I can do.",
    "already": "You are already allowed to talk to me.",
    "wrong": "That code is not valid (codes expire after 10 minutes).",
    "locked": "Too many wrong codes. Try again in an hour.",
}


def pair_answer(result: str, help_command: str) -> str:
    """What the stranger is told after sending a code (``AccessControl.pair``'s result)."""
    return ANSWERS.get(result, "Pairing failed.").format(help=help_command)


def pair_code(text: str) -> str | None:
    """The code of a ``pair CODE`` (or ``/pair CODE``, ``!pair CODE``) message; None when
    ``text`` is not one."""
    words = text.strip().split(maxsplit=1)
    if len(words) != 2 or words[0].lower().lstrip("/!") != "pair":
        return None
    return words[1].strip()[:32]


def refusal(network: str, user_id: str, send_as: str) -> str:
    """The answer to a stranger: their ID, and the two ways in."""
    return (
        f"Sorry, I only talk to people my owner has allowed. Your {network.capitalize()} user"
        f" ID is {user_id}: the owner can add it to [{network}] allowed_users, or give you a"
        f" code from `echo-bot pair` to send {send_as}."
    )


class Refusals:
    """When each stranger was last refused (or anything else was last said)."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def due(self, user_id: str) -> bool:
        """Whether to refuse ``user_id`` now (counted as refused when True)."""
        now = time.monotonic()
        last = self._at.get(user_id)
        if last is not None and now - last < REFUSAL_INTERVAL:
            return False
        if len(self._at) > REMEMBERED:
            self._at.clear()
        self._at[user_id] = now
        return True


NOT_OFFERED = "⚠️ That answer is not one this request offers."
ELSEWHERE = "⚠️ That request was asked in another chat: it is answered there only."
NOT_APPROVER = "⚠️ You are not allowed to decide this request."


class Edge:
    """One channel's way in (see the module's docstring)."""

    def __init__(
        self, channel: str, host: ChannelHost, *, prefix: str = "/",
        pair_as: str = "as `pair CODE`", typing: TypingShown | None = None,
    ) -> None:  # fmt: skip
        self.channel = channel
        self.typing = typing  # shows the chat typing from a message's commit
        self.prefix = prefix  # what the network's commands start with (``!`` on Slack)
        self.pair_as = pair_as  # how a stranger is told to send a code
        self._host = host
        self.refusals = Refusals()
        self._seldom = Refusals()  # notices said seldom, by chat and text
        self._has_allowlist = not (is_local(channel) or is_machine(channel))

    async def take(self, message: InboundMessage) -> str | None:
        """``message`` committed (its inbound ID), or None: from a stranger, who was
        answered. Raises ``CommitFailed`` when the store did not take it (nor could
        say whether its sender is allowed). The terminal's person is the owner, and a
        webhook's request proved its signature: their channels (``ChannelSpec.local``,
        ``machine``) have no allowlist."""
        try:
            if (
                isinstance(message, MessageInbound)
                and self._has_allowlist
                and not await self._host.access.is_allowed(self.channel, message.sender.id)
            ):
                await self._stranger(message)
                return None
        except StoreError as exc:
            raise CommitFailed(str(exc)) from exc
        published = await self.commit(self._as_command(message))
        fresh = isinstance(message, MessageInbound) and not published.duplicate
        if self.typing is not None and fresh:
            self.typing.start(message.address, published.inbound_id)
        return published.inbound_id

    def _as_command(self, message: InboundMessage) -> InboundMessage:
        """``!help`` on a network whose commands start with ``!``: the core's ``/help``
        (a known command's name only: ``!important`` stays as typed)."""
        text = message.text if isinstance(message, MessageInbound) else None
        if self.prefix == "/" or not text or not text.startswith(self.prefix):
            return message
        word = text[len(self.prefix) :].split(maxsplit=1)
        if not word or word[0].lower() not in {name for name, _ in self._host.commands}:
            return message
        return message.model_copy(update={"text": "/" + text[len(self.prefix) :]})

    async def commit(self, message: InboundMessage) -> Published:
        """``message`` committed as it is, and whether the network had sent it before
        (``duplicate``): for what ``take`` let through, and for a channel that answers
        a repeat otherwise (a webhook). Raises ``CommitFailed``."""
        try:
            return await self._host.bus.publish(message)
        except StoreError as exc:
            raise CommitFailed(str(exc)) from exc

    async def notice(
        self, to: Address, text: str, *, quote: str | None = None, seldom: bool = False
    ) -> None:
        """A notice from the bot in ``to`` (queued like any message: delivered in order).
        ``seldom``: at most once per REFUSAL_INTERVAL per chat and text, for a notice
        anyone can make repeat (a message the bot cannot read)."""
        if seldom and not self._seldom.due(f"{to}\n{text}"):
            return
        await self._host.bus.send(
            OutboundMessage(to=to, text=text, kind=OutboundKind.NOTICE, quote=quote)
        )

    async def pair(self, user_id: str, code: str) -> str:
        """The answer to ``code`` sent by ``user_id`` here."""
        return pair_answer(await self._host.access.pair(self.channel, user_id, code), self.help)

    @property
    def help(self) -> str:
        return f"{self.prefix}help"

    async def refuse(self, to: Address, user_id: str, *, quote: str | None = None) -> None:
        """Tell a stranger their ID and the two ways in, unless they were told in the
        last ``REFUSAL_INTERVAL``."""
        if self.refusals.due(user_id):
            await self._host.audit(f"{self.channel}.refused", user=user_id, chat=str(to))
            await self.notice(to, refusal(self.channel, user_id, self.pair_as), quote=quote)

    async def invited(self, inviter: str, *, direct: bool, where: str) -> str:
        """Whether to join a chat ``inviter`` asked the bot into (a network where the
        bot is invited): "join" (they are allowed), "pair" (a stranger's direct invite
        while a pairing code waits: join, then ``refuse`` there, which tells them how
        to send it), or "refuse" (audited). Raises ``CommitFailed`` when the store could
        not say: the invite comes again."""
        try:
            if await self._host.access.is_allowed(self.channel, inviter):
                return "join"
            if direct and await self._host.access.pairing_open():
                return "pair"
        except StoreError as exc:
            raise CommitFailed(str(exc)) from exc
        await self._host.audit(f"{self.channel}.invite_refused", chat=where, inviter=inviter)
        return "refuse"

    async def keep_prompt(self, message_id: str, message: OutboundMessage) -> None:
        """``message`` (an approval prompt) as sent, ``message_id`` its id on the
        network (unique within the channel): where it went and its buttons' actions.
        Keep it before the send returns its receipt: a press may come at once."""
        actions = [button.action for row in message.buttons for button in row]
        note = json.dumps({"to": str(message.to), "actions": actions})
        await self._host.remember_note(self._prompt_key(message_id), note)

    async def decide(
        self, message_id: str, sender: Sender, external_id: str, *,
        action: str | None = None, verb: DecisionVerb | None = None, at: Address | None = None,
    ) -> Decided:  # fmt: skip
        """A decision ``sender`` gave on message ``message_id``: a button's ``action``,
        or a ``verb`` (a reaction, a typed answer). Taken (committed, ``external_id``
        unique) only when that message is a kept prompt offering it; refused (audited,
        said in the chat) when it is a prompt that does not, or, for a button, when it
        is no prompt at all. ``at``: where it was given, for a prompt kept without
        where it went (and for a button on no prompt)."""
        kept = await self._kept(message_id)
        if kept is None and action is None:  # a reaction or a reply to another message
            return Decided("no_prompt")
        to, actions = kept or (None, [])  # a button on no prompt of ours: refused
        if not self.approves(sender.id):
            await self._not_approver(to or at, sender, message_id)
            return Decided("refused", to or at)
        if (
            to is not None
            and at is not None
            and (to.channel, to.chat_id) != (at.channel, at.chat_id)
        ):
            # Given in another chat (a network that does not check what a reply or a
            # reaction points at): the prompt is its own chat's alone.
            await self._not_offered(at, sender, message_id, action or (verb or ""), ELSEWHERE)
            return Decided("refused", at)
        to = to or at
        if verb is not None and action is None:
            action = next((a for a in actions if a.split(":", 1)[0] == verb.value), None)
        parsed = parse_approval_action(action) if action in actions else None
        if to is None or parsed is None:
            await self._not_offered(to, sender, message_id, action or (verb or ""))
            return Decided("refused", to)
        chosen, request_id, seconds = parsed
        decision = ApprovalDecision(
            request_id=request_id, verb=chosen, decided_by=to, sender_id=sender.id,
            via=self.channel, allow_for_seconds=seconds,
        )  # fmt: skip
        await self.take(
            DecisionInbound(address=to, sender=sender, decision=decision, external_id=external_id)
        )
        return Decided("taken", to)

    async def react(
        self, prompt_id: str, sender: Sender, external_id: str, key: str, at: Address
    ) -> None:
        """A reaction ``key`` on message ``prompt_id``: the answer it means, if any."""
        verb = answers.verb_of_reaction(key)
        if verb is not None:
            await self.decide(prompt_id, sender, external_id, verb=verb, at=at)

    async def reply(
        self, prompt_id: str, sender: Sender, external_id: str, text: str, at: Address
    ) -> bool:
        """A reply ``text`` to message ``prompt_id``, as the answer it types; False when
        it is none or replies to no prompt (then it is a message like any other)."""
        verb = answers.verb_of_reply(text)
        if verb is None:
            return False
        decided = await self.decide(prompt_id, sender, external_id, verb=verb, at=at)
        return decided.outcome != "no_prompt"

    async def lone_answer(self, to: Address, text: str, how: str) -> bool:
        """``approve`` or ``deny`` typed on its own while a request waits in ``to``: on a
        network without buttons the person is told ``how`` to answer instead (True), and
        the word never reaches the brain."""
        if not answers.is_lone_answer(text) or not await self._host.pending_prompts(to):
            return False
        await self.notice(to, how)
        return True

    def _prompt_key(self, message_id: str) -> str:
        return f"{self.channel}-prompt:{message_id}"

    async def _kept(self, message_id: str) -> tuple[Address | None, list[str]] | None:
        """The kept prompt: where it went (None when kept without it: an older
        channel's list of actions alone) and its actions."""
        try:
            found = await self._host.recall_note(self._prompt_key(message_id))
            if found is None:
                return None
            loaded = json.loads(found[0])
            if isinstance(loaded, list):
                return None, [str(a) for a in loaded]
            return Address.parse(str(loaded["to"])), [str(a) for a in loaded["actions"]]
        except StoreError as exc:
            raise CommitFailed(str(exc)) from exc
        except (ValueError, KeyError, TypeError):
            return None

    async def _not_offered(
        self, to: Address | None, sender: Sender, message_id: str, answer: str,
        said: str = NOT_OFFERED,
    ) -> None:  # fmt: skip
        log.warning(
            "%s: %s's answer %r on %s is not one its prompt offers",
            self.channel, sender.id, answer[:80], message_id,
        )  # fmt: skip
        await self._host.audit(
            f"{self.channel}.forged_action", user=sender.id, message=message_id, action=answer[:80]
        )
        if to is not None:
            await self.notice(to, said)

    def approves(self, user_id: str) -> bool:
        """Whether ``user_id`` may decide anything here: one of the channel's approvers
        (a channel without an allowlist: anyone; the gate decides the rest)."""
        return not self._has_allowlist or self._host.access.may_approve(self.channel, user_id)

    async def _not_approver(self, to: Address | None, sender: Sender, message_id: str) -> None:
        """A press (or a typed answer) by someone who approves nothing here: refused
        before anything is committed, and told so at most once per REFUSAL_INTERVAL —
        anyone who sees a prompt's buttons could press them a thousand times."""
        if not self.refusals.due(f"decide\n{sender.id}"):
            return
        await self._host.audit(
            f"{self.channel}.not_approver", user=sender.id, message=message_id, chat=str(to)
        )
        if to is not None:
            await self.notice(to, NOT_APPROVER)

    async def _stranger(self, message: MessageInbound) -> None:
        code = pair_code(message.text or "")
        if code is None:
            await self.refuse(message.address, message.sender.id, quote=message.message_id)
            return
        answer = await self.pair(message.sender.id, code)
        await self.notice(message.address, answer, quote=message.message_id)
