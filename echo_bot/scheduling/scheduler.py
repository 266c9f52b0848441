"""Reminders and cron jobs on time — also after downtime, and never twice.

The store is the source of truth; APScheduler (AsyncIOScheduler, memory job store) is
only the timer, rebuilt from the store at start and set or cleared whenever a committed
transaction announces ``ReminderChanged``. Its own misfire handling would drop late
one-shots silently, so jobs run with ``misfire_grace_time=None`` and lateness, grace and
coalescing are decided here, from the store. A fired reminder's message is queued with
``tx.outbox.add`` in the transaction that marks it fired; the delivery worker hears of
it from the store (``OutboundCommitted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from .. import metrics
from ..bus import Bus
from ..config import Config, CronJob
from ..dates import day_text, zone_of
from ..events import (
    Address,
    InboundMessage,
    MessageInbound,
    OutboundKind,
    OutboundMessage,
    Sender,
    ToolCallInbound,
    ToolCallRequest,
)
from ..logs import log_retrying
from ..statuses import ReminderStatus
from ..store import ReminderChanged, Store, Tx
from ..store.reminders import ReminderRow
from .crontab import cron_trigger, next_after
from .timeparse import describe_lateness

if TYPE_CHECKING:  # APScheduler ships no types: this names the class for readers
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

log = logging.getLogger(__name__)

LATE_NOTE_AFTER = 60.0  # seconds late before a reminder says so


class Scheduler:
    def __init__(
        self,
        store: Store,
        bus: Bus,
        *,
        cron_jobs: list[CronJob],
        timezone: str,
        grace: timedelta,
        clock: Callable[[], float] = time.time,
        resync: float | None = None,
    ) -> None:
        self.store = store
        # With several daemons on one store, a reminder set through another one is only
        # in the store: every ``resync`` seconds the timers are set again from it (each
        # occurrence still fires once: the fire marker decides).
        self.resync = resync
        self._resync_now = asyncio.Event()
        self.bus = bus
        self.cron_jobs = {job.name: job for job in cron_jobs}
        self.timezone = timezone
        self.grace = grace.total_seconds()
        self.clock = clock
        self._aps: AsyncIOScheduler | None = None  # made at start (APScheduler is lazy)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.healthy = True

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        self._aps = AsyncIOScheduler(timezone=UTC)
        self._aps.start()
        self.store.subscribe(ReminderChanged, self._changed)
        for row in await self.store.run(lambda tx: tx.reminders.active()):
            await self._arm(row)
        for job in self.cron_jobs.values():
            await self._start_cron(job)
        if self.resync is not None:
            self._spawn(self._resync_loop(self.resync))

    def wake(self) -> None:
        """Another daemon changed a reminder: set the timers from the store now."""
        self._resync_now.set()

    async def _resync_loop(self, every: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._resync_now.wait()
            self._resync_now.clear()
            if self._aps is None:
                continue
            before = self._armed()
            try:
                rows = await self.store.run(lambda tx: tx.reminders.active())
            except Exception:
                log_retrying(log, "reading the reminders failed; retrying")
                continue
            if self._aps is None:
                continue
            # Each reminder timer's occurrence: one changed through another daemon
            # (snoozed, moved earlier) is set again, one cancelled there is cleared. A
            # timer this daemon set or cleared while the read ran is newer than the read:
            # it is left as it is.
            now = self._armed()
            active = {f"reminder:{row.id}" for row in rows}
            for job_id in before.keys() - active:
                if now.get(job_id) == before[job_id]:
                    self._remove(job_id)
            for row in rows:
                job_id = f"reminder:{row.id}"
                if now.get(job_id) == before.get(job_id) != row.next_at:
                    await self._arm(row)

    def _armed(self) -> dict[str, float]:
        """The occurrence each reminder timer is set for, by job id."""
        if self._aps is None:
            return {}
        return {j.id: j.args[1] for j in self._aps.get_jobs() if j.id.startswith("reminder:")}

    async def stop(self) -> None:
        self.store.unsubscribe(ReminderChanged, self._changed)
        if self._aps is not None:
            self._aps.shutdown(wait=False)
            self._aps = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def health(self) -> dict[str, object]:
        jobs = len(self._aps.get_jobs()) if self._aps is not None else 0
        return {"status": "ok" if self.healthy else "degraded", "timers": jobs}

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reminders ------------------------------------------------------------------------
    def _changed(self, event: ReminderChanged) -> None:
        if self._aps is not None:  # a stopped scheduler sets no timers
            self.reschedule(event.reminder_id)

    def reschedule(self, reminder_id: str) -> None:
        """The store changed for ``reminder_id``: set or clear its timer."""

        async def load() -> None:
            row = await self.store.run(lambda tx: tx.reminders.get(reminder_id))
            if row is None or row.status != ReminderStatus.ACTIVE:
                self._remove(f"reminder:{reminder_id}")
            else:
                await self._arm(row)

        self._spawn(load())

    def _remove(self, job_id: str) -> None:
        if self._aps is not None and self._aps.get_job(job_id) is not None:
            self._aps.remove_job(job_id)

    async def _arm(self, row: ReminderRow) -> None:
        if row.next_at <= self.clock():
            await self.fire_reminder(row.id, row.next_at)  # due (or overdue) now
            return
        if self._aps is None:  # stopped meanwhile: the store keeps it for the next start
            return
        from apscheduler.triggers.date import DateTrigger

        self._aps.add_job(
            self.fire_reminder,
            trigger=DateTrigger(run_date=datetime.fromtimestamp(row.next_at, UTC)),
            args=[row.id, row.next_at],
            id=f"reminder:{row.id}",
            replace_existing=True,
            misfire_grace_time=None,
        )

    async def fire_reminder(self, reminder_id: str, occurrence: float) -> None:
        """Deliver one occurrence (at most once), late-marked or as missed past grace."""
        try:
            following = await self.store.run(lambda tx: self._fire(tx, reminder_id, occurrence))
        except Exception:
            log_retrying(log, "reminder %s could not fire; retrying in 5 s", reminder_id)
            self.healthy = False
            await asyncio.sleep(5)
            self.reschedule(reminder_id)
            return
        self.healthy = True
        if following is not None:
            self.reschedule(reminder_id)

    def _fire(self, tx: Tx, reminder_id: str, occurrence: float) -> float | None:
        row = tx.reminders.get(reminder_id)
        if row is None or row.status != ReminderStatus.ACTIVE or row.next_at != occurrence:
            return None
        now = self.clock()
        zone = zone_of(row.timezone) or ZoneInfo("UTC")
        due_at = occurrence
        if row.recurrence is not None:
            # Several missed runs fire once (coalesced), judged by the latest of them.
            due_at = self._latest_due(row.recurrence, zone, occurrence, now)
        late = now - due_at
        missed = late > self.grace
        if not tx.reminders.mark_fired(
            row, occurrence, late_by=late, outcome="missed" if missed else "sent"
        ):
            return None
        tx.on_commit(partial(metrics.REMINDER_LAG.observe, max(0.0, late)))
        due = datetime.fromtimestamp(due_at, zone)
        if missed:
            text = (
                f"⏰ Missed reminder (it was due {day_text(due, year=False)} {due:%H:%M} "
                f"{row.timezone}; I was offline for too long to deliver it on time): {row.text}"
            )
        elif late > LATE_NOTE_AFTER:
            text = f"⏰ {row.text} (late by {describe_lateness(late)} — I was offline)"
        else:
            text = f"⏰ {row.text}"
        tx.outbox.add(
            OutboundMessage(
                to=Address.parse(row.chat),
                text=text,
                kind=OutboundKind.REMINDER,
                trace_id=row.trace_id,
                metadata={"reminder_id": row.id, "occurrence": occurrence, "late_by": late},
            ),
        )
        if row.recurrence is None:
            tx.reminders.set_status(
                row.id, ReminderStatus.MISSED if missed else ReminderStatus.DONE
            )
            return None
        # Coalesce: however many runs were missed, the next one is computed from now.
        nxt = next_after(row.recurrence, zone, datetime.fromtimestamp(max(now, occurrence), zone))
        if nxt is None:
            tx.reminders.set_status(row.id, ReminderStatus.DONE)
            return None
        tx.reminders.advance(row.id, nxt.timestamp())
        return nxt.timestamp()

    def _latest_due(self, expression: str, zone: ZoneInfo, occurrence: float, now: float) -> float:
        """The latest run of ``expression`` from ``occurrence`` up to ``now``; only runs
        within the grace are looked at (bounded, as for cron jobs)."""
        latest = occurrence
        start = max(occurrence, now - self.grace)
        moment = datetime.fromtimestamp(start, zone)
        if start > occurrence:
            moment -= timedelta(microseconds=1)  # a run exactly at the grace edge counts
        for _ in range(10_000):
            nxt = next_after(expression, zone, moment)
            if nxt is None or nxt.timestamp() > now:
                break
            latest, moment = nxt.timestamp(), nxt
        return latest

    # -- cron jobs ------------------------------------------------------------------------
    def _zone(self, job: CronJob) -> ZoneInfo:
        return ZoneInfo(job.timezone or self.timezone)

    async def _start_cron(self, job: CronJob) -> None:
        zone = self._zone(job)
        now = datetime.fromtimestamp(self.clock(), zone)
        last = await self.store.run(lambda tx: tx.reminders.cron_last(job.name))
        if last is None:
            await self.store.run(lambda tx: tx.reminders.set_cron_last(job.name, now.timestamp()))
        else:
            # Only runs within the grace matter; several missed ones run once (coalesced).
            window = max(last, now.timestamp() - self.grace)
            missed = self._latest_between(job, zone, window, now)
            if missed is not None:
                log.info("cron %s: running a missed occurrence (coalesced)", job.name)
                await self.run_cron(job.name, missed)
        if self._aps is None:  # stopped meanwhile
            return
        self._aps.add_job(
            self._cron_tick,
            trigger=cron_trigger(job.schedule, zone),
            args=[job.name],
            id=f"cron:{job.name}",
            replace_existing=True,
            misfire_grace_time=None,
            coalesce=True,
        )

    def reload(self, config: Config) -> list[str]:
        """Take the reloaded config's cron jobs, when they changed."""
        if list(self.cron_jobs.values()) != config.cron:
            self.reload_cron(config.cron)
        return []

    def reload_cron(self, jobs: list[CronJob]) -> None:
        """Replace the cron jobs live (from a reloaded config); no catch-up for new ones."""
        for name in set(self.cron_jobs) - {job.name for job in jobs}:
            self._remove(f"cron:{name}")
        self.cron_jobs = {job.name: job for job in jobs}
        if self._aps is None:  # not running: start() arms cron_jobs
            return
        for job in jobs:
            self._aps.add_job(
                self._cron_tick,
                trigger=cron_trigger(job.schedule, self._zone(job)),
                args=[job.name],
                id=f"cron:{job.name}",
                replace_existing=True,
                misfire_grace_time=None,
                coalesce=True,
            )

    def _latest_between(
        self, job: CronJob, zone: ZoneInfo, after: float, now: datetime
    ) -> float | None:
        latest = None
        moment = datetime.fromtimestamp(after, zone)
        for _ in range(10_000):  # bounded: at most this many missed runs are looked at
            nxt = next_after(job.schedule, zone, moment)
            if nxt is None or nxt > now:
                break
            latest, moment = nxt.timestamp(), nxt
        return latest

    async def _cron_tick(self, name: str) -> None:
        # Cron has minute resolution: the occurrence is this minute.
        now = datetime.fromtimestamp(self.clock(), self._zone(self.cron_jobs[name]))
        await self.run_cron(name, now.replace(second=0, microsecond=0).timestamp())

    async def run_cron(self, name: str, occurrence: float) -> None:
        """Publish one occurrence of a job; the inbox's dedup makes it at most once."""
        job = self.cron_jobs[name]
        deliver_to = Address.parse(job.deliver_to)
        common: dict[str, Any] = {
            "address": Address(channel="cron", chat_id=job.name),
            "sender": Sender(id=f"cron:{job.name}", name=f"cron job {job.name}"),
            "external_id": f"{job.name}@{int(occurrence)}",
            "deliver_to": deliver_to,
            "metadata": {"cron_job": job.name, "occurrence": occurrence},
        }
        message: InboundMessage
        if job.prompt is not None:
            message = MessageInbound(text=job.prompt, **common)
        else:
            assert job.tool is not None
            message = ToolCallInbound(
                tool_call=ToolCallRequest(tool=job.tool, args=job.args),
                **common,
            )
        try:
            await self.bus.publish(message)
            await self.store.run(lambda tx: tx.reminders.set_cron_last(job.name, occurrence))
        except Exception:
            log.exception("cron %s: could not queue its run", job.name)
            self.healthy = False
