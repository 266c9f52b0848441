"""Storage: implements the bus's inbox and outbox (``BusQueues``) and keeps turns,
approvals, reminders and the audit log. The rest of the code comes in through
``Store.run(fn(tx))`` and the repositories on ``tx``; nothing outside this package speaks
SQL or imports the driver (``tests/store/test_store_boundary.py``). What it may import
from here: this package's names below, and row types and constants of its modules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .committed import (
    ApprovalDecided,
    ApprovalRequested,
    ChatTimezoneChanged,
    Committed,
    HistoryReset,
    InboundCommitted,
    OutboundCommitted,
    ReminderChanged,
)
from .db import DB_FILENAME, Database, backup_to, is_empty_file
from .engine import ThreadedEngine as Engine
from .inbox import InboxRow
from .inspect import (
    DatabaseCheck,
    FileCheck,
    QueuedOutbound,
    check_database,
    check_file,
    queued_outbound,
)
from .memory import NOTE_CHARS, NOTES_MAX, MemoryFull, Note
from .outbox import OutboxRow
from .queues import BusQueues
from .retry import once_the_store_is_back
from .sql import describe_url
from .tx import Store, Tx

if TYPE_CHECKING:
    from .copy import CopiedTable


def make_database(
    engine: str, *, state_dir: Path, durability: str = "normal", url: str | None = None
) -> Engine:
    """The engine ``[storage] engine`` names: SQLite's file in ``state_dir``, or the
    PostgreSQL database at ``url`` (its driver imported only then)."""
    if engine == "postgres":
        try:
            from .postgres import PostgresDatabase
        except ImportError as exc:
            raise ConfigError(
                'storage.engine = "postgres" needs the PostgreSQL driver:'
                f" pip install 'echo-bot[postgres]' (from a checkout: pip install"
                f" '.[postgres]') ({exc})"
            ) from None
        if not url or not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                'storage.engine = "postgres": storage.url_env must name a variable that'
                " holds a postgresql://user:password@host:5432/database URL"
            )
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(url)
        except ProgrammingError:  # its words may quote the URL, password and all
            raise ConfigError(
                "storage.url_env: the database URL cannot be read; expected"
                " postgresql://user:password@host:5432/database (percent-encode any"
                " special characters in the password)"
            ) from None
        return PostgresDatabase(url, durability=durability)
    return Database(state_dir / DB_FILENAME, durability=durability)


def copy_sqlite_to_postgres(source: Path, url: str) -> list[CopiedTable]:
    """``echo-bot store copy --to postgres`` (``store/copy.py``; the driver only now)."""
    from .copy import copy_sqlite_to_postgres as copy

    return copy(source, url)


__all__ = [
    "DB_FILENAME",
    "NOTES_MAX",
    "NOTE_CHARS",
    "ApprovalDecided",
    "ApprovalRequested",
    "BusQueues",
    "ChatTimezoneChanged",
    "Committed",
    "Database",
    "DatabaseCheck",
    "Engine",
    "FileCheck",
    "HistoryReset",
    "InboundCommitted",
    "InboxRow",
    "MemoryFull",
    "Note",
    "OutboundCommitted",
    "OutboxRow",
    "QueuedOutbound",
    "ReminderChanged",
    "Store",
    "Tx",
    "backup_to",
    "check_database",
    "check_file",
    "copy_sqlite_to_postgres",
    "describe_url",
    "is_empty_file",
    "make_database",
    "once_the_store_is_back",
    "queued_outbound",
]
