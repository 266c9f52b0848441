"""Who may talk: users added at run time by pairing, one-time codes, failed tries."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlite_utils import Database as SqlDb

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
CODE_LENGTH = 8
CODE_TTL = 600.0
MAX_FAILURES_PER_HOUR = 5


def _hash(code: str) -> str:
    normal = code.strip().upper().replace("-", "").replace(" ", "")
    return hashlib.sha256(normal.encode()).hexdigest()


def new_pairing_code(db: SqlDb, now: float | None = None) -> str:
    now = time.time() if now is None else now
    raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    db.execute(
        "INSERT INTO pairing_codes (code_hash, created_at, expires_at) VALUES (?, ?, ?)",
        [_hash(raw), now, now + CODE_TTL],
    )
    return f"{raw[:4]}-{raw[4:]}"


def is_paired(db: SqlDb, channel: str, user_id: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM allowed_users WHERE channel = ? AND user_id = ?", [channel, user_id]
    ).fetchone()
    return row is not None


def paired_users(db: SqlDb, channel: str) -> set[str]:
    rows = db.execute("SELECT user_id FROM allowed_users WHERE channel = ?", [channel]).fetchall()
    return {r[0] for r in rows}


def try_pair(db: SqlDb, channel: str, user_id: str, code: str, now: float | None = None) -> str:
    """ "paired", "already", "locked" or "wrong" (expired and used codes are wrong)."""
    now = time.time() if now is None else now
    if is_paired(db, channel, user_id):
        return "already"
    failures = db.execute(
        "SELECT COUNT(*) FROM pair_attempts WHERE channel = ? AND user_id = ? AND ts > ?",
        [channel, user_id, now - 3600],
    ).fetchone()[0]
    if failures >= MAX_FAILURES_PER_HOUR:
        return "locked"
    cursor = db.execute(
        "UPDATE pairing_codes SET used_by = ?, used_at = ? WHERE code_hash = ?"
        " AND used_by IS NULL AND expires_at > ?",
        [f"{channel}:{user_id}", now, _hash(code), now],
    )
    if cursor.rowcount != 1:
        db.execute(
            "INSERT INTO pair_attempts (channel, user_id, ts) VALUES (?, ?, ?)",
            [channel, user_id, now],
        )
        return "locked" if failures + 1 >= MAX_FAILURES_PER_HOUR else "wrong"
    db.execute(
        "INSERT OR IGNORE INTO allowed_users (channel, user_id, added_at, via) VALUES (?, ?, ?, ?)",
        [channel, user_id, now, "pairing"],
    )
    return "paired"
