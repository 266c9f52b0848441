"""A read-only look at a store file, for `echo-bot doctor`: it may run beside a daemon
(or as another user), so it opens its own read-only connection, never migrates and never
writes. Findings come back as plain data; what to make of them is the caller's."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from sqlite_utils import Database as SqlDb

from .meta import queued_by_channel

TIMEOUT = 5.0  # seconds to wait for a writer's lock


@dataclass(frozen=True, slots=True)
class FileCheck:
    """``error``: why the file could not be read; else ``verdict``, SQLite's quick_check
    ("ok", or the first problem it found)."""

    error: str | None = None
    verdict: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.verdict == "ok"


@dataclass(frozen=True, slots=True)
class QueuedOutbound:
    """``error``: why the outbox could not be read; else the queued messages per channel."""

    error: str | None = None
    by_channel: dict[str, int] = field(default_factory=dict)


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=TIMEOUT)


def check_file(path: Path) -> FileCheck:
    """SQLite's quick_check of the store at ``path`` (which must exist)."""
    try:
        with contextlib.closing(_connect(path)) as conn:
            return FileCheck(verdict=str(conn.execute("PRAGMA quick_check").fetchone()[0]))
    except sqlite3.Error as exc:
        return FileCheck(error=str(exc))


def queued_outbound(path: Path) -> QueuedOutbound:
    """The outbound messages waiting for delivery in the store at ``path``, per channel."""
    try:
        with contextlib.closing(_connect(path)) as conn:
            return QueuedOutbound(by_channel=queued_by_channel(SqlDb(conn)))
    except sqlite3.Error as exc:
        return QueuedOutbound(error=str(exc))
