"""Leases among the daemons that share one store: who drives a session, who delivers the
outbox, who polls Telegram. A lease is held by an instance for as long as that instance
is alive — its row in ``instances`` seen within the lease time — so nothing is renewed
per lease; a daemon that dies loses all of its leases at once, when its row goes stale.
Taking a lease is one statement: a new row, or the row of an instance that is no longer
alive (or already ours) taken over; two daemons taking one lease at once are serialised
by the row's lock, and only one of them gets it.
"""

from __future__ import annotations

from collections.abc import Callable

from .sql import POSTGRES, SqlDb, db_clock, dialect, expect_row


class LeaseRepo:
    """Leases among the daemons sharing the store (``store/leases.py``)."""

    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def take(self, name: str, instance: str, lease: float) -> bool:
        """Hold ``name`` for ``instance``; False while another instance seen within the last
        ``lease`` seconds (by the database's clock) holds it, or while ``instance`` itself
        was not seen within them."""
        return self.take_noting(name, instance, lease)[0]

    def take_noting(self, name: str, instance: str, lease: float) -> tuple[bool, bool]:
        """``take``, and whether ``instance`` held it already: without a break, for no
        other instance can have held it since (it would be the row's holder now, or
        have let it go: no row). On PostgreSQL only (the subquery sees the row as the
        statement found it); elsewhere never said."""
        return self.take_sent(name, instance, lease)()

    def take_sent(self, name: str, instance: str, lease: float) -> Callable[[], tuple[bool, bool]]:
        """``take_noting``'s statement, issued now; its answer when the returned function
        is called (on PostgreSQL what is issued before that goes in the same round trip)."""
        clock = db_clock(self._db)
        before = (
            "(SELECT o.instance FROM leases o WHERE o.name = leases.name)"
            if dialect(self._db) == POSTGRES
            else "NULL"
        )
        # Taken only by a daemon the others see alive: one whose own row went stale
        # (its beats did not land) is free for them to take from, and must not take,
        # or take back, what they may be taking at once.
        cursor = self._db.execute(
            f"INSERT INTO leases (name, instance, taken_at) SELECT ?, ?, {clock}"
            " WHERE EXISTS (SELECT 1 FROM instances s WHERE s.name = ?"
            f"  AND s.seen_at >= {clock} - ?)"
            " ON CONFLICT (name) DO UPDATE SET instance = excluded.instance,"
            " taken_at = excluded.taken_at"
            " WHERE leases.instance = excluded.instance OR NOT EXISTS ("
            "  SELECT 1 FROM instances i WHERE i.name = leases.instance"
            f"  AND i.seen_at >= {clock} - ?)"
            f" RETURNING instance, {before}",
            [name, instance, instance, lease, lease],
        )  # fmt: skip

        def answer() -> tuple[bool, bool]:
            row = cursor.fetchone()
            return row is not None, row is not None and row[1] == instance

        return answer

    def hold(self, name: str, instance: str, error: Exception) -> None:
        """Raise ``error`` unless ``instance`` still holds ``name`` — on PostgreSQL with the
        row locked until the transaction ends, so a daemon taking it over waits for what
        this one commits, and checked by the server (``sql.expect_row``: raised at the
        unit of work's next wait, and nothing of it committed)."""
        lock = " FOR UPDATE" if dialect(self._db) == POSTGRES else ""
        expect_row(
            self._db,
            f"SELECT 1 FROM leases WHERE name = ? AND instance = ?{lock}",
            [name, instance],
            error,
        )

    def release(self, name: str, instance: str) -> bool:
        cursor = self._db.execute(
            "DELETE FROM leases WHERE name = ? AND instance = ?", [name, instance]
        )
        return cursor.rowcount == 1

    def holders(self, lease: float) -> dict[str, list[str]]:
        """The leases each live instance holds, by instance."""
        rows = self._db.execute(
            "SELECT l.instance, l.name FROM leases l JOIN instances i ON i.name = l.instance"
            f" WHERE i.seen_at >= {db_clock(self._db)} - ? ORDER BY l.instance, l.name",
            [lease],
        ).fetchall()
        held: dict[str, list[str]] = {}
        for instance, name in rows:
            held.setdefault(instance, []).append(name)
        return held

    def every(self) -> list[tuple[str, str]]:
        """Every lease held, live holder or not: (name, instance), by name."""
        rows = self._db.execute("SELECT name, instance FROM leases ORDER BY name").fetchall()
        return [(str(name), str(instance)) for name, instance in rows]
