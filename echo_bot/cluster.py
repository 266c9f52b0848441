"""This daemon among the daemons that share one PostgreSQL store.

Each daemon keeps its row in ``instances`` fresh (every ``BEAT`` seconds); a lease held
by a daemon whose row is older than ``LEASE`` seconds is free for the taking, so the
work of a daemon that died is taken over within about that time, and nothing is renewed
lease by lease. What is held: each session a daemon is driving (``session:<key>``: one
daemon runs a session's turns at a time, in order), each channel's outbox
(``delivery:<channel>``, taken only by daemons that run that channel: one of them sends,
so each chat's messages leave in order and Telegram's limits hold for the whole cluster,
and a channel only one daemon runs — the terminal — is delivered by that daemon), a
Telegram bot's polling (``telegram-poller:<bot id>``). With one daemon on a
store (SQLite) there is no ``Cluster`` at all. docs/ARCHITECTURE.md ("Several daemons
on one database") has the whole picture.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from .errors import LeaseLost
from .store import Store, Tx

BEAT = 5.0  # seconds between refreshes of this daemon's instance row
LEASE = 15.0  # a daemon unseen this long is gone: its leases are free


SESSION = "session:"


def session_lease(session_key: str) -> str:
    return f"{SESSION}{session_key}"


class Cluster:
    def __init__(
        self, store: Store, name: str, *, label: str | None = None, lease: float = LEASE
    ) -> None:
        # Liveness is judged by the database's clock (store/sql.py db_clock): the
        # daemons' own clocks may be seconds apart.
        self.store, self.name, self.lease = store, name, lease
        # What people see, in the log as in `status` ([bot] instance, else host-pid);
        # ``name`` (unique to the process) is what holds the leases.
        self.label = label or name
        # Told a session's key when this daemon takes its lease after a break (it was let
        # go, or another daemon held it): what it kept of the session may be stale.
        self._on_break: list[Callable[[str], None]] = []

    def on_break(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(session_key)`` once a take of a session's lease after a break
        is committed (``LeaseRepo.take_noting``)."""
        self._on_break.append(callback)

    def take_in(self, tx: Tx, lease: str, within: float | None = None) -> bool:
        return self._take_sent(tx, lease, within)()

    def _take_sent(self, tx: Tx, lease: str, within: float | None = None) -> Callable[[], bool]:
        """``take_in``'s statement issued; whether it took the lease when called."""
        answer = tx.leases.take_sent(lease, self.name, self.lease if within is None else within)

        def taken() -> bool:
            taken, kept = answer()
            if taken and not kept and lease.startswith(SESSION):
                tx.on_commit(partial(self._broken, lease.removeprefix(SESSION)))
            return taken

        return taken

    def _broken(self, session_key: str) -> None:
        for callback in self._on_break:
            callback(session_key)

    async def take(self, lease: str, within: float | None = None) -> bool:
        """Hold ``lease`` (or go on holding it); False while another live daemon does.
        ``within``: its holder counts as gone when unseen this long (default ``lease``)."""
        return await self.store.run(lambda tx: self.take_in(tx, lease, within))

    async def take_session(self, session_key: str, inbound_id: str) -> list[str] | None:
        """Hold the session to run its turn ``inbound_id``: None while another live daemon
        drives it, else the session's turns with work to do that arrived before it
        (oldest first), which run first so that the session keeps its order."""

        def take(tx: Tx) -> list[str] | None:
            taken = self._take_sent(tx, session_lease(session_key))
            earlier = tx.inbox.earlier_turns(session_key, inbound_id)  # one round trip
            return earlier() if taken() else None

        return await self.store.run(take)

    def fence(self, tx: Tx, session_key: str) -> None:
        """Raise LeaseLost unless this daemon still holds the session (on PostgreSQL at the
        transaction's next wait, the server checking it: ``LeaseRepo.hold``). In the transaction
        of every checkpoint of a turn (the runner's, and the one that marks a
        side-effecting call started): a daemon that lost a session — stalled past its
        lease — writes nothing more to it and starts none of its calls, and one taking
        it over waits for that commit (the lease row is locked), then finds a started
        call and reports it OUTCOME_UNKNOWN instead of running it again."""
        tx.leases.hold(
            session_lease(session_key),
            self.name,
            LeaseLost(f"session {session_key} is driven by another daemon now"),
        )

    async def take_all(self, leases: list[str]) -> dict[str, bool]:
        """``take`` for each of ``leases``, in one transaction."""
        return await self.store.run(lambda tx: {name: self.take_in(tx, name) for name in leases})

    async def release(self, lease: str) -> None:
        await self.store.run(lambda tx: tx.leases.release(lease, self.name))

    async def release_session(self, session_key: str) -> bool:
        """Let the session go unless accepted work for it waits in the inbox (committed by
        another daemon meanwhile: this one's poll brings it here). True if released."""

        def let_go(tx: Tx) -> bool:
            if tx.inbox.has_accepted(session_key):
                return False
            return tx.leases.release(session_lease(session_key), self.name)

        return await self.store.run(let_go)
