"""Durable approval requests and time-boxed grants. Decisions are compare-and-set."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ..statuses import ApprovalStatus
from .sql import SqlDb


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    id: str
    turn_id: str
    session_key: str
    trace_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    risk: str
    requested_by: dict[str, Any]
    origin: str
    prompt_to: str
    prompt_outbound_id: str | None
    status: ApprovalStatus
    verb: str | None
    decided_by: dict[str, Any] | None
    decided_at: float | None
    created_at: float
    expires_at: float
    # What "allow for a time" on this request would grant beside the tool (the call's
    # deciding arguments); None when the verb is not offered for it.
    grant_scope: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ApprovalStatus(self.status))

    def expired_at(self, now: float) -> bool:
        return now >= self.expires_at


_COLUMNS = (
    "id, turn_id, session_key, trace_id, tool, args, args_hash, risk, requested_by, origin,"
    " prompt_to, prompt_outbound_id, status, verb, decided_by, decided_at, created_at, expires_at,"
    " grant_scope"
)


def _row(raw: tuple[Any, ...]) -> ApprovalRow:
    values = list(raw)
    values[5] = json.loads(values[5])
    values[8] = json.loads(values[8])
    values[14] = json.loads(values[14]) if values[14] else None
    return ApprovalRow(*values)


def insert_approval(
    db: SqlDb,
    *,
    approval_id: str,
    turn_id: str,
    session_key: str,
    trace_id: str,
    tool: str,
    args: dict[str, Any],
    args_hash: str,
    risk: str,
    requested_by: dict[str, Any],
    origin: str,
    prompt_to: str,
    prompt_outbound_id: str | None,
    expires_at: float,
    grant_scope: str | None,
) -> None:
    db.execute(
        f"INSERT INTO approvals ({_COLUMNS}) VALUES"
        " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, ?, ?, ?)",
        [
            approval_id,
            turn_id,
            session_key,
            trace_id,
            tool,
            json.dumps(args),  # in the order given: the order they are shown in
            args_hash,
            risk,
            json.dumps(requested_by),
            origin,
            prompt_to,
            prompt_outbound_id,
            time.time(),
            expires_at,
            grant_scope,
        ],
    )


def get_approval(db: SqlDb, approval_id: str) -> ApprovalRow | None:
    raw = db.execute(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", [approval_id]).fetchone()
    return _row(tuple(raw)) if raw else None


def list_approvals(
    db: SqlDb, status: ApprovalStatus | None = ApprovalStatus.PENDING, limit: int = 100
) -> list[ApprovalRow]:
    if status is None:
        rows = db.execute(
            f"SELECT {_COLUMNS} FROM approvals ORDER BY created_at DESC LIMIT ?", [limit]
        ).fetchall()
    else:
        rows = db.execute(
            f"SELECT {_COLUMNS} FROM approvals WHERE status = ? ORDER BY created_at LIMIT ?",
            [status, limit],
        ).fetchall()
    return [_row(tuple(r)) for r in rows]


def pending_for(db: SqlDb, prompt_to: str) -> list[ApprovalRow]:
    """Every pending request whose prompt goes to ``prompt_to``, oldest first."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM approvals WHERE status = 'pending' AND prompt_to = ?"
        " ORDER BY created_at",
        [prompt_to],
    ).fetchall()
    return [_row(tuple(r)) for r in rows]


def decide(
    db: SqlDb,
    approval_id: str,
    status: ApprovalStatus,
    *,
    verb: str | None,
    decided_by: dict[str, Any] | None,
) -> bool:
    """Compare-and-set from pending; False when someone (or expiry) got there first."""
    cursor = db.execute(
        "UPDATE approvals SET status = ?, verb = ?, decided_by = ?, decided_at = ?"
        " WHERE id = ? AND status = 'pending'",
        [status, verb, json.dumps(decided_by) if decided_by else None, time.time(), approval_id],
    )
    return cursor.rowcount == 1


def due_for_expiry(db: SqlDb, now: float) -> list[str]:
    rows = db.execute(
        "SELECT id FROM approvals WHERE status = 'pending' AND expires_at <= ?", [now]
    ).fetchall()
    return [r[0] for r in rows]


def next_expiry(db: SqlDb) -> float | None:
    found = db.execute("SELECT MIN(expires_at) FROM approvals WHERE status = 'pending'").fetchone()[
        0
    ]
    return None if found is None else float(found)


def add_grant(
    db: SqlDb, session_key: str, tool: str, scope: str, until: float, approval_id: str
) -> None:
    db.execute(
        "INSERT INTO grants (session_key, tool, scope, until, approval_id)"
        " VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT(session_key, tool, scope) DO UPDATE SET until = excluded.until,"
        " approval_id = excluded.approval_id",
        [session_key, tool, scope, until, approval_id],
    )


def has_grant(db: SqlDb, session_key: str, tool: str, scope: str, now: float) -> bool:
    row = db.execute(
        "SELECT 1 FROM grants WHERE session_key = ? AND tool = ? AND scope = ? AND until > ?",
        [session_key, tool, scope, now],
    ).fetchone()
    return row is not None


@dataclass(frozen=True, slots=True)
class GrantRow:
    session_key: str
    tool: str
    scope: str
    until: float
    approval_id: str


def list_grants(db: SqlDb) -> list[GrantRow]:
    """Every grant (expired ones too, until retention prunes them)."""
    rows = db.execute(
        "SELECT session_key, tool, scope, until, approval_id FROM grants"
        " ORDER BY session_key, tool, scope"
    ).fetchall()
    return [GrantRow(*row) for row in rows]


def ids_beginning(db: SqlDb, prefix: str) -> list[str]:
    """The ids of every request that begins with ``prefix``, oldest first."""
    rows = db.execute(
        "SELECT id FROM approvals WHERE substr(id, 1, ?) = ? ORDER BY created_at",
        [len(prefix), prefix],
    ).fetchall()
    return [row[0] for row in rows]
