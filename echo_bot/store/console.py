"""The web console's sign-in links and sessions (``console/auth.py`` makes them).

A link and a session are each a random secret in someone's hands; the store keeps only
its SHA-256 digest, so a backup or a read of the store signs no one in. A link is used
at most once (a compare-and-set on ``used_at``); a session ends at ``expires_at`` or when
revoked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .sql import SqlDb

# Rows of links and sessions kept after they expired (for `console sessions` to show
# recent ones), in seconds.
KEPT_AFTER_EXPIRY = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class ConsoleSessionRow:
    id: str
    approver: dict[str, Any]
    csrf: str
    created_at: float
    expires_at: float
    revoked_at: float | None
    agent: str

    def live(self, now: float) -> bool:
        return self.revoked_at is None and now < self.expires_at


_SESSION_COLUMNS = "id, approver, csrf, created_at, expires_at, revoked_at, agent"


def _session(raw: Any) -> ConsoleSessionRow:
    return ConsoleSessionRow(
        id=str(raw[0]),
        approver=json.loads(raw[1]),
        csrf=str(raw[2]),
        created_at=float(raw[3]),
        expires_at=float(raw[4]),
        revoked_at=None if raw[5] is None else float(raw[5]),
        agent=str(raw[6]),
    )


class ConsoleRepo:
    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    # -- links ------------------------------------------------------------------------
    def add_link(
        self, digest: str, approver: dict[str, Any], now: float, expires_at: float
    ) -> None:
        self._db.execute(
            "DELETE FROM console_links WHERE expires_at < ?", [now - KEPT_AFTER_EXPIRY]
        )
        self._db.execute(
            "INSERT INTO console_links (digest, approver, created_at, expires_at)"
            " VALUES (?, ?, ?, ?)",
            [digest, json.dumps(approver), now, expires_at],
        )

    def use_link(self, digest: str, now: float) -> dict[str, Any] | None:
        """The approver the link is for, marking it used; None when there is no such
        link, or it was used or has expired (the caller does not say which)."""
        row = self._db.execute(
            "UPDATE console_links SET used_at = ?"
            " WHERE digest = ? AND used_at IS NULL AND expires_at > ? RETURNING approver",
            [now, digest, now],
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    # -- sessions -----------------------------------------------------------------------
    def add_session(
        self,
        session_id: str,
        digest: str,
        approver: dict[str, Any],
        csrf: str,
        now: float,
        expires_at: float,
        agent: str,
    ) -> None:
        self._db.execute(
            "DELETE FROM console_sessions WHERE expires_at < ?", [now - KEPT_AFTER_EXPIRY]
        )
        self._db.execute(
            f"INSERT INTO console_sessions ({_SESSION_COLUMNS}, digest)"
            " VALUES (?, ?, ?, ?, ?, NULL, ?, ?)",
            [session_id, json.dumps(approver), csrf, now, expires_at, agent, digest],
        )

    def session(self, digest: str, now: float) -> ConsoleSessionRow | None:
        """The live session whose secret has this digest (None: none, ended or revoked)."""
        raw = self._db.execute(
            f"SELECT {_SESSION_COLUMNS} FROM console_sessions"
            " WHERE digest = ? AND revoked_at IS NULL AND expires_at > ?",
            [digest, now],
        ).fetchone()
        return None if raw is None else _session(raw)

    def sessions(self, now: float, *, ended: bool = False) -> list[ConsoleSessionRow]:
        """Live sessions, newest first (with ``ended``: revoked and expired ones too)."""
        where = "" if ended else " WHERE revoked_at IS NULL AND expires_at > ?"
        rows = self._db.execute(
            f"SELECT {_SESSION_COLUMNS} FROM console_sessions{where} ORDER BY created_at DESC",
            [] if ended else [now],
        ).fetchall()
        return [_session(r) for r in rows]

    def ids_beginning(self, prefix: str) -> list[str]:
        rows = self._db.execute(
            "SELECT id FROM console_sessions WHERE substr(id, 1, ?) = ? ORDER BY created_at",
            [len(prefix), prefix],
        ).fetchall()
        return [str(r[0]) for r in rows]

    def revoke(self, session_id: str, now: float) -> bool:
        """End a session now; False when it was not live."""
        cursor = self._db.execute(
            "UPDATE console_sessions SET revoked_at = ?"
            " WHERE id = ? AND revoked_at IS NULL AND expires_at > ?",
            [now, session_id, now],
        )
        return cursor.rowcount == 1
