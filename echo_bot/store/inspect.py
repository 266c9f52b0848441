"""A read-only look at a store file, for `echo-bot doctor`: it may run beside a daemon
(or as another user), so it opens its own read-only connection, never migrates and never
writes. Findings come back as plain data; what to make of them is the caller's."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlite_utils import Database as SqlDb

from .meta import queued_by_channel

TIMEOUT = 5.0  # seconds to wait for a writer's lock


@dataclass(frozen=True, slots=True)
class FileCheck:
    """``error``: why the file could not be read; else ``verdict``, SQLite's quick_check
    ("ok", or the first problem it found)."""

    error: str | None = None
    verdict: str = ""
    schema: int | None = None  # its schema version (None: none written)

    @property
    def ok(self) -> bool:
        return self.error is None and self.verdict == "ok"


@dataclass(frozen=True, slots=True)
class QueuedOutbound:
    """``error``: why the outbox could not be read; else the queued messages per channel."""

    error: str | None = None
    by_channel: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def read_only(path: Path, timeout: float = TIMEOUT) -> Iterator[sqlite3.Connection]:
    """A read-only connection. Reading a WAL store makes its ``-wal`` and ``-shm`` files
    when no daemon has them open: made by doctor run with sudo they were root's, and the
    service's user could no longer open its store. Those this look made are given to the
    state dir's owner."""
    siblings = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    before = {sibling for sibling in siblings if sibling.exists()}
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout)
        ) as conn:
            yield conn
    finally:
        owner = path.parent.stat()
        for made in (s for s in siblings if s not in before and s.exists()):
            if made.stat().st_uid != owner.st_uid and os.geteuid() == 0:
                with contextlib.suppress(OSError):
                    os.chown(made, owner.st_uid, owner.st_gid)


def check_file(path: Path) -> FileCheck:
    """SQLite's quick_check of the store at ``path`` (which must exist), and its schema
    version."""
    try:
        with read_only(path) as conn:
            verdict = str(conn.execute("PRAGMA quick_check").fetchone()[0])
            has_meta = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
            row = (
                has_meta
                and conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            )
            return FileCheck(verdict=verdict, schema=int(row[0]) if row else None)
    except (sqlite3.Error, ValueError) as exc:
        return FileCheck(error=str(exc))


def queued_outbound(path: Path) -> QueuedOutbound:
    """The outbound messages waiting for delivery in the store at ``path``, per channel."""
    try:
        with read_only(path) as conn:
            return QueuedOutbound(by_channel=queued_by_channel(SqlDb(conn)))
    except sqlite3.Error as exc:
        return QueuedOutbound(error=str(exc))


@dataclass(frozen=True, slots=True)
class DatabaseCheck:
    """A read-only look at a PostgreSQL store: ``error`` when it cannot be read; else its
    schema version (None: no schema yet), this echo-bot's, the daemons seen within the
    last 15 s, and the outbound waiting per channel."""

    error: str | None = None
    schema: int | None = None
    expected: int = 0
    live: int = 0
    queued: QueuedOutbound = field(default_factory=QueuedOutbound)


def check_database(url: str) -> DatabaseCheck:
    """Connect (read only, no migration), read the facts; never quotes the password."""
    import psycopg

    from .schema import MIGRATIONS
    from .sql import describe_url

    expected = len(MIGRATIONS)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=int(TIMEOUT)) as conn:
            conn.execute("SET default_transaction_read_only = on")
            exists = conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone()
            if not exists or not exists[0]:
                return DatabaseCheck(expected=expected)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            schema = int(row[0]) if row else None
            live = 0
            if _first(conn.execute("SELECT to_regclass('instances') IS NOT NULL").fetchone()):
                live = int(
                    _first(
                        conn.execute(
                            "SELECT COUNT(*) FROM instances"
                            " WHERE seen_at >= extract(epoch from clock_timestamp()) - 15"
                        ).fetchone()
                    )
                    or 0
                )
            queued: dict[str, int] = dict(
                conn.execute(
                    "SELECT channel, COUNT(*) FROM outbox WHERE status = 'queued' GROUP BY channel"
                ).fetchall()
            )
    except psycopg.ProgrammingError:
        return DatabaseCheck(error="the database URL cannot be read", expected=expected)
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return DatabaseCheck(error=f"cannot reach {describe_url(url)}: {reason}", expected=expected)
    return DatabaseCheck(
        schema=schema,
        expected=expected,
        live=int(live),
        queued=QueuedOutbound(by_channel={str(k): int(v) for k, v in queued.items()}),
    )


def _first(row: tuple[Any, ...] | None) -> Any:
    """The first column of a row read with fetchone (None: no row)."""
    return row[0] if row else None
