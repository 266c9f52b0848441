"""Approval decisions applied and requests expired: the part of the approvals that runs.

A decision arrives as an inbound (``DecisionInbound``) and is applied once, in one
transaction with its inbound's status (compare-and-set on the request: whoever comes
first — a decision or the expiry — wins). Requests expire by a timer: it sleeps until the
next request's deadline (``tx.approvals.next_expiry``), is re-armed when this process
creates a request (``ApprovalRequested``) or applies a decision, and looks again at least
every ``EXPIRY_RECHECK`` seconds for requests other daemons on a shared store created.

Neither ever runs a turn: the turns a decision or an expiry lets go on are handed to
``resume`` (the dispatcher's), which queues them on their sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..cluster import Cluster, session_lease
from ..events import DecisionInbound, InboundStatus, OutboundKind, OutboundMessage
from ..logs import log_retrying
from ..statuses import ApprovalStatus
from ..store import ApprovalRequested, Store, Tx, once_the_store_is_back
from .gate import ApprovalGate, DecisionOutcome

T = TypeVar("T")

log = logging.getLogger(__name__)

# The longest the expiry timer sleeps without looking: the safety net for requests it
# was not told about (created by another daemon on a shared store, which may have died).
EXPIRY_RECHECK = 10.0
# After a failed look (the store away), the timer tries again this much later.
EXPIRY_RETRY = 1.0

Resume = Callable[[list[str]], None]


class Decisions:
    """Applies decisions and expires requests; hands the turns to resume to ``resume``."""

    def __init__(
        self,
        *,
        store: Store,
        gate: ApprovalGate,
        resume: Resume,
        cluster: Cluster | None = None,
    ) -> None:
        self.store = store
        self.gate = gate
        self.resume = resume
        self.cluster = cluster
        self._stopping = False
        self._rearm = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self.looked = 0  # the expiry timer's looks at the store that have come back
        store.subscribe(ApprovalRequested, self._requested)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the expiry timer (its first look expires what fell due while stopped)."""
        self._timer = asyncio.create_task(self._expiry_loop(), name="approval-expiry")

    async def stop(self) -> None:
        self._stopping = True
        self.store.unsubscribe(ApprovalRequested, self._requested)
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)

    def rearm(self) -> None:
        """Look at the next expiry again now (a request was created or decided)."""
        self._rearm.set()

    def _requested(self, _event: ApprovalRequested) -> None:
        self.rearm()

    # -- decisions ------------------------------------------------------------------------
    async def decide(self, message: DecisionInbound) -> bool:
        """Apply ``message``. With several daemons it is decided where its chat's session
        is held, as that chat's turns are: never by two daemons at once (each would find
        it accepted and decide it). True when this daemon took the session's lease for it
        (the caller lets it go once the session is idle)."""
        if self.cluster is None:
            await self.apply(message)
            return False
        cluster, session_key = self.cluster, message.session_key
        held = bool(  # None: stopping meanwhile, the decision waits in the inbox
            await self._once_the_store_is_back(
                f"decision {message.id}", lambda: cluster.take(session_lease(session_key))
            )
        )
        if held:
            await self.apply(message)
        return held

    async def apply(self, message: DecisionInbound) -> None:
        """Apply the decision once (its inbound goes from accepted to done or failed in
        the same transaction) and hand the turns it lets go on to ``resume``."""
        gate = self.gate
        try:
            outcome = await self._once_the_store_is_back(
                f"decision {message.id}",
                lambda: self.store.run(lambda tx: _apply(tx, gate, message)),
            )
        except Exception:
            log.exception("applying decision %s failed", message.id)
            return
        if outcome is None:
            return
        self.rearm()
        self.resume(outcome.resume_turns)

    async def _once_the_store_is_back(
        self, what: str, attempt: Callable[[], Awaitable[T]]
    ) -> T | None:
        return await once_the_store_is_back(what, attempt, lambda: self._stopping, log)

    # -- expiry ---------------------------------------------------------------------------
    async def _expiry_loop(self) -> None:
        while True:
            self._rearm.clear()  # a request committed from here on re-arms it
            try:
                turns, next_at = await self.store.run(self._expire_due)
            except Exception:
                log_retrying(log, "expiring approvals failed; retrying")
                delay = EXPIRY_RETRY
            else:
                self.looked += 1
                if turns:
                    self.resume(turns)
                delay = EXPIRY_RECHECK
                if next_at is not None:
                    delay = min(delay, max(0.0, next_at - self.gate.clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._rearm.wait()

    def _expire_due(self, tx: Tx) -> tuple[list[str], float | None]:
        """Expire what is due; the turns to resume and the next pending deadline."""
        return self.gate.expire_due(tx), tx.approvals.next_expiry()


def _apply(tx: Tx, gate: ApprovalGate, message: DecisionInbound) -> DecisionOutcome | None:
    """The decision in ``tx``; None when there is nothing to resume."""
    decision = message.decision
    current = tx.inbox.status_of(message.id)
    if current is None:
        return None
    if current[0] != InboundStatus.ACCEPTED:
        # Applied already — maybe by a COMMIT whose answer was lost, so the turn it
        # decided may never have been resumed: resume it (a no-op if it was).
        row = tx.approvals.get(decision.request_id)
        if current[0] != InboundStatus.DONE or row is None or row.status == ApprovalStatus.PENDING:
            return None
        return DecisionOutcome(
            "Applied already.", row, status=row.status, resume_turns=[row.turn_id]
        )
    outcome = gate.decide(tx, decision)
    status = InboundStatus.DONE if outcome.ok else InboundStatus.FAILED
    tx.inbox.set_status(message.id, status, None if outcome.ok else outcome.message)
    if not outcome.ok and not decision.answered:
        tx.outbox.add(
            OutboundMessage(
                to=message.address,
                text=f"⚠️ {outcome.message}",
                kind=OutboundKind.NOTICE,
                metadata={"inbound_id": message.id, "refused": outcome.refused},
            ),
        )
    return outcome
