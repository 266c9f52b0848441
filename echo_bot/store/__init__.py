"""Storage: implements the bus's inbox and outbox and keeps turns, approvals, reminders
and the audit log. The rest of the code comes in through ``Store.run(fn(tx))`` and the
repositories on ``tx``; nothing outside this package speaks SQL or imports the driver
(``tests/test_store_boundary.py``). What it may import from here: this package's names
below, and row types and constants of its modules."""

from .committed import (
    ChatTimezoneChanged,
    Committed,
    InboundCommitted,
    OutboundCommitted,
    ReminderChanged,
)
from .db import DB_FILENAME, Database, backup_to
from .inbox import InboxRow, SqliteInbox
from .inspect import FileCheck, QueuedOutbound, check_file, queued_outbound
from .outbox import OutboxRow, SqliteOutbox
from .tx import Store, Tx

__all__ = [
    "DB_FILENAME",
    "ChatTimezoneChanged",
    "Committed",
    "Database",
    "FileCheck",
    "InboundCommitted",
    "InboxRow",
    "OutboundCommitted",
    "OutboxRow",
    "QueuedOutbound",
    "ReminderChanged",
    "SqliteInbox",
    "SqliteOutbox",
    "Store",
    "Tx",
    "backup_to",
    "check_file",
    "queued_outbound",
]
