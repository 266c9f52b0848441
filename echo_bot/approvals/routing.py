"""Where an approval prompt goes, and who may decide."""

from __future__ import annotations

from ..config import Config, channel_section
from ..events import Address
from ..plugins import ids_tell_direct, is_local, registry
from ..store import Tx

# Where a request waits when no chat can prompt for it (docs/SECURITY.md "Where the prompt
# goes"): no channel has this name, so no prompt is sent anywhere; the owner at the
# server decides it with ``echo-bot approvals approve|deny`` (the gate's ``via ==
# "admin"``), and it expires as every request does.
OWNER_QUEUE = Address(channel="echo-bot", chat_id="approvals")
OWNER_QUEUE_TEXT = "echo-bot approvals"
# Decisions taken in the web console (docs/CONSOLE.md) say ``via="console"``; the owner's
# come from this address, an approver's from their own chat's address.
VIA_CONSOLE = "console"
OWNER_CONSOLE = Address(channel="echo-bot", chat_id="console")


class ApproverDirectory:
    """Approvers per channel, from the config file only (docs/SECURITY.md "Who approves"): the
    configured ``approvers``, or when unset the configured ``allowed_users``. Pairing
    lets a person chat, never approve, so the store's paired users are not consulted.

    The ``tx`` parameters keep lookups inside the caller's transaction, as every
    other directory query is; the config-only rule needs no read."""

    def __init__(self, config: Config) -> None:
        self._approvers: dict[str, frozenset[str]] = {}
        for spec in registry().specs.values():
            section = channel_section(config, spec.name)
            if section is not None:
                self._approvers[spec.name] = frozenset(str(i) for i in spec.approvers(section))
        default = config.approvals.default_chat
        self.default_chat = Address.parse(default) if default else None

    def is_approver(self, tx: Tx, address: Address, sender_id: str) -> bool:
        return self.approves(address, sender_id)

    def console_decides(
        self,
        prompt_to: str,
        requester_id: str,
        decided_by: Address,
        sender_id: str,
        origin: str,
        direct_with: str | None = None,
    ) -> bool:
        """Whether someone signed in to the console may decide a request prompted in
        ``prompt_to``: the owner (a link made at the server) any; an approver what the
        prompt's buttons would let them decide, on their own channel — but not a request
        prompted in another person's own chat with the bot, which they never see.

        Only Telegram's ids say which chat is someone's own (a private chat's id is its
        user's); on a channel whose ids do not (a Matrix room, a Slack conversation), a
        request prompted in the chat another person asked it in is left to them, the
        owner and that chat: it may be their own.

        A prompt in a person's own chat with the bot is that person's alone, as only
        they see its buttons: on Telegram a private chat (its id is its person's); on
        Matrix and Slack a chat its channel said is ``direct_with`` someone (the store's
        ``inbox.direct_with``) — e.g. ``[approvals] default_chat`` set to one approver's
        private chat is never decided by another approver in the console."""
        if decided_by == OWNER_CONSOLE:
            return True
        prompt = Address.parse(prompt_to)
        if prompt.channel != decided_by.channel or decided_by.chat_id != sender_id:
            return False
        ids_tell = ids_tell_direct(prompt.channel)
        private = ids_tell and not prompt.chat_id.startswith("-")
        if private and prompt.chat_id != sender_id:
            return False  # another person's private chat
        if direct_with is not None and direct_with != sender_id:
            return False  # another person's direct chat
        if requester_id != sender_id:
            if prompt.chat_id == requester_id:
                return False
            if not ids_tell and Address.parse(origin) == prompt:
                return False
        return not is_local(prompt.channel) and self.approves(prompt, sender_id)

    def direct(self, address: Address, sender_id: str, said: bool) -> bool:
        """Whether ``address`` is a chat of this sender alone with the bot: the
        terminal, a chat its channel ``said`` is (``Inbound.direct``: a Matrix room of
        two), or a private chat whose id is the sender's (Telegram's). A group's other
        members read what is sent there."""
        return is_local(address.channel) or said or address.chat_id == sender_id

    def approves(self, address: Address, sender_id: str) -> bool:
        """``is_approver`` where no transaction is at hand (the config-only rule)."""
        if is_local(address.channel):  # the terminal is the owner's
            return True
        return self.approves_on(address.channel, sender_id)

    def approves_on(self, channel: str, sender_id: str) -> bool:
        """Whether ``sender_id`` is one of ``channel``'s configured approvers."""
        return sender_id in self._approvers.get(channel, frozenset())

    def has_approvers(self, tx: Tx, address: Address) -> bool:
        return self.prompts_reach(address)

    def prompts_reach(self, address: Address) -> bool:
        """Whether a prompt sent to ``address`` reaches someone who may decide it there
        (``has_approvers`` where no transaction is at hand)."""
        if is_local(address.channel):  # the terminal is the owner's
            return True
        return bool(self._approvers.get(address.channel))

    def route(self, tx: Tx, origin: Address, sender_id: str, deliver_to: Address | None) -> Address:
        """docs/SECURITY.md: origin chat if the requester approves there, else deliver_to, else
        ``[approvals] default_chat``, else ``OWNER_QUEUE`` (no chat can prompt for it:
        it waits for ``echo-bot approvals``). Nothing runs unasked either way."""
        if self.is_approver(tx, origin, sender_id):
            return origin
        return self.routed(deliver_to)[0]

    def routed(self, deliver_to: Address | None) -> tuple[Address, str]:
        """Where the prompt of a requester who does not approve in their own chat goes
        (a webhook route's or cron job's ``deliver_to`` given), and why, as
        ``check-config`` says it."""
        if deliver_to is not None and self.prompts_reach(deliver_to):
            return deliver_to, "deliver_to"
        if self.default_chat is not None and self.prompts_reach(self.default_chat):
            return self.default_chat, "default_chat"
        why = []
        if deliver_to is not None:
            why.append(f"deliver_to {deliver_to} has no approvers")
        if self.default_chat is None:
            why.append("no [approvals] default_chat")
        else:
            why.append(f"default_chat {self.default_chat} has no approvers")
        return OWNER_QUEUE, "; ".join(why)
