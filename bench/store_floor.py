"""The store's floor for a turn shape: the statements a run of the core issued, replayed
by a bare driver loop in the same transactions, in a fresh database of the same schema.

``turns.py --reference`` traces a run of the core (every statement on the connection the
daemon's transactions use, BEGIN and COMMIT included, so each group commit is replayed
as the group it was), then times a plain loop that executes exactly those statements
with their values — bare ``sqlite3`` for SQLite, bare psycopg on one connection for
PostgreSQL — and nothing else: no asyncio, no jobs, no models. Turns per second of that
loop are what the store itself allows this turn shape; echo-bot's turns/s over it is the
share the Python around the SQL leaves.

SQLite's trace hands over each statement with its values written in; they are taken
out again (``parameterize``), so the loop runs prepared statements from sqlite3's cache
as the store does, not a fresh parse of each.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A literal in SQLite's expanded SQL: a string ('' inside it is a quote), a blob, or a
# number that is not part of a name.
_LITERAL = re.compile(
    r"""'(?:[^']|'')*'|[Xx]'[0-9A-Fa-f]*'|(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w.])"""
)


def parameterize(sql: str) -> tuple[str, list[Any]]:
    """SQLite's expanded statement as SQL with ``?`` and its values."""
    values: list[Any] = []

    def take(match: re.Match[str]) -> str:
        text = match.group(0)
        if text.startswith("'"):
            values.append(text[1:-1].replace("''", "'"))
        elif text[0] in "xX":
            values.append(bytes.fromhex(text[2:-1]))
        elif any(c in text for c in ".eE"):
            values.append(float(text))
        else:
            values.append(int(text))
        return "?"

    return _LITERAL.sub(take, sql), values


# Statements whose words are part of their grammar, not values (``LIMIT ?`` is fine;
# a pragma's or savepoint's argument is not).
_AS_IS = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA")


def sent_by_the_store(expanded: str, previous: str) -> bool:
    """Whether a statement sqlite3's trace reports is one the store sent. Left out:
    what SQLite runs on its own — a trigger's statements (``-- TRIGGER …``), the
    full-text index's (FTS5 reads and writes its shadow tables as
    ``'main'.'messages_fts_…'``) — and the statement reported again as each of its
    triggers starts (sqlite3's callback gets the statement's text then too: an INSERT
    into ``messages`` shows up two or three times). A replay makes them run again."""
    if expanded.lstrip().startswith("--") or "'main'." in expanded:
        return False
    return expanded != previous


@dataclass
class Trace:
    """What a traced run issued: (sql, parameters, many) in order, and its turns."""

    statements: list[tuple[str, Any, bool]] = field(default_factory=list)
    turns: int = 0
    # The traced daemon's instance name (several daemons on a store: its takes of a
    # lease check that its own row is fresh; the row was written before the trace).
    instance: str | None = None
    _last: str = ""

    def sqlite(self, expanded: str) -> None:
        """sqlite3's trace callback: what the store sent (``sent_by_the_store``)."""
        if not sent_by_the_store(expanded, self._last):
            return
        self._last = expanded
        if expanded.lstrip().upper().startswith(_AS_IS):
            self.statements.append((expanded, (), False))
        else:
            sql, values = parameterize(expanded)
            self.statements.append((sql, values, False))

    def postgres(self, sql: str, parameters: Any, many: bool) -> None:
        """PgHandle's trace callback (``parameters=True``)."""
        self.statements.append((sql, parameters, many))

    def whole(self) -> list[tuple[str, Any, bool]]:
        """The statements from the first BEGIN to the last COMMIT: the trace is switched
        on and off inside a transaction (the job that does it runs in one). A BEGIN
        inside a transaction is left out: the trace shows a statement as it starts, and
        that one was a BEGIN the database refused (busy) and the store tried again."""
        kinds = [sql.lstrip()[:6].upper() for sql, _p, _m in self.statements]
        first = next((i for i, k in enumerate(kinds) if k.startswith("BEGIN")), 0)
        last = max((i for i, k in enumerate(kinds) if k == "COMMIT"), default=-1)
        kept, open_ = [], False
        span = slice(first, last + 1)
        for statement, kind in zip(self.statements[span], kinds[span], strict=True):
            if kind.startswith("BEGIN"):
                if open_:
                    continue
                open_ = True
            elif kind == "COMMIT" or statement[0].strip().upper() == "ROLLBACK":
                open_ = False  # (ROLLBACK TO a savepoint leaves the transaction open)
            kept.append(statement)
        return kept

    def commits(self) -> int:
        return sum(1 for sql, _p, _m in self.statements if sql.strip().upper() == "COMMIT")


@dataclass
class Floor:
    turns: int
    seconds: float
    statements: int
    transactions: int
    done: int = 0  # inbox rows done in the replayed store: the replay did the turns' work

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    @property
    def per_turn_ms(self) -> float:
        return self.seconds / self.turns * 1000 if self.turns else 0.0


def sqlite_floor(trace: Trace, path: Path, *, durability: str = "normal") -> Floor:
    """Replay ``trace`` with bare sqlite3 on the store file ``path`` (made by the real
    engine: the same schema and indexes), with the connection settings the store uses."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # as the store (a thread checkpoints)
        execute = conn.execute
        statements = trace.whole()
        began = time.perf_counter()
        for sql, values, _many in statements:
            try:
                execute(sql, values).fetchall()
            except sqlite3.Error as exc:
                raise RuntimeError(f"replay failed: {exc}: {sql[:300]!r} {values!r:.200}") from exc
        seconds = time.perf_counter() - began
        done = conn.execute(DONE).fetchone()[0]
    finally:
        conn.close()
    return Floor(trace.turns, seconds, len(statements), trace.commits(), done)


def postgres_floor(trace: Trace, url: str, *, pipelined: bool = False) -> Floor:
    """Replay ``trace`` with bare psycopg on one connection (as the store's one), one
    statement after another, in a database of the same schema at ``url``; each a round
    trip, or ``pipelined``: each transaction one (sent whole, a Sync after its COMMIT,
    no result read) — the fewest round trips the same statements can take."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.cursor()
        statements = [(_pg(sql), values, many) for sql, values, many in trace.whole()]
        if trace.instance is not None:  # the daemon alive, as its row said (not timed)
            cursor.execute(
                "INSERT INTO instances (name, label, host, boot_id, pid, version, started_at,"
                " seen_at) VALUES (%s, %s, '', '', 0, '', 0,"
                " extract(epoch from clock_timestamp()))",
                [trace.instance, trace.instance],
            )
        began = time.perf_counter()
        if pipelined:
            with conn.pipeline() as pipeline:
                for sql, values, many in statements:
                    if many:
                        cursor.executemany(sql, values)
                    else:
                        cursor.execute(sql, values or None)
                    if sql == "COMMIT":
                        pipeline.sync()
        else:
            for sql, values, many in statements:
                if many:
                    cursor.executemany(sql, values)
                else:
                    cursor.execute(sql, values or None)
                    if cursor.description is not None:
                        cursor.fetchall()
        seconds = time.perf_counter() - began
        done = cursor.execute(DONE).fetchone()[0]  # type: ignore[index]
    return Floor(trace.turns, seconds, len(statements), trace.commits(), done)


DONE = "SELECT COUNT(*) FROM inbox WHERE status = 'done'"


def _pg(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


def fresh_sqlite_store(path: Path) -> None:
    """An empty echo-bot store at ``path``, made by the engine itself."""
    from echo_bot.store.db import Database

    database = Database(path)
    database.open_sync()
    database.close_sync()


def fresh_postgres_store(url: str) -> None:
    from echo_bot.store.postgres import PostgresDatabase

    database = PostgresDatabase(url)
    database.open_sync()
    database.close_sync()


def ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}×" if floor else "–"
