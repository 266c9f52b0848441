"""Where an approval prompt goes, and who may decide."""

from __future__ import annotations

from ..config import Config
from ..events import Address
from ..store import Tx

# The terminal is the owner's: whoever types in ``echo-bot chat`` may approve there.
LOCAL_CHANNELS = frozenset({"cli"})


class ApproverDirectory:
    """Approvers per channel, from the config file only (DESIGN.md "Who approves"): the
    configured ``approvers``, or when unset the configured ``allowed_users``. Pairing
    lets a person chat, never approve, so the store's paired users are not consulted.

    The ``tx`` parameters keep lookups inside the caller's transaction, as every
    other directory query is; the config-only rule needs no read."""

    def __init__(self, config: Config) -> None:
        telegram = config.telegram
        self._approvers = {"telegram": frozenset(str(i) for i in telegram.approver_ids)}
        default = config.approvals.default_chat
        self.default_chat = Address.parse(default) if default else None

    def is_approver(self, tx: Tx, address: Address, sender_id: str) -> bool:
        return self.approves(address, sender_id)

    def approves(self, address: Address, sender_id: str) -> bool:
        """``is_approver`` where no transaction is at hand (the config-only rule)."""
        if address.channel in LOCAL_CHANNELS:
            return True
        return sender_id in self._approvers.get(address.channel, frozenset())

    def has_approvers(self, tx: Tx, address: Address) -> bool:
        if address.channel in LOCAL_CHANNELS:
            return True
        return bool(self._approvers.get(address.channel))

    def route(
        self, tx: Tx, origin: Address, sender_id: str, deliver_to: Address | None
    ) -> Address | None:
        """DESIGN.md: origin chat if the requester approves there, else deliver_to, else
        ``[approvals] default_chat``; None when nobody can approve (fail closed)."""
        if self.is_approver(tx, origin, sender_id):
            return origin
        for candidate in (deliver_to, self.default_chat):
            if candidate is not None and self.has_approvers(tx, candidate):
                return candidate
        return None
