"""The lifecycle states of what the store keeps, one enum per table (a leaf).

Each is a ``StrEnum``: the value is what the database stores and what ``status`` and
the audit show, so a member compares equal to the text read back."""

from __future__ import annotations

from enum import StrEnum


class TurnStatus(StrEnum):
    RUNNING = "running"  # the brain or a tool is at work, or it is queued to go on
    WAITING = "waiting"  # parked until an approval is decided or expires
    DONE = "done"
    FAILED = "failed"


class CallStatus(StrEnum):
    """A tool call of a step: committed as planned before any call of the step runs."""

    PLANNED = "planned"
    WAITING = "waiting"  # for its approval request
    APPROVED = "approved"  # may run (approved, or no approval needed)
    STARTED = "started"  # committed just before it ran: found so later, it may have run
    DONE = "done"  # its result is stored


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


class OutboxStatus(StrEnum):
    QUEUED = "queued"
    SENT = "sent"
    FAILED = "failed"


class ReminderStatus(StrEnum):
    ACTIVE = "active"
    DONE = "done"  # a one-off that fired
    MISSED = "missed"  # a one-off found later than its grace
    CANCELLED = "cancelled"
