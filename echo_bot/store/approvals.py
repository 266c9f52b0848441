"""Durable approval requests and time-boxed grants. Decisions are compare-and-set."""

from __future__ import annotations

import builtins
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..statuses import ApprovalStatus
from .committed import ApprovalDecided, ApprovalRequested
from .sql import SqlDb

if TYPE_CHECKING:
    from .tx import Tx


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
    # Why it asks: the policy's step, as the prompt said it ("" for older rows).
    reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ApprovalStatus(self.status))

    def expired_at(self, now: float) -> bool:
        return now >= self.expires_at


_COLUMNS = (
    "id, turn_id, session_key, trace_id, tool, args, args_hash, risk, requested_by, origin,"
    " prompt_to, prompt_outbound_id, status, verb, decided_by, decided_at, created_at, expires_at,"
    " grant_scope, reason"
)


def _row(raw: tuple[Any, ...]) -> ApprovalRow:
    values = list(raw)
    values[5] = json.loads(values[5])
    values[8] = json.loads(values[8])
    values[14] = json.loads(values[14]) if values[14] else None
    values[19] = values[19] or ""
    return ApprovalRow(*values)


@dataclass(frozen=True, slots=True)
class NewApproval:
    """A request as it is created (``tx.approvals.insert``): pending, undecided, made now."""

    id: str
    turn_id: str
    session_key: str
    trace_id: str
    tool: str
    args: dict[str, Any]  # in the order they are shown
    args_hash: str
    risk: str
    requested_by: dict[str, Any]
    origin: str
    prompt_to: str
    prompt_outbound_id: str | None
    expires_at: float
    # What "allow for a time" would grant beside the tool; None: the verb is not offered.
    grant_scope: str | None = None
    reason: str = ""  # why it asks (the policy's step)


class ApprovalRepo:
    __slots__ = ("_db", "_tx")

    def __init__(self, db: SqlDb, tx: Tx) -> None:
        self._db, self._tx = db, tx

    def insert(self, new: NewApproval) -> None:
        """Store a pending request; the expiry timer is told on COMMIT."""
        self._db.execute(
            f"INSERT INTO approvals ({_COLUMNS}) VALUES"
            " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, ?, ?, ?, ?)",
            [
                new.id,
                new.turn_id,
                new.session_key,
                new.trace_id,
                new.tool,
                json.dumps(new.args),  # in the order given: the order they are shown in
                new.args_hash,
                new.risk,
                json.dumps(new.requested_by),
                new.origin,
                new.prompt_to,
                new.prompt_outbound_id,
                time.time(),
                new.expires_at,
                new.grant_scope,
                new.reason,
            ],
        )
        self._tx.announce(ApprovalRequested(new.id, new.expires_at))

    def get(self, approval_id: str) -> ApprovalRow | None:
        raw = self._db.execute(
            f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", [approval_id]
        ).fetchone()
        return _row(tuple(raw)) if raw else None

    def list(
        self, status: ApprovalStatus | None = ApprovalStatus.PENDING, limit: int = 100
    ) -> list[ApprovalRow]:
        if status is None:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM approvals ORDER BY created_at DESC LIMIT ?", [limit]
            ).fetchall()
        else:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE status = ? ORDER BY created_at LIMIT ?",
                [status, limit],
            ).fetchall()
        return [_row(tuple(r)) for r in rows]

    def decided(
        self, *, since: float | None = None, limit: int = 100, offset: int = 0
    ) -> builtins.list[ApprovalRow]:
        """Requests no longer pending (decided or expired), the newest decision first;
        only those decided at or after ``since`` when given."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM approvals WHERE status != 'pending'"
            " AND decided_at >= ? ORDER BY decided_at DESC, id LIMIT ? OFFSET ?",
            [since or 0.0, limit, offset],
        ).fetchall()
        return [_row(tuple(r)) for r in rows]

    def pending_for(self, prompt_to: str) -> builtins.list[ApprovalRow]:
        """Every pending request whose prompt goes to ``prompt_to``, oldest first."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM approvals WHERE status = 'pending' AND prompt_to = ?"
            " ORDER BY created_at",
            [prompt_to],
        ).fetchall()
        return [_row(tuple(r)) for r in rows]

    def ids_beginning(self, prefix: str) -> builtins.list[str]:
        """The ids of every request that begins with ``prefix``, oldest first."""
        rows = self._db.execute(
            "SELECT id FROM approvals WHERE substr(id, 1, ?) = ? ORDER BY created_at",
            [len(prefix), prefix],
        ).fetchall()
        return [row[0] for row in rows]

    def decide(
        self,
        approval_id: str,
        status: ApprovalStatus,
        *,
        verb: str | None,
        decided_by: dict[str, Any] | None,
    ) -> bool:
        """Compare-and-set from pending; False when someone (or expiry) got there first."""
        cursor = self._db.execute(
            "UPDATE approvals SET status = ?, verb = ?, decided_by = ?, decided_at = ?"
            " WHERE id = ? AND status = 'pending'",
            [
                status,
                verb,
                json.dumps(decided_by) if decided_by else None,
                time.time(),
                approval_id,
            ],
        )
        if cursor.rowcount != 1:
            return False
        self._tx.announce(ApprovalDecided(approval_id))
        return True

    def due_for_expiry(self, now: float) -> builtins.list[str]:
        rows = self._db.execute(
            "SELECT id FROM approvals WHERE status = 'pending' AND expires_at <= ?", [now]
        ).fetchall()
        return [r[0] for r in rows]

    def next_expiry(self) -> float | None:
        """When the first pending request expires; None when none is pending."""
        found = self._db.execute(
            "SELECT MIN(expires_at) FROM approvals WHERE status = 'pending'"
        ).fetchone()[0]
        return None if found is None else float(found)


@dataclass(frozen=True, slots=True)
class GrantRow:
    session_key: str
    tool: str
    scope: str
    until: float
    approval_id: str


class GrantRepo:
    """ "Allow for N minutes": a chat's time-boxed permission for one tool, within one
    scope (the deciding arguments the approver saw, as the tool states them)."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def add(self, session_key: str, tool: str, scope: str, until: float, approval_id: str) -> None:
        self._db.execute(
            "INSERT INTO grants (session_key, tool, scope, until, approval_id)"
            " VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT(session_key, tool, scope) DO UPDATE SET until = excluded.until,"
            " approval_id = excluded.approval_id",
            [session_key, tool, scope, until, approval_id],
        )

    def all(self) -> list[GrantRow]:
        """Every grant (expired ones too, until retention prunes them)."""
        rows = self._db.execute(
            "SELECT session_key, tool, scope, until, approval_id FROM grants"
            " ORDER BY session_key, tool, scope"
        ).fetchall()
        return [GrantRow(*row) for row in rows]

    def holds(self, session_key: str, tool: str, scope: str, now: float) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM grants WHERE session_key = ? AND tool = ? AND scope = ? AND until > ?",
            [session_key, tool, scope, now],
        ).fetchone()
        return row is not None
