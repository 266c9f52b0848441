"""Who runs what, when: takes this process's new inbound from the store's
``InboundCommitted`` event (and polls the inbox for rows other processes committed), runs
one turn at a time per session in arrival order, sessions round-robin and concurrently
up to a bound, and resumes suspended turns when ``approvals.Decisions`` (decisions and
expiry) hands them back."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .. import metrics
from ..approvals import ApprovalGate
from ..approvals.decisions import Decisions
from ..cluster import Cluster
from ..errors import LeaseLost
from ..events import (
    DecisionInbound,
    Inbound,
    InboundMessage,
    InboundStatus,
    OutboundKind,
    OutboundMessage,
)
from ..logs import log_retrying
from ..store import InboundCommitted, Store, Tx, once_the_store_is_back
from .runner import NotHeldAfterAll, TurnRunner

log = logging.getLogger(__name__)

# Management commands in other processes commit to the inbox; we look every so often.
POLL_INTERVAL = 0.5
# With several daemons: the claim poll's interval when nothing wakes it (NOTIFY does).
CLAIM_POLL = 2.0
POLL_PAGE = 500
# A session's queue keeps at most this many whole messages (saves reading them back);
# behind those it keeps ids, so a flood of deliveries costs little memory while it waits.
KEEP_QUEUED_MESSAGES = 64
# With several daemons: how long an idle session's lease is kept after its last turn. A
# chat's next message often follows soon; its turn then takes no lease anew, and none is
# let go in between.
IDLE_HOLD = 2.0

T = TypeVar("T")


class Dispatcher:
    def __init__(
        self,
        *,
        store: Store,
        runner: TurnRunner,
        gate: ApprovalGate,
        max_concurrent: int,
        cluster: Cluster | None = None,
    ) -> None:
        if store.instance is None:
            # Its own rows would look like another process's: the poll would run them
            # a second time.
            raise ValueError("the dispatcher needs a store that names its instance")
        self.store = store
        self.runner = runner
        self.gate = gate
        # Decisions and expiry: they hand the turns to resume back to ``_resume``.
        self.decisions = Decisions(store=store, gate=gate, resume=self._resume, cluster=cluster)
        self._max_concurrent = max_concurrent
        # With several daemons on one store: a session's turns run only where its lease
        # is held, and the poll reads every claimable row; ``_known`` is what this one
        # has queued or running already (the poll skips it).
        self.cluster = cluster
        self._known: set[str] = set()
        self._put_back: set[str] = set()  # queued again behind the session's earlier turns
        self._claim_now = asyncio.Event()  # set by wake(): another daemon committed work
        self._idle: dict[str, asyncio.TimerHandle] = {}  # held sessions' let-go timers
        # Sessions whose lease this daemon has taken and not let go: their next turn is
        # run without a take of its own (``TurnRunner.advance``'s ``held``), its first
        # checkpoint checking the lease. A belief, not a fact: never trusted unchecked.
        self._holding: set[str] = set()
        # Each session's turns to run, in order: the message itself when it was handed over
        # in memory, else its inbox id (recovery, resumed turns). Only sessions with
        # queued turns have an entry.
        self._queues: dict[str, collections.deque[InboundMessage | str]] = {}
        self._ready: collections.deque[str] = collections.deque()  # queued, none running
        self._running: dict[str, asyncio.Task[None]] = {}  # each session's turn in flight
        self._tasks: list[asyncio.Task[None]] = []
        self._last_seq = 0
        self._stopping = False
        # New inbound of this process committed before ``start`` read the unfinished
        # ones: held until then, so that none is dispatched twice.
        self._held: list[InboundMessage] | None = []
        self._counters: dict[tuple[str, str], Any] = {}
        store.subscribe(InboundCommitted, self._committed)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        # Every unfinished inbound and the newest seq, from one snapshot: a row committed
        # meanwhile is either in the list or after the seq, never both.
        unfinished, self._last_seq = await self.store.run(
            lambda tx: tx.inbox.unfinished(), slow=True
        )
        held, self._held = self._held or [], None
        for message in unfinished:
            # By its id: a recovered turn may have started before the stop, so its turn
            # reads where it stands (the runner starts in memory only what is new).
            self._dispatch(message, recovered=True)
        recovered = {message.id for message in unfinished}
        self.accept([message for message in held if message.id not in recovered])
        self._tasks = [asyncio.create_task(self._poll_loop(), name="inbox-poll")]
        self.decisions.start()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking new work; let running turns reach their next checkpoint."""
        self._stopping = True
        # What is committed from now on waits in the inbox for the next start.
        self.store.unsubscribe(InboundCommitted, self._committed)
        await self.decisions.stop()
        for task in self._tasks:
            task.cancel()
        for timer in self._idle.values():  # the leases go with this daemon's instance row
            timer.cancel()
        self._idle.clear()
        workers = list(self._running.values())
        if workers:
            _done, pending = await asyncio.wait(workers, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _committed(self, event: InboundCommitted) -> None:
        if self._held is not None:
            self._held.extend(event.messages)
        else:
            self.accept(event.messages)

    def accept(self, messages: Sequence[InboundMessage]) -> None:
        """New inbound, just committed in this process: run them without reading them
        back from the store (the poll never reads this process's rows)."""
        for message in messages:
            self._dispatch(message)
            self._count(message)

    def _count(self, message: InboundMessage) -> None:
        key = (message.address.channel, message.kind)
        counter = self._counters.get(key)
        if counter is None:  # labels() takes a lock and builds a key: once per kind
            counter = self._counters[key] = metrics.INBOUND.labels(*key)
        counter.inc()

    def busy(self) -> bool:
        return bool(self._running or self._queues)

    # -- reading the inbox ----------------------------------------------------------------
    async def _poll_loop(self) -> None:
        if self.cluster is not None:
            await self._claim_loop(self.cluster)
            return
        while True:
            # Only other processes' rows are read here (a management command's decision,
            # say); this process's own arrive by InboundCommitted.
            await asyncio.sleep(POLL_INTERVAL)
            more = True
            while more:  # until the poll has caught up
                try:
                    messages, last, more = await self._accepted_from_others(self._last_seq)
                except Exception:
                    log_retrying(log, "reading the inbox failed; retrying")
                    await asyncio.sleep(1)
                    break
                self._last_seq = max(self._last_seq, last)
                self.accept(messages)

    async def _accepted_from_others(self, seq: int) -> tuple[list[InboundMessage], int, bool]:
        """Accepted inbound after ``seq`` that other processes wrote, the newest seq
        looked at, and whether ``POLL_PAGE`` cut the look short."""
        return await self.store.run(lambda tx: tx.inbox.accepted_from_others(seq, POLL_PAGE))

    async def _claim_loop(self, cluster: Cluster) -> None:
        """With several daemons: every POLL_INTERVAL, the rows with work to do (accepted,
        orphaned running, waiting on approvals now all decided: ``inbox.claimable``)
        whose session no other live daemon holds, whoever wrote them — so work
        committed by one daemon for a session another drives reaches the driver, and a
        dead daemon's sessions are taken over once its lease has lapsed."""
        while True:
            # Woken by LISTEN/NOTIFY when any daemon commits inbound; the timer is the
            # safety net for a notification lost with a connection.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLAIM_POLL):
                    await self._claim_now.wait()
            self._claim_now.clear()
            try:
                found = await self.store.run(
                    lambda tx: tx.inbox.claimable(cluster.name, cluster.lease, POLL_PAGE)
                )
            except Exception:
                log_retrying(log, "reading the inbox failed; retrying")
                await asyncio.sleep(1)
                continue
            for message in found:
                if message.id not in self._known:
                    # By its id, as at a start: a claimed turn may have started
                    # elsewhere (a daemon that died, a decided approval).
                    self._dispatch(message, recovered=True)
                    self._count(message)

    def wake(self) -> None:
        """Look for claimable work now (another daemon committed some)."""
        self._claim_now.set()

    def _dispatch(self, message: InboundMessage, *, recovered: bool = False) -> None:
        if self._stopping:  # it stays accepted in the inbox: the next start runs it
            return
        if isinstance(message, DecisionInbound):
            if self.cluster is not None:
                if message.id in self._known:
                    return
                self._known.add(message.id)
            task = asyncio.create_task(self._decide(message), name=f"decision-{message.id}")
            self._tasks.append(task)
            task.add_done_callback(self._forget)
        else:
            self.schedule(message.session_key, message.id if recovered else message)

    def _forget(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)

    # -- sessions -------------------------------------------------------------------------
    # Round-robin: a session with queued turns waits in ``_ready`` until a slot is free,
    # runs one turn, and goes to the back of the line if it has more. So one turn per
    # session is in flight, and a chat's backlog delays another chat by one round of the
    # sessions with work (one turn when only that backlog is there), never by its length.
    def schedule(
        self, session_key: str, inbound: InboundMessage | str, *, first: bool = False
    ) -> None:
        """Queue a turn on its session; ``first``: ahead of the session's queue (a turn
        that arrived earlier and is resumed now)."""
        if self._stopping:
            return
        queue = self._queues.get(session_key)
        if queue is None:
            queue = self._queues[session_key] = collections.deque()
            if session_key not in self._running:
                self._ready.append(session_key)
        if self.cluster is not None:
            self._known.add(inbound if isinstance(inbound, str) else inbound.id)
        if not isinstance(inbound, str) and len(queue) >= KEEP_QUEUED_MESSAGES:
            inbound = inbound.id  # a long backlog holds ids, not whole messages
        if first:
            queue.appendleft(inbound)
        else:
            queue.append(inbound)
        self._start_ready()

    def _start_ready(self) -> None:
        while self._ready and len(self._running) < self._max_concurrent and not self._stopping:
            session_key = self._ready.popleft()
            queue = self._queues[session_key]
            inbound = queue.popleft()
            if not queue:
                del self._queues[session_key]
            self._running[session_key] = asyncio.create_task(
                self._run_turn(session_key, inbound), name=f"session-{session_key}"
            )

    async def _run_turn(self, session_key: str, inbound: InboundMessage | str) -> None:
        inbound_id = inbound if isinstance(inbound, str) else inbound.id
        held, later = False, False
        idle = self._idle.pop(session_key, None)
        if idle is not None:  # held since its last turn: kept
            idle.cancel()
        advanced = False
        try:
            if self.cluster is None:
                held = True
            elif session_key in self._holding and not isinstance(inbound, str):
                # Held since its last turn: one transaction fewer (the take's).
                held = advanced = await self._advance(session_key, inbound, held=True)
            if not held:
                earlier = await self._hold(session_key, inbound_id)
                held = earlier is not None
                # They arrived first: they run first, this one after them (once: a turn
                # put back runs on its next go, whatever is still there).
                if earlier and inbound_id not in self._put_back:
                    later = True
                    self._put_back.add(inbound_id)
                    self._put_first(session_key, [*earlier, inbound])
            if held and not later and not advanced:
                await self._advance(session_key, inbound)
        finally:
            del self._running[session_key]
            if not later:
                self._known.discard(inbound_id)
                self._put_back.discard(inbound_id)
            if session_key in self._queues:
                self._ready.append(session_key)  # its next turn: at the back of the line
            elif held and self.cluster is not None and not self._stopping:
                loop = asyncio.get_running_loop()
                self._idle[session_key] = loop.call_later(IDLE_HOLD, self._idle_over, session_key)
            self._start_ready()

    async def _hold(self, session_key: str, inbound_id: str) -> list[str] | None:
        """Take (or keep) the session's lease to run ``inbound_id``: the session's turns
        that arrived before it and wait (``Cluster.take_session``), or None when another
        live daemon holds the session — then what is queued here for it is dropped: that
        daemon's poll finds it in the inbox."""
        assert self.cluster is not None
        cluster = self.cluster
        earlier = await self._once_the_store_is_back(
            f"session {session_key}", lambda: cluster.take_session(session_key, inbound_id)
        )
        if earlier is not None:
            self._holding.add(session_key)
            return earlier
        self._holding.discard(session_key)
        for queued in self._queues.pop(session_key, ()):
            queued_id = queued if isinstance(queued, str) else queued.id
            self._known.discard(queued_id)
            self._put_back.discard(queued_id)
        with contextlib.suppress(ValueError):
            self._ready.remove(session_key)
        return None

    def _put_first(self, session_key: str, turns: Sequence[InboundMessage | str]) -> None:
        """Queue ``turns`` at the front of the session's queue, in this order, each once
        (one already queued further back moves forward)."""
        ids = {t if isinstance(t, str) else t.id for t in turns}
        queue = self._queues.get(session_key)
        if queue is not None:
            kept = [q for q in queue if (q if isinstance(q, str) else q.id) not in ids]
            queue.clear()
            queue.extend(kept)
        for turn in reversed(turns):
            self.schedule(session_key, turn, first=True)

    def _idle_over(self, session_key: str) -> None:
        self._idle.pop(session_key, None)
        if not self._stopping:
            self._spawn(self._let_go(session_key))

    async def _let_go(self, session_key: str) -> None:
        """Release an idle session's lease (kept while work for it waits in the inbox)."""
        assert self.cluster is not None
        if session_key in self._queues or session_key in self._running:
            return
        self._holding.discard(session_key)
        try:
            await self.cluster.release_session(session_key)
        except Exception:  # it lapses with this daemon, or is taken again on next use
            log_retrying(log, "releasing session %s failed", session_key)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget)

    async def _advance(
        self, session_key: str, inbound: InboundMessage | str, *, held: bool = False
    ) -> bool:
        """Run the turn (``held``: without a take of the session's lease for it, see
        ``_holding``); False when it was not run for want of that take."""
        known = inbound if isinstance(inbound, Inbound) else None
        inbound_id = known.id if known is not None else str(inbound)
        try:
            # Nothing of a failed step was committed and every step is a checkpoint: the
            # turn goes on from the last one once the store is back.
            await self._once_the_store_is_back(
                f"turn {inbound_id}", lambda: self.runner.advance(inbound_id, known, held=held)
            )
        except asyncio.CancelledError:
            raise
        except NotHeldAfterAll:  # nothing of it committed: take the session, then run it
            self._holding.discard(session_key)
            return False
        except LeaseLost as exc:  # the daemon that took the session over goes on with it
            log.warning("turn %s left to another daemon: %s", inbound_id, exc)
            self._holding.discard(session_key)
        except Exception as exc:  # task boundary: record, tell the user, go on
            log.exception("turn %s failed", inbound_id)
            await self._fail(inbound_id, exc)
        return True

    async def _once_the_store_is_back(
        self, what: str, attempt: Callable[[], Awaitable[T]]
    ) -> T | None:
        """``attempt()``, again while the store is away (``store.retry``); None when the
        dispatcher stops meanwhile (the work stays in the inbox for the next start)."""
        return await once_the_store_is_back(what, attempt, lambda: self._stopping, log)

    async def _fail(self, inbound_id: str, exc: Exception) -> None:
        def write(tx: Tx) -> None:
            row = tx.inbox.get(inbound_id)
            if row is None:
                return
            tx.inbox.set_status(inbound_id, InboundStatus.FAILED, f"{type(exc).__name__}: {exc}")
            tx.outbox.add(
                OutboundMessage(
                    to=row.message.answer_to,
                    text="Sorry, something went wrong on my side; the error is in the log.",
                    kind=OutboundKind.REPLY,
                    trace_id=row.message.trace_id,
                    metadata={"inbound_id": inbound_id},
                ),
            )

        try:
            await self.store.run(write)
        except Exception:  # the row stays unfinished: the next start takes it up again
            log_retrying(log, "recording that turn %s failed did not commit", inbound_id)

    # -- approvals ------------------------------------------------------------------------
    async def _decide(self, message: DecisionInbound) -> None:
        """Apply a decision (``approvals.Decisions``: it resumes the turns it lets go on)."""
        try:
            held = await self.decisions.decide(message)
        finally:
            self._known.discard(message.id)
        if held:  # the session's lease, taken for the decision: let go once idle
            await self._let_go(message.session_key)

    def _resume(self, turn_ids: list[str]) -> None:
        for turn_id in turn_ids:
            task = asyncio.create_task(self._resume_one(turn_id))
            self._tasks.append(task)
            task.add_done_callback(self._forget)

    async def _resume_one(self, turn_id: str) -> None:
        row = await self._once_the_store_is_back(
            f"resuming turn {turn_id}", lambda: self.store.run(lambda tx: tx.inbox.get(turn_id))
        )
        if row is not None and not row.status.terminal:
            # It arrived before what its session queued meanwhile: it goes first.
            self.schedule(row.message.session_key, turn_id, first=True)
