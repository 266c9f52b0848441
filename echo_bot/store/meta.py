"""Small facts about the running daemon, for `echo-bot status`."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from .sql import SqlDb, db_clock


@dataclass(frozen=True, slots=True)
class InstanceRow:
    name: str  # this process's, unique: what holds its leases
    label: str  # [bot] instance, or host-pid: what people see
    host: str
    boot_id: str  # the running kernel's: a pid names one process only within one boot
    pid: int
    version: str
    started_at: float
    seen_at: float


WAKE_CHANNEL = "echo_bot"  # PostgreSQL's LISTEN/NOTIFY channel between the daemons


# A shared helper of ``Tx.flush`` (in the transaction, after the repositories' work).
def notify(db: SqlDb, kinds: Iterable[str]) -> None:
    """Tell every daemon listening (PostgreSQL) what this transaction committed, once it
    commits: NOTIFY is delivered at COMMIT, and never for a rollback. The store's own
    connection gathers the kinds of a batch's jobs into one NOTIFY (``PgHandle.wake``)."""
    wake = getattr(db, "wake", None)
    if wake is not None:
        wake(kinds)
    else:
        notify_now(db, kinds)


def notify_now(db: SqlDb, kinds: Iterable[str]) -> None:
    db.execute(f"SELECT pg_notify('{WAKE_CHANNEL}', ?)", [",".join(sorted(kinds))])


# A module function, not a repository method: ``store/inspect.py`` reads a store file
# read-only on its own connection, outside any transaction of ``Store`` (``echo-bot
# doctor`` looking at a store a daemon may hold).
def queued_by_channel(db: SqlDb) -> dict[str, int]:
    """Outbound messages waiting for delivery, per channel."""
    rows = db.execute(
        "SELECT channel, COUNT(*) FROM outbox WHERE status = 'queued' GROUP BY channel"
    ).fetchall()
    return {str(channel): int(count) for channel, count in rows}


class MetaRepo:
    """Facts about the running daemon and the queues, for `echo-bot status`; pruning."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def set_daemon_info(self, info: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES ('daemon', ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [json.dumps(info)],
        )

    def daemon_info(self) -> dict[str, Any]:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'daemon'").fetchone()
        return json.loads(row[0]) if row else {}

    def queue_counts(self) -> dict[str, int]:
        def one(sql: str) -> int:
            return int(self._db.execute(sql).fetchone()[0])

        return {
            "inbox_pending": one(
                "SELECT COUNT(*) FROM inbox WHERE status IN ('accepted', 'running')"
            ),
            "waiting_approval": one("SELECT COUNT(*) FROM inbox WHERE status = 'waiting_approval'"),
            "outbox_queued": one("SELECT COUNT(*) FROM outbox WHERE status = 'queued'"),
            "outbox_failed": one("SELECT COUNT(*) FROM outbox WHERE status = 'failed'"),
            "approvals_pending": one("SELECT COUNT(*) FROM approvals WHERE status = 'pending'"),
            "reminders_active": one("SELECT COUNT(*) FROM reminders WHERE status = 'active'"),
        }

    def instance_seen(self, row: InstanceRow) -> None:
        """This daemon is alive (its row made or refreshed)."""
        self._db.execute(
            "INSERT INTO instances (name, label, host, boot_id, pid, version, started_at, seen_at)"
            f" VALUES (?, ?, ?, ?, ?, ?, ?, {db_clock(self._db)}) ON CONFLICT (name) DO UPDATE SET"
            " label = excluded.label, host = excluded.host, boot_id = excluded.boot_id,"
            " pid = excluded.pid, version = excluded.version, started_at = excluded.started_at,"
            " seen_at = excluded.seen_at",
            [
                row.name,
                row.label,
                row.host,
                row.boot_id,
                row.pid,
                row.version,
                row.started_at,
            ],
        )

    def instance_gone(self, name: str) -> None:
        self._db.execute("DELETE FROM instances WHERE name = ?", [name])

    def position(self, name: str) -> tuple[int, float] | None:
        """A reader's stored position (a Telegram poller's offset) and when it was stored."""
        row = self._db.execute(
            "SELECT value FROM meta WHERE key = ?", [f"position:{name}"]
        ).fetchone()
        if row is None:
            return None
        stored = json.loads(row[0])
        return int(stored["value"]), float(stored["at"])

    def set_position(self, name: str, value: int) -> None:
        """Move a reader's position forward (never back: a poller that lost its lease late
        may still write one it had)."""
        current = self.position(name)
        if current is not None and current[0] >= value:
            return
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [f"position:{name}", json.dumps({"value": value, "at": time.time()})],
        )

    def note(self, name: str) -> tuple[str, float] | None:
        """A reader's stored text position (a Matrix sync token, which is opaque and not
        ordered: kept as it is, last writer wins) and when it was stored."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", [f"note:{name}"]).fetchone()
        if row is None:
            return None
        stored = json.loads(row[0])
        return str(stored["value"]), float(stored["at"])

    def set_note(self, name: str, value: str, *, replace: bool = True) -> None:
        """``value`` kept under ``name``; with ``replace=False``, only if none is yet."""
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO "
            + ("UPDATE SET value = excluded.value" if replace else "NOTHING"),
            [f"note:{name}", json.dumps({"value": value, "at": time.time()})],
        )

    def now(self) -> float:
        """The store's clock: the one every daemon's ``seen_at`` is judged by."""
        return float(self._db.execute(f"SELECT {db_clock(self._db)}").fetchone()[0])

    def instances(self) -> list[InstanceRow]:
        """Every daemon that has used the store and not left, the most recently seen
        first (one whose ``seen_at`` is old died without saying so)."""
        rows = self._db.execute(
            "SELECT name, label, host, boot_id, pid, version, started_at, seen_at FROM instances"
            " ORDER BY seen_at DESC, name"
        ).fetchall()
        return [
            InstanceRow(r[0], r[1], r[2], r[3], int(r[4]), r[5], float(r[6]), float(r[7]))
            for r in rows
        ]

    def prune(
        self, before: float, batch: int | None = None, only: Collection[str] | None = None
    ) -> dict[str, int]:
        """Delete finished rows last touched before ``before``; counts per table. With
        ``batch``, at most that many rows of each large table (the ones a day of use
        grows): a short transaction, to be called again, for ``only`` the tables whose
        count reached ``batch``, until none does."""
        counts: dict[str, int] = {}

        def delete(table: str, sql: str, args: list[object], key: str | None = None) -> None:
            if only is not None and table not in only:
                return
            where = sql
            if batch is not None and key is not None:
                where = f"{key} IN (SELECT {key} FROM {table} WHERE {sql} LIMIT {int(batch)})"
            counts[table] = self._db.execute(f"DELETE FROM {table} WHERE {where}", args).rowcount

        delete(
            "inbox",
            "status IN ('done', 'failed', 'denied', 'expired') AND updated_at < ?",
            [before],
            "seq",
        )
        delete(
            "receipts",
            "delivered_at < ? AND outbound_id NOT IN (SELECT prompt_outbound_id FROM approvals"
            " WHERE status = 'pending' AND prompt_outbound_id IS NOT NULL)",
            [before],
            "outbound_id",
        )
        delete("outbox", "status IN ('sent', 'failed') AND finished_at < ?", [before], "seq")
        delete("audit", "ts < ?", [before], "seq")
        delete("reminder_fires", "fired_at < ?", [before])
        # Done, missed or cancelled: an active one stays, however old.
        delete(
            "reminders", "status != 'active' AND COALESCE(last_fired_at, created_at) < ?", [before]
        )
        delete("approvals", "status != 'pending' AND created_at < ?", [before])
        # A finished turn's steps and calls (their results are in its history too); the
        # turn once none of its calls is left (a batch may stop among them).
        finished = "SELECT id FROM turns WHERE status IN ('done', 'failed') AND updated_at < ?"
        delete("tool_calls", f"turn_id IN ({finished})", [before], "id")
        delete(
            "turns",
            "status IN ('done', 'failed') AND updated_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM tool_calls c WHERE c.turn_id = turns.id)",
            [before],
            "id",
        )
        delete("grants", "until < ?", [before])
        delete("pairing_codes", "expires_at < ?", [before])
        delete("pair_attempts", "ts < ?", [before])
        delete("instances", "seen_at < ?", [before])  # a daemon gone (a crash, a reboot)
        return counts
