"""Who may talk: users added at run time by pairing, one-time codes, failed tries."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from .sql import SqlDb, json_text

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
CODE_LENGTH = 8
CODE_TTL = 600.0
MAX_FAILURES_PER_HOUR = 5


def _hash(code: str) -> str:
    normal = code.strip().upper().replace("-", "").replace(" ", "")
    return hashlib.sha256(normal.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class PairedUser:
    channel: str
    user_id: str
    added_at: float
    name: str | None  # the name they last wrote under, when the inbox still has it


class AccessRepo:
    """Users added by pairing, and the pairing codes."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def new_pairing_code(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        self._db.execute(
            "INSERT INTO pairing_codes (code_hash, created_at, expires_at) VALUES (?, ?, ?)",
            [_hash(raw), now, now + CODE_TTL],
        )
        return f"{raw[:4]}-{raw[4:]}"

    def pairing_open(self, now: float | None = None) -> bool:
        """Whether a code made by ``echo-bot pair`` is still unused and unexpired."""
        now = time.time() if now is None else now
        row = self._db.execute(
            "SELECT 1 FROM pairing_codes WHERE used_by IS NULL AND expires_at > ? LIMIT 1", [now]
        ).fetchone()
        return row is not None

    def is_paired(self, channel: str, user_id: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM allowed_users WHERE channel = ? AND user_id = ?", [channel, user_id]
        ).fetchone()
        return row is not None

    def paired_users(self) -> list[PairedUser]:
        """Everyone added by pairing, oldest first, with the name they last wrote under."""
        rows = self._db.execute(
            "SELECT a.channel, a.user_id, a.added_at, ("
            f" SELECT {json_text(self._db, 'i.payload', 'sender', 'name')} FROM inbox i"
            " WHERE i.channel = a.channel AND i.kind = 'message'"
            f" AND {json_text(self._db, 'i.payload', 'sender', 'id')} = a.user_id"
            " ORDER BY i.seq DESC LIMIT 1)"
            " FROM allowed_users a ORDER BY a.added_at, a.channel, a.user_id"
        ).fetchall()
        return [PairedUser(r[0], r[1], float(r[2]), r[3] or None) for r in rows]

    def revoke(self, channel: str, user_id: str) -> bool:
        """Remove a paired user; False when they were not paired. Access is checked against
        this table on every message, so a running daemon refuses them from the next one."""
        cursor = self._db.execute(
            "DELETE FROM allowed_users WHERE channel = ? AND user_id = ?", [channel, user_id]
        )
        return cursor.rowcount > 0

    def try_pair(self, channel: str, user_id: str, code: str, now: float | None = None) -> str:
        """ "paired", "already", "locked" or "wrong" (expired and used codes are wrong)."""
        now = time.time() if now is None else now
        if self.is_paired(channel, user_id):
            return "already"
        failures = self._db.execute(
            "SELECT COUNT(*) FROM pair_attempts WHERE channel = ? AND user_id = ? AND ts > ?",
            [channel, user_id, now - 3600],
        ).fetchone()[0]
        if failures >= MAX_FAILURES_PER_HOUR:
            return "locked"
        cursor = self._db.execute(
            "UPDATE pairing_codes SET used_by = ?, used_at = ? WHERE code_hash = ?"
            " AND used_by IS NULL AND expires_at > ?",
            [f"{channel}:{user_id}", now, _hash(code), now],
        )
        if cursor.rowcount != 1:
            self._db.execute(
                "INSERT INTO pair_attempts (channel, user_id, ts) VALUES (?, ?, ?)",
                [channel, user_id, now],
            )
            return "locked" if failures + 1 >= MAX_FAILURES_PER_HOUR else "wrong"
        self._db.execute(
            "INSERT INTO allowed_users (channel, user_id, added_at, via) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            [channel, user_id, now, "pairing"],
        )
        return "paired"
