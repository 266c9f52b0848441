"""Where an approval prompt goes, and who may decide."""

from __future__ import annotations

from ..config import Config
from ..events import Address

# The terminal is the owner's: whoever types in ``echo-bot chat`` may approve there.
LOCAL_CHANNELS = frozenset({"cli"})


class ApproverDirectory:
    def __init__(self, config: Config) -> None:
        self._telegram = {str(i) for i in config.telegram.approver_ids}
        default = config.approvals.default_chat
        self.default_chat = Address.parse(default) if default else None

    def is_approver(self, address: Address, sender_id: str) -> bool:
        if address.channel in LOCAL_CHANNELS:
            return True
        if address.channel == "telegram":
            return sender_id in self._telegram
        return False

    def has_approvers(self, address: Address) -> bool:
        if address.channel in LOCAL_CHANNELS:
            return True
        if address.channel == "telegram":
            return bool(self._telegram)
        return False

    def route(self, origin: Address, sender_id: str, deliver_to: Address | None) -> Address | None:
        """DESIGN.md: origin chat if the requester approves there, else deliver_to, else
        ``[approvals] default_chat``; None when nobody can approve (fail closed)."""
        if self.is_approver(origin, sender_id):
            return origin
        for candidate in (deliver_to, self.default_chat):
            if candidate is not None and self.has_approvers(candidate):
                return candidate
        return None
