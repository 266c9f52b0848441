"""What a transaction announces once it is committed.

A repository that writes work someone waits for (an inbound to run — approval decisions
included —, an outbound to send, a reminder created or cancelled, a request to expire)
records one of these (or a setting others keep in memory) on its transaction; the store
hands them to whoever subscribed, after the COMMIT and never for work that was rolled back. It
replaces callbacks wired part to part: the writer does not need to know who acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..events import InboundMessage

if TYPE_CHECKING:
    from .outbox import OutboxRow


@dataclass(frozen=True, slots=True)
class InboundCommitted:
    """New inbound (not duplicates), in commit order: the dispatcher runs them."""

    messages: tuple[InboundMessage, ...]


@dataclass(frozen=True, slots=True)
class OutboundCommitted:
    """Outbound queued for these chats: the delivery worker sends them. ``head``: the
    message, when nothing else was queued for its chat (due now, nothing ahead of it):
    the worker can send it without reading it back."""

    chat_keys: frozenset[str]
    head: OutboxRow | None = None


@dataclass(frozen=True, slots=True)
class ReminderChanged:
    """A reminder was created or cancelled: the scheduler re-reads it and sets or clears
    its timer (firing and moving one is the scheduler's own doing)."""

    reminder_id: str


@dataclass(frozen=True, slots=True)
class ChatTimezoneChanged:
    """A chat chose its time zone: whoever keeps chats' zones in memory updates it."""

    session_key: str
    timezone: str


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """A new approval request, due to expire at ``expires_at``: the expiry timer re-arms."""

    approval_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class ApprovalDecided:
    """A request left pending (decided or expired): whoever shows the queue updates it."""

    approval_id: str


@dataclass(frozen=True, slots=True)
class HistoryReset:
    """A session's history starts anew (``/new``): whoever keeps it in memory drops it."""

    session_key: str


Committed = (
    InboundCommitted
    | OutboundCommitted
    | ReminderChanged
    | ChatTimezoneChanged
    | ApprovalRequested
    | ApprovalDecided
    | HistoryReset
)
