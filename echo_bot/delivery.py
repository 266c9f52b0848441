"""The outbox worker: delivers each chat's messages in order, retries with backoff,
and never drops one silently (after the last attempt it is marked failed and logged).

Messages for channels that are not running (say, the terminal while the daemon runs
under systemd) stay queued until that channel starts. Whatever queues a message, the
store's ``OutboundCommitted`` event wakes the worker after the commit.

With several daemons on one store, each channel's outbox is sent by one daemon at a
time: the holder of ``delivery:<channel>``, a lease only the daemons running that
channel try to take. A channel that one daemon alone runs (the terminal of `echo-bot
chat`, or a channel configured on one machine only) is therefore delivered by that
daemon, whichever daemon ran the turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from . import metrics
from .bus import Channel, delivery_lease
from .cluster import BEAT, Cluster
from .errors import ChannelError, StoreError
from .events import OutboundMessage
from .logs import log_retrying
from .secrets import Masker
from .statuses import OutboxStatus
from .store import OutboundCommitted, Store, Tx, once_the_store_is_back
from .store.outbox import OutboxRow

OUTGOING = "outgoing"  # the state directory's folder of files waiting to be sent
T = TypeVar("T")

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
# Seconds between tries of a chat's next message while its channel says its peer cannot
# be reached (health not "ok"): such tries are not counted as attempts.
AWAY_RETRY = 5.0
SEND_TIMEOUT = 60.0
# The longest wait a network's "retry after" is taken for (Telegram's flood waits run to
# hours); a longer one is cut to it.
MAX_RETRY_AFTER = 86_400.0
IDLE_WAIT = 1.0
MAX_AWAY_KEPT = 10_000  # messages whose first failure while away is remembered
DUE_PAGE = 100  # chats' heads read at one look


def backoff(attempts: int) -> float:
    return float(min(300, 2 ** max(0, attempts)))


def retry_delay(retry_after: float | None, attempts: int) -> float:
    """Seconds before the next attempt: the network's ``retry_after`` (its own answer:
    broken or hostile ones exist) within 1 s and ``MAX_RETRY_AFTER``, the backoff when
    it gave none or no number (NaN, infinite)."""
    if retry_after is None or not math.isfinite(retry_after):
        return backoff(attempts)
    return min(max(retry_after, 1.0), MAX_RETRY_AFTER)


class DeliveryWorker:
    def __init__(
        self,
        *,
        store: Store,
        clock: Callable[[], float] = time.time,
        max_attempts: int = MAX_ATTEMPTS,
        masker: Masker | None = None,
        cluster: Cluster | None = None,
        sending: Callable[[OutboundMessage], None] = lambda message: None,
    ) -> None:
        self.store = store
        self.sending = sending  # told of each send as it starts (the chat stops "typing")
        # Every text a chat receives leaves through here: the last place to mask a
        # secret that reached a notice, a prompt or a reply some other way.
        self.masker = masker or Masker()
        self.clock = clock
        self.max_attempts = max_attempts
        self.channels: dict[str, Channel] = {}
        self._wake = asyncio.Event()
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        # Whether a chat has more to send after its send in flight, known without asking
        # the store: what was queued behind it when it was read (OutboxRow.behind), and
        # the chats whose outbound was committed since (``_queued``).
        self._more: set[str] = set()  # chats in flight with more queued behind
        self._fresh: set[str] = set()  # chats queued to since the current look began
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # With several daemons on one store, a channel's outbox is sent only by the
        # daemon holding its delivery lease (each chat's order and Telegram's limits
        # hold for the whole cluster); the others that run the channel keep trying to
        # take it, and take over when its holder is gone. Per channel, each lease is
        # trusted until a little before another daemon could take it over.
        self.cluster = cluster
        self._sending_until: dict[str, float] = {}
        self._lease_wake = asyncio.Event()
        self._lease_task: asyncio.Task[None] | None = None
        self._elsewhere: set[str] = set()  # channels whose lease another daemon holds
        self._finishing: set[str] = set()  # channels stopping: their lease kept meanwhile
        # When each channel last delivered, and when each message began failing while
        # its channel said it was away (``_away_for``).
        self._sent_at: dict[str, float] = {}
        self._away_since: dict[str, float] = {}
        self.delivered = 0
        # Looks for due messages begun, and those that have come back (a look that reads
        # nothing still counts): how often the worker reads its queue.
        self.looks = 0
        self.looked = 0
        store.subscribe(OutboundCommitted, self._queued)  # every commit that queued outbound

    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel
        self._lease_wake.set()  # its lease is taken now, not at the next beat
        self.wake()

    def remove_channel(self, name: str) -> None:
        """The channel takes nothing more in this run (a terminal whose output closed):
        its messages stay queued, as for a channel that is not running, attempts and
        all, until it is added again (the next start). On a shared store its delivery
        lease is let go, so a daemon that still runs it takes it over."""
        self.channels.pop(name, None)
        self._lease_wake.set()

    async def release(self, name: str, grace: float = 5.0) -> None:
        """The channel is about to stop: nothing more is handed to it, and the sends in
        flight to it may finish first (bounded by ``grace``). A send the channel's own
        stop cut off would be an attempt that failed after it reached the network's
        server, and be sent again at the next start. Its delivery lease is held until
        then: let go at once, another daemon would send what is still in flight here."""
        self.channels.pop(name, None)
        pending = [t for key, t in self._in_flight.items() if key.startswith(f"{name}:")]
        if pending:
            self._finishing.add(name)
            try:
                await asyncio.wait(pending, timeout=grace)
            finally:
                self._finishing.discard(name)
        self._lease_wake.set()

    def wake(self, *_: object) -> None:
        self._wake.set()

    def _queued(self, event: OutboundCommitted) -> None:
        if event.head is not None and self._send_now(event.head):
            return  # nothing else of its chat is queued: no need to look
        for chat in event.chat_keys:
            self._fresh.add(chat)
            if chat in self._in_flight:
                self._more.add(chat)
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="delivery")
        if self.cluster is not None:
            self._lease_task = asyncio.create_task(
                self._keep_lease(self.cluster), name="delivery-lease"
            )

    async def _keep_lease(self, cluster: Cluster) -> None:
        while True:
            self._lease_wake.clear()
            names = sorted(set(self.channels) | self._finishing)
            leases = [delivery_lease(name) for name in names]
            # Taken before the statement: trusted no longer than from then.
            until = time.monotonic() + cluster.lease - BEAT - 2.0
            try:
                taken = await cluster.take_all(leases) if leases else {}
            except Exception:
                log_retrying(log, "taking the delivery leases failed")
                taken = {}
            for name, lease in zip(names, leases, strict=True):
                if taken.get(lease):
                    if not self._may_send(name):
                        log.info("this daemon (%s) delivers the %s outbox now", cluster.label, name)
                        self._wake.set()
                    self._sending_until[name] = until
                    self._elsewhere.discard(name)
                else:
                    self._sending_until.pop(name, None)
                    if lease in taken and name not in self._elsewhere:
                        self._elsewhere.add(name)
                        # Expected for a shared channel; for one reachable only from
                        # here (the terminal) it means another daemon has one open too.
                        local = getattr(self.channels.get(name), "local", False)
                        log.log(
                            logging.WARNING if local else logging.INFO,
                            "another echo-bot on this database delivers the %s channel's"
                            " messages while it runs: they are sent there, not here",
                            name,
                        )
            for name in set(self._sending_until) - set(names):  # a channel that left
                self._sending_until.pop(name, None)
                try:
                    await cluster.release(delivery_lease(name))
                except Exception:
                    log_retrying(log, "letting a delivery lease go failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BEAT):
                    await self._lease_wake.wait()

    def _may_send(self, channel: str) -> bool:
        if self.cluster is None:
            return True
        return time.monotonic() < self._sending_until.get(channel, 0.0)

    def _sendable(self) -> list[str]:
        """The running channels whose outbox this daemon sends now."""
        return [name for name in self.channels if self._may_send(name)]

    async def stop(self, grace: float = 5.0) -> None:
        """Let sends in flight finish (bounded), then stop."""
        self._stopping = True
        for task in (self._task, self._lease_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        pending = list(self._in_flight.values())
        if pending:
            _done, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def idle(self, chat_key: str) -> bool:
        """True when nothing is queued or in flight for ``chat_key``."""
        if chat_key in self._in_flight:
            return False
        return await self.store.run(lambda tx: tx.outbox.pending_count(chat_key)) == 0

    def _send_now(self, row: OutboxRow) -> bool:
        """Start sending ``row`` (just committed, nothing queued ahead of it in its chat)
        without reading the outbox; False when this worker cannot send it now."""
        key = str(row.message.to)
        if (
            self._stopping
            or self._task is None
            or key in self._in_flight
            or row.message.to.channel not in self.channels
            or not self._may_send(row.message.to.channel)
        ):
            return False
        # Registered before any look resumes: a look that read this row skips its chat.
        self._in_flight[key] = asyncio.create_task(self._deliver(row), name=f"deliver-{key}")
        return True

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            # Outbound committed from here on may be missing from the look below.
            self._fresh.clear()
            # None while another daemon sends every channel run here (the lease task
            # wakes this loop when one is taken): the look is then empty, no read.
            sendable = self._sendable()
            try:
                # Chats with a send in flight are left out: their next message waits for
                # it, and the send wakes this loop when it is done. Counting their heads
                # as due would spin this loop for as long as a send takes.
                rows, next_at = await self._due(sendable, self.clock(), busy=self._in_flight)
            except Exception:
                log_retrying(log, "reading the outbox failed; retrying")
                rows, next_at = [], None
            for row in rows:
                key = str(row.message.to)
                if key not in self._in_flight:
                    if row.behind or key in self._fresh:
                        self._more.add(key)
                    task = asyncio.create_task(self._deliver(row), name=f"deliver-{key}")
                    self._in_flight[key] = task
            wait = (
                IDLE_WAIT if next_at is None else max(0.0, min(IDLE_WAIT, next_at - self.clock()))
            )
            # Not wait_for(): on Python 3.11 it can swallow a cancel that lands while
            # the wake-up completes, and stop() would wait for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _due(
        self, channels: Iterable[str], now: float, busy: Iterable[str]
    ) -> tuple[list[OutboxRow], float | None]:
        """The head of each chat's queue whose next attempt is due, and when the next
        message of any other chat is due — both from one read, leaving out the ``busy``
        chats (chat keys with a send in flight: their head is that send)."""
        names, skip = sorted(set(channels)), sorted(set(busy))
        self.looks += 1
        try:
            if not names:
                return [], None
            return await self.store.run(lambda tx: tx.outbox.due(names, now, DUE_PAGE, skip))
        finally:
            self.looked += 1

    async def _deliver(self, row: OutboxRow) -> None:
        message = row.message
        key = str(message.to)
        # The loop looks again when this chat may have more to send (the next message
        # waited behind this one) or this one is still queued (a retry).
        look_again = True
        try:
            channel = self.channels.get(message.to.channel)
            if channel is None:  # removed since this row was read: it stays queued
                look_again = False
                return
            masked = self.masker.mask(message.text)
            if masked != message.text:
                message = message.model_copy(update={"text": masked})
            if message.edit_of:
                edit_of = message.edit_of
                target = await self._stored("the receipt of the message to edit",
                                            lambda tx: tx.outbox.receipt_of(edit_of))  # fmt: skip
                if self._stopping:  # not read before the stop: it stays queued
                    look_again = False
                    return
                message = message.model_copy(update={"edit_message_id": target})
            self.sending(message)
            try:
                receipt = await asyncio.wait_for(channel.send(message), SEND_TIMEOUT)
            except ChannelError as exc:
                if self.channels.get(channel.name) is not channel:
                    # The channel left while sending: not an attempt; it stays queued.
                    note, left = str(exc), row.message.id
                    await self._stored("its error", lambda tx: tx.outbox.note_error(left, note))
                    return
                await self._failed_attempt(row, str(exc), exc.retryable, exc.retry_after)
            except TimeoutError:
                await self._failed_attempt(row, "send timed out", True, None)
            except Exception as exc:
                log.exception("channel %s raised while sending %s", channel.name, message.id)
                await self._failed_attempt(row, f"{type(exc).__name__}: {exc}", True, None)
            else:
                sent = message
                self._sent_at[channel.name] = time.monotonic()
                self._away_since.pop(sent.id, None)
                await self._stored(f"outbound {sent.id} sent",
                                   lambda tx: tx.outbox.mark_sent(sent, receipt))  # fmt: skip
                await _discard_copy(message)
                look_again = key in self._more
                self.delivered += 1
                metrics.OUTBOUND.labels(message.to.channel, OutboxStatus.SENT).inc()
        finally:
            self._in_flight.pop(key, None)
            self._more.discard(key)
            if look_again:
                self.wake()

    async def _failed_attempt(
        self, row: OutboxRow, error: str, retryable: bool, retry_after: float | None
    ) -> None:
        if retryable and retry_after is None and self._away_for(row.message):
            # The channel cannot reach its network (it says so on /healthz): the message
            # waits for it however long that lasts, instead of running out of attempts
            # during an outage. Tried again every AWAY_RETRY, not counted.
            retry_at = self.clock() + AWAY_RETRY
            await self._stored(
                "a try",
                lambda tx: tx.outbox.mark_retry(row.message.id, error, retry_at, counted=False),
            )
            log.debug("outbound %s to %s waits for its channel: %s", row.message.id,
                      row.message.to, error)  # fmt: skip
            return
        attempts = row.attempts + 1
        if not retryable or attempts >= self.max_attempts:
            self._away_since.pop(row.message.id, None)
            metrics.OUTBOUND.labels(row.message.to.channel, OutboxStatus.FAILED).inc()
            await self._stored(f"outbound {row.message.id} failed",
                               lambda tx: tx.outbox.mark_failed(row.message.id, error))  # fmt: skip
            await _discard_copy(row.message)
            log.error(
                "outbound %s to %s failed after %d attempt(s): %s",
                row.message.id,
                row.message.to,
                attempts,
                error,
            )
            return
        metrics.OUTBOUND.labels(row.message.to.channel, "retry").inc()
        delay = retry_delay(retry_after, attempts)
        retry_at = self.clock() + delay
        await self._stored(
            "an attempt", lambda tx: tx.outbox.mark_retry(row.message.id, error, retry_at)
        )
        log.warning(
            "outbound %s to %s: attempt %d failed (%s); retrying in %.0f s",
            row.message.id,
            row.message.to,
            attempts,
            error,
            delay,
        )

    async def _stored(self, what: str, work: Callable[[Tx], T]) -> T | None:
        """``work`` done in the store, tried again while the store fails, the chat held
        meanwhile (its send stays in flight): a send left unrecorded would be due again
        at once — a message that went out sent twice, a failed attempt tried again
        unpaused and uncounted. None when the worker stops first: the next start finds
        the row as it was (as after a crash)."""
        return await once_the_store_is_back(
            f"delivery: recording {what}", lambda: self.store.run(work),
            lambda: self._stopping, log, retried=StoreError,
        )  # fmt: skip

    def _away_for(self, message: OutboundMessage) -> bool:
        """Whether ``message``'s failure is its channel's being away: the channel says so,
        and has taken no other message since this one began failing so. A network that
        took others meanwhile is there: this one's failures are its own (a payload its
        server keeps answering 5xx) and count, or it would hold its chat for ever."""
        name = message.to.channel
        if not self._peer_away(name):
            return False
        if len(self._away_since) >= MAX_AWAY_KEPT and message.id not in self._away_since:
            self._away_since.clear()  # the messages of a channel removed meanwhile
        since = self._away_since.setdefault(message.id, time.monotonic())
        return self._sent_at.get(name, float("-inf")) <= since

    def _peer_away(self, name: str) -> bool:
        channel = self.channels.get(name)
        if channel is None:
            return False
        try:
            return channel.health().get("status") not in ("ok", None)
        except Exception:  # a health check that fails says nothing about the peer
            return False


async def _discard_copy(message: OutboundMessage) -> None:
    """A sent file's copy (``send_file`` made it for this message) is not needed once
    the message is delivered or has failed."""
    if message.file is not None:
        path = Path(message.file.path)
        if path.parent.name == OUTGOING:  # only ever a copy of ours
            await asyncio.to_thread(path.unlink, missing_ok=True)
