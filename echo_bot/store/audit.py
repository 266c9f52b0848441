"""The audit log: every brain decision, tool execution and approval, masked."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ..secrets import Masker
from .sql import POSTGRES, SqlDb, dialect, json_number, json_text, utc_day


@dataclass(frozen=True, slots=True)
class AuditRow:
    seq: int
    ts: float
    trace_id: str | None
    session_key: str | None
    kind: str
    data: dict[str, Any]


# (ts, trace_id, session_key, kind, data as JSON)
AuditValues = tuple[float, str | None, str | None, str, str]
# Rows per INSERT: 5 values each, under SQLite's oldest limit of 999 variables.
_ROWS_PER_INSERT = 100


class AuditWriter:
    """Makes audit rows for the caller's transaction, masking secrets first."""

    def __init__(self, masker: Masker) -> None:
        self.masker = masker

    def row(
        self,
        event: str,
        *,
        trace_id: str | None,
        session_key: str | None,
        **data: Any,
    ) -> AuditValues:
        """The row to insert, masked and serialised now (its time is now, too)."""
        masked = self.masker.mask_data(data)
        details = data.get("details")
        if isinstance(details, dict):
            # Numbers in the brain's details (prompt_tokens, completion_tokens) are counts,
            # not secrets, though their key names match the secret-key pattern ("token").
            masked["details"] = {
                k: v if isinstance(v, int | float) and not isinstance(v, bool) else masked_v
                for (k, v), masked_v in zip(
                    details.items(), masked["details"].values(), strict=True
                )
            }
        return (time.time(), trace_id, session_key, event, json.dumps(masked, default=str))

    def write(
        self,
        db: SqlDb,
        event: str,
        *,
        trace_id: str | None,
        session_key: str | None,
        **data: Any,
    ) -> None:
        write_rows(db, [self.row(event, trace_id=trace_id, session_key=session_key, **data)])


# Shared by ``AuditWriter.write`` and ``AuditRepo.flush``: the one INSERT of audit rows.
def write_rows(db: SqlDb, rows: list[AuditValues]) -> None:
    """Insert ``rows`` in order (their seq follows it), one statement per 100 rows."""
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        values = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
        db.conn.execute(
            f"INSERT INTO audit (ts, trace_id, session_key, kind, data) VALUES {values}",
            [value for row in chunk for value in row],
        )


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which audit rows a page shows (every field optional; all given must hold)."""

    chat: str | None = None  # session_key, exactly
    tool: str | None = None  # the row's ``tool``, or the name of one of its ``tool_calls``
    trace_id: str | None = None
    since: float | None = None  # ts >= since
    until: float | None = None  # ts < until
    before: int | None = None  # seq < before (the page after one that ended there)
    after: int | None = None  # seq > after (the page before one that began there)
    # Only the rows of these chats: a session key equal to one of ``exact`` or beginning
    # with one of ``prefixes`` (an approver's share of the log). None: every row.
    exact: tuple[str, ...] | None = None
    prefixes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UsageRow:
    day: str
    session_key: str
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    avg_latency_ms: float


class AuditRepo:
    """The audit log: every row masked when it is written. The rows of one unit of work
    are inserted together when it is done (``Tx.flush``: one statement, still in its
    transaction), in the order they were written; a read writes them first."""

    __slots__ = ("_db", "_rows", "_writer")

    def __init__(self, db: SqlDb, masker: Masker) -> None:
        self._db = db
        self._writer = AuditWriter(masker)
        self._rows: list[AuditValues] = []

    def write(
        self, event: str, *, trace_id: str | None, session_key: str | None, **data: Any
    ) -> None:
        self._rows.append(
            self._writer.row(event, trace_id=trace_id, session_key=session_key, **data)
        )

    def flush(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            write_rows(self._db, rows)

    def read(self, *, tail: int = 50, trace_id: str | None = None) -> list[AuditRow]:
        self.flush()
        if trace_id:
            rows = self._db.execute(
                "SELECT seq, ts, trace_id, session_key, kind, data FROM audit WHERE trace_id = ?"
                " ORDER BY seq",
                [trace_id],
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM (SELECT seq, ts, trace_id, session_key, kind, data FROM audit"
                " ORDER BY seq DESC LIMIT ?) AS newest ORDER BY seq",
                [tail],
            ).fetchall()
        return [AuditRow(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def page(
        self, wanted: AuditFilter, limit: int, *, oldest_first: bool = False
    ) -> list[AuditRow]:
        """Up to ``limit`` rows that ``wanted`` lets through, newest first by seq (or
        oldest first: the rows just after ``wanted.after``)."""
        self.flush()
        where, args = _where(self._db, wanted)
        order = "ASC" if oldest_first else "DESC"
        rows = self._db.execute(
            "SELECT seq, ts, trace_id, session_key, kind, data FROM audit"
            f" WHERE {' AND '.join(where) or '1 = 1'} ORDER BY seq {order} LIMIT ?",
            [*args, limit],
        ).fetchall()
        return [AuditRow(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]

    def tokens_since(self, ts: float) -> int:
        """LLM tokens (prompt + completion) recorded since ``ts``."""
        self.flush()
        prompt = json_number(self._db, "data", "details", "prompt_tokens")
        completion = json_number(self._db, "data", "details", "completion_tokens")
        row = self._db.execute(
            f"SELECT COALESCE(SUM(COALESCE({prompt}, 0) + COALESCE({completion}, 0)), 0)"
            " FROM audit WHERE kind = 'brain.decision' AND ts >= ?",
            [ts],
        ).fetchone()
        return int(row[0])

    def usage_by_day(self) -> list[UsageRow]:
        self.flush()
        model = json_text(self._db, "data", "details", "model")
        rows = self._db.execute(
            f"SELECT {utc_day(self._db, 'ts')} AS day, COALESCE(session_key, '-') AS session,"
            f" {model} AS model, COUNT(*),"
            f" COALESCE(SUM({json_number(self._db, 'data', 'details', 'prompt_tokens')}), 0),"
            f" COALESCE(SUM({json_number(self._db, 'data', 'details', 'completion_tokens')}), 0),"
            f" COALESCE(AVG({json_number(self._db, 'data', 'details', 'latency_ms')}), 0)"
            " FROM audit WHERE kind = 'brain.decision'"
            f" AND {model} IS NOT NULL"
            " GROUP BY 1, 2, 3 ORDER BY 1, 2"
        ).fetchall()
        return [
            UsageRow(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5]), float(r[6])) for r in rows
        ]


def _where(db: SqlDb, wanted: AuditFilter) -> tuple[list[str], list[Any]]:
    """The conditions of ``AuditRepo.page`` and their arguments (values only as ``?``)."""
    where: list[str] = []
    args: list[Any] = []
    if wanted.exact is not None:
        mine = ["session_key = ?"] * len(wanted.exact)
        args += wanted.exact
        for prefix in wanted.prefixes:
            mine.append("substr(session_key, 1, ?) = ?")
            args += [len(prefix), prefix]
        where.append(f"({' OR '.join(mine) or '1 = 0'})")
    if wanted.chat is not None:
        where.append("session_key = ?")
        args.append(wanted.chat)
    if wanted.trace_id is not None:
        where.append("trace_id = ?")
        args.append(wanted.trace_id)
    if wanted.before is not None:
        where.append("seq < ?")
        args.append(wanted.before)
    if wanted.after is not None:
        where.append("seq > ?")
        args.append(wanted.after)
    if wanted.since is not None:
        where.append("ts >= ?")
        args.append(wanted.since)
    if wanted.until is not None:
        where.append("ts < ?")
        args.append(wanted.until)
    if wanted.tool is not None:
        where.append(f"({json_text(db, 'data', 'tool')} = ? OR {_calls_name(db)})")
        args += [wanted.tool, wanted.tool]
    return where, args


def _calls_name(db: SqlDb) -> str:
    """SQL true when one of the row's ``tool_calls`` is named by the next argument."""
    if dialect(db) == POSTGRES:
        wanted = "jsonb_build_array(jsonb_build_object('name', ?::text))"
        return f"(data::jsonb -> 'tool_calls') @> {wanted}"
    return (
        "EXISTS (SELECT 1 FROM json_each(audit.data, '$.tool_calls') AS c"
        " WHERE json_extract(c.value, '$.name') = ?)"
    )
