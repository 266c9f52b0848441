"""The audit log: every brain decision, tool execution and approval, masked."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlite_utils import Database as SqlDb

from ..secrets import Masker


@dataclass(frozen=True, slots=True)
class AuditRow:
    seq: int
    ts: float
    trace_id: str | None
    session_key: str | None
    kind: str
    data: dict[str, Any]


class AuditWriter:
    """Writes audit rows inside the caller's transaction, masking secrets first."""

    def __init__(self, masker: Masker) -> None:
        self.masker = masker

    def write(
        self,
        db: SqlDb,
        event: str,
        *,
        trace_id: str | None,
        session_key: str | None,
        **data: Any,
    ) -> None:
        masked = self.masker.mask_data(data)
        db.execute(
            "INSERT INTO audit (ts, trace_id, session_key, kind, data) VALUES (?, ?, ?, ?, ?)",
            [time.time(), trace_id, session_key, event, json.dumps(masked, default=str)],
        )


def read_audit(db: SqlDb, *, tail: int = 50, trace_id: str | None = None) -> list[AuditRow]:
    if trace_id:
        rows = db.execute(
            "SELECT seq, ts, trace_id, session_key, kind, data FROM audit WHERE trace_id = ?"
            " ORDER BY seq",
            [trace_id],
        ).fetchall()
    else:
        rows = db.execute(
            "SELECT * FROM (SELECT seq, ts, trace_id, session_key, kind, data FROM audit"
            " ORDER BY seq DESC LIMIT ?) ORDER BY seq",
            [tail],
        ).fetchall()
    return [AuditRow(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]
