"""Leases among the daemons that share one store: who drives a session, who delivers the
outbox, who polls Telegram. A lease is held by an instance for as long as that instance
is alive — its row in ``instances`` seen within the lease time — so nothing is renewed
per lease; a daemon that dies loses all of its leases at once, when its row goes stale.
Taking a lease is one statement: a new row, or the row of an instance that is no longer
alive (or already ours) taken over; two daemons taking one lease at once are serialised
by the row's lock, and only one of them gets it.
"""

from __future__ import annotations

from .sql import SqlDb


def take(db: SqlDb, name: str, instance: str, now: float, alive_since: float) -> bool:
    """Hold ``name`` for ``instance``; False while another live instance holds it."""
    row = db.execute(
        "INSERT INTO leases (name, instance, taken_at) VALUES (?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET instance = excluded.instance,"
        " taken_at = excluded.taken_at"
        " WHERE leases.instance = excluded.instance OR NOT EXISTS ("
        "  SELECT 1 FROM instances i WHERE i.name = leases.instance AND i.seen_at >= ?)"
        " RETURNING instance",
        [name, instance, now, alive_since],
    ).fetchone()
    return row is not None


def release(db: SqlDb, name: str, instance: str) -> bool:
    cursor = db.execute("DELETE FROM leases WHERE name = ? AND instance = ?", [name, instance])
    return cursor.rowcount == 1


def holders(db: SqlDb, alive_since: float) -> dict[str, list[str]]:
    """The leases each live instance holds, by instance."""
    rows = db.execute(
        "SELECT l.instance, l.name FROM leases l JOIN instances i ON i.name = l.instance"
        " WHERE i.seen_at >= ? ORDER BY l.instance, l.name",
        [alive_since],
    ).fetchall()
    held: dict[str, list[str]] = {}
    for instance, name in rows:
        held.setdefault(instance, []).append(name)
    return held
