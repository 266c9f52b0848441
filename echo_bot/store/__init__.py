"""SQLite storage: implements the bus's inbox and outbox and keeps turns, approvals
and the audit log. Nothing outside this package depends on SQLite specifics beyond the
``Database.run`` unit of work."""

from .db import DB_FILENAME, Database
from .inbox import InboxRow, SqliteInbox
from .outbox import OutboxRow, SqliteOutbox

__all__ = ["DB_FILENAME", "Database", "InboxRow", "OutboxRow", "SqliteInbox", "SqliteOutbox"]
