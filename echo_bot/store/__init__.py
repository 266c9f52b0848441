"""Storage: implements the bus's inbox and outbox and keeps turns, approvals, reminders
and the audit log. The rest of the code comes in through ``Store.run(fn(tx))`` and the
repositories on ``tx``; nothing outside this package speaks SQL or imports the driver."""

from .committed import Committed, InboundCommitted, OutboundCommitted, ReminderChanged
from .db import DB_FILENAME, Database
from .inbox import InboxRow, SqliteInbox
from .outbox import OutboxRow, SqliteOutbox
from .tx import Store, Tx

__all__ = [
    "DB_FILENAME",
    "Committed",
    "Database",
    "InboundCommitted",
    "InboxRow",
    "OutboundCommitted",
    "OutboxRow",
    "ReminderChanged",
    "SqliteInbox",
    "SqliteOutbox",
    "Store",
    "Tx",
]
