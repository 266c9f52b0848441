"""``echo-bot store copy --to postgres``: a stopped SQLite store, whole, into an empty
PostgreSQL database — the way from one machine to several.

Everything is copied as it is stored (pending approvals, reminders and their fire
markers, history, suspended turns, the outbox and its receipts, the audit log, paired
users), row for row with the same keys and sequence numbers, in one PostgreSQL
transaction: it commits only after every table's count matches, so a copy that fails
leaves the target as empty as it was. The target's identity sequences then continue
after the copied rows.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StoreError
from .db import Database, is_empty_file
from .postgres import PostgresDatabase

# Tables whose seq is an identity column on PostgreSQL (SQLite's AUTOINCREMENT).
_SEQUENCED = ("inbox", "outbox", "messages", "audit")


@dataclass(frozen=True, slots=True)
class CopiedTable:
    name: str
    source: int
    target: int


def copy_sqlite_to_postgres(source: Path, url: str) -> list[CopiedTable]:
    """Copy the SQLite store at ``source`` into the empty database at ``url``; each
    table's rows in the source and, after the copy, in the target."""
    if not source.exists():
        raise StoreError(f"no store at {source} (nothing to copy)")
    if is_empty_file(source):  # opened, it would be made a new, empty store and copied
        raise StoreError(f"{source} is empty (0 bytes): nothing to copy")
    # Both brought to this echo-bot's schema first (the same tables and columns).
    sqlite_db = Database(source)
    sqlite_db.open_sync()
    sqlite_db.close_sync()
    target = PostgresDatabase(url)
    target.open_sync()
    target.close_sync()

    import psycopg

    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        tables = _tables(src)
        with psycopg.connect(url) as dst:  # one transaction: committed at the end
            not_empty = [t for t in tables if t != "meta" and _count(dst, t) > 0]
            if not_empty:
                raise StoreError(
                    f"the database {target.where} is not empty ({', '.join(not_empty)} hold"
                    " rows): store copy fills a new, empty database only"
                )
            copied = [_copy_table(src, dst, table) for table in tables]
            wrong = [c for c in copied if c.source != c.target]
            if wrong:
                raise StoreError(
                    "the copy does not match its source ("
                    + ", ".join(f"{c.name}: {c.source} → {c.target}" for c in wrong)
                    + "); nothing was committed"
                )
            # Past every seq SQLite ever handed out (pruned rows' too), as it would go on.
            used = dict(src.execute("SELECT name, seq FROM sqlite_sequence").fetchall())
            for table in _SEQUENCED:
                dst.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'),"
                    f" GREATEST(COALESCE((SELECT MAX(seq) FROM {table}), 0), %s) + 1, false)",
                    [int(used.get(table) or 0)],
                )
    except psycopg.Error as exc:
        raise StoreError(
            f"the copy to {target.where} failed: {' '.join(str(exc).split())}"
        ) from None
    finally:
        src.close()
    return copied


def _tables(src: sqlite3.Connection) -> list[str]:
    """The tables to copy: not SQLite's own, nor a full-text index (a virtual table and
    its shadow tables: PostgreSQL indexes the same words itself)."""
    rows = src.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " ORDER BY name"
    ).fetchall()
    virtual = [str(name) for name, sql in rows if str(sql or "").startswith("CREATE VIRTUAL")]
    return [
        str(name) for name, _sql in rows
        if not any(name == v or str(name).startswith(f"{v}_") for v in virtual)
    ]  # fmt: skip


def _count(dst: Any, table: str) -> int:
    return int(dst.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _copy_table(src: sqlite3.Connection, dst: Any, table: str) -> CopiedTable:
    columns = [str(row[1]) for row in src.execute(f"PRAGMA table_info({table})")]
    names = ", ".join(columns)
    source = int(src.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    if table == "meta":  # the target's own schema_version stays; the rest is copied
        rows = src.execute("SELECT key, value FROM meta WHERE key <> 'schema_version'")
        for key, value in rows:
            dst.execute(
                "INSERT INTO meta (key, value) VALUES (%s, %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [key, value],
            )
        return CopiedTable(table, source, _count(dst, table))
    with dst.cursor().copy(f"COPY {table} ({names}) FROM STDIN") as copy:
        for row in src.execute(f"SELECT {names} FROM {table} ORDER BY rowid"):
            copy.write_row(row)
    return CopiedTable(table, source, _count(dst, table))
