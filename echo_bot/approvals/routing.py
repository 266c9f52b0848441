"""Where an approval prompt goes, and who may decide."""

from __future__ import annotations

from sqlite_utils import Database as SqlDb

from ..config import Config
from ..events import Address
from ..store.access import is_paired, paired_users

# The terminal is the owner's: whoever types in ``echo-bot chat`` may approve there.
LOCAL_CHANNELS = frozenset({"cli"})


class ApproverDirectory:
    """Approvers per channel: the configured list, or (by default) the allowed users,
    including those added by pairing. Lookups run inside the caller's transaction."""

    def __init__(self, config: Config) -> None:
        telegram = config.telegram
        self._explicit = {"telegram": {str(i) for i in telegram.approvers or []}}
        self._uses_allowed = {"telegram": telegram.approvers is None}
        self._allowed = {"telegram": {str(i) for i in telegram.allowed_users}}
        default = config.approvals.default_chat
        self.default_chat = Address.parse(default) if default else None

    def is_approver(self, db: SqlDb, address: Address, sender_id: str) -> bool:
        channel = address.channel
        if channel in LOCAL_CHANNELS:
            return True
        if channel not in self._explicit:
            return False
        if sender_id in self._explicit[channel]:
            return True
        if not self._uses_allowed[channel]:
            return False
        return sender_id in self._allowed[channel] or is_paired(db, channel, sender_id)

    def has_approvers(self, db: SqlDb, address: Address) -> bool:
        channel = address.channel
        if channel in LOCAL_CHANNELS:
            return True
        if channel not in self._explicit:
            return False
        if self._explicit[channel]:
            return True
        return self._uses_allowed[channel] and bool(
            self._allowed[channel] or paired_users(db, channel)
        )

    def route(
        self, db: SqlDb, origin: Address, sender_id: str, deliver_to: Address | None
    ) -> Address | None:
        """DESIGN.md: origin chat if the requester approves there, else deliver_to, else
        ``[approvals] default_chat``; None when nobody can approve (fail closed)."""
        if self.is_approver(db, origin, sender_id):
            return origin
        for candidate in (deliver_to, self.default_chat):
            if candidate is not None and self.has_approvers(db, candidate):
                return candidate
        return None
