"""What the store's SQL modules need of a connection, whichever engine holds it.

The SQL is written once, in the subset SQLite and PostgreSQL share (``?`` placeholders,
``INSERT … ON CONFLICT``, ``RETURNING``, aliased subqueries), and handed to a
``SqlDb``: SQLite's is sqlite-utils' ``Database``; PostgreSQL's is ``PgHandle``
(``store/postgres.py``), which turns ``?`` into the driver's placeholder. The few
expressions the two spell differently (reading a JSON field, the day of a timestamp)
come from the functions below, chosen by the handle's ``dialect``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

SQLITE = "sqlite"
POSTGRES = "postgres"


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...


class SqlDb(Protocol):
    """A connection inside a transaction: ``execute`` and the raw ``conn``."""

    @property
    def conn(self) -> Connection: ...

    def execute(self, sql: str, parameters: Sequence[Any] = ...) -> Cursor: ...


# The SQLSTATE of a failed ``echo_bot_expect`` (PostgreSQL; schema.py's _v17).
EXPECT_STATE = "EB001"


def dialect(db: object) -> str:
    return getattr(db, "dialect", SQLITE)


def expect_row(db: SqlDb, sql: str, parameters: Sequence[Any], error: Exception) -> None:
    """Raise ``error`` unless the SELECT ``sql`` finds a row. On PostgreSQL the server
    checks it (``echo_bot_expect``) and nothing waits for the answer: ``error`` is raised
    at the unit of work's next wait — a read, or its COMMIT, which then commits nothing
    (``PgHandle.expect``). Either way nothing of the unit of work is stored."""
    expect = getattr(db, "expect", None)
    if expect is not None:
        expect(f"SELECT echo_bot_expect(EXISTS ({sql}), ?)", parameters, error)
    elif db.execute(sql, parameters).fetchone() is None:
        raise error


def expect_change(db: SqlDb, sql: str, parameters: Sequence[Any], error: Exception) -> None:
    """Raise ``error`` unless ``sql`` (an INSERT or UPDATE, no RETURNING) changes one row;
    as ``expect_row`` (on PostgreSQL it runs in a WITH, ``RETURNING 1``)."""
    expect = getattr(db, "expect", None)
    if expect is not None:
        expect(
            f"WITH changed AS ({sql} RETURNING 1)"
            " SELECT echo_bot_expect(COUNT(*) = 1, ?) FROM changed",
            parameters,
            error,
        )
    elif db.execute(sql, parameters).rowcount != 1:
        raise error


def read_later(db: SqlDb, cursor: Cursor, read: Callable[[Cursor], None]) -> None:
    """``read(cursor)`` with ``cursor``'s result: now, or on PostgreSQL once the unit of
    work is committed (``PgHandle.read_later``), so that the read sends nothing and
    waits for nothing of its own. For results only what follows the commit needs (a
    row's seq for a cache, say): never called if the work is rolled back; the
    transaction's ``Tx.on_commit`` callbacks run after it."""
    later = getattr(db, "read_later", None)
    if later is not None:
        later(cursor, read)
    else:
        read(cursor)


def json_text(db: object, column: str, *path: str) -> str:
    """SQL for the text (or number) at ``path`` inside the JSON held in ``column``."""
    if dialect(db) == POSTGRES:
        return f"({column}::jsonb #>> '{{{','.join(path)}}}')"
    return f"json_extract({column}, '$.{'.'.join(path)}')"


def json_number(db: object, column: str, *path: str) -> str:
    """SQL for the number at ``path`` inside the JSON held in ``column``."""
    if dialect(db) == POSTGRES:  # NULL unless it is a number (as SQLite sums it as 0)
        value = f"({column}::jsonb #> '{{{','.join(path)}}}')"
        return (
            f"(CASE WHEN jsonb_typeof({value}) = 'number'"
            f" THEN ({value} #>> '{{}}')::double precision END)"
        )
    return json_text(db, column, *path)


def db_clock(db: object) -> str:
    """SQL for the database's own clock, Unix seconds: the one clock every daemon sharing
    the store reads (theirs may be seconds apart; a lease must not be)."""
    if dialect(db) == POSTGRES:
        return "extract(epoch from clock_timestamp())::double precision"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def utc_day(db: object, column: str) -> str:
    """SQL for the UTC day (YYYY-MM-DD) of the Unix time in ``column``."""
    if dialect(db) == POSTGRES:
        return f"to_char(to_timestamp({column}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
    return f"date({column}, 'unixepoch')"


def describe_url(url: str) -> str:
    """``host:port/database`` of a PostgreSQL URL, for messages: never its password."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "the configured database"
    database = parts.path.lstrip("/") or "(default database)"
    return f"{host}{port}/{database}"
