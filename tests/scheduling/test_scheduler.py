"""The scheduler on a controlled clock: lateness, the grace boundary, at-most-once firing,
coalescing, daylight saving time and cron jobs — read back from the real SQLite outbox
and inbox. Config errors and a cron job end to end run through the real core.

The fake clock is set in 2032 (a leap year): APScheduler's real timers, which run on the
wall clock, then never fire during a test, and the cron jobs here run only on 29 February.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from echo_bot.bus import Bus
from echo_bot.config import CronJob
from echo_bot.events import (
    Address,
    InboundMessage,
    MessageInbound,
    OutboundMessage,
    ToolCallInbound,
)
from echo_bot.scheduling.crontab import cron_trigger, next_after
from echo_bot.scheduling.reminders import ReminderService
from echo_bot.scheduling.scheduler import Scheduler
from echo_bot.secrets import Masker
from echo_bot.statuses import ReminderStatus
from echo_bot.store import (
    BusQueues,
    Database,
    Engine,
    OutboundCommitted,
    ReminderChanged,
    Store,
)
from echo_bot.store import reminders as reminder_store
from tests.conftest import inbound_of, run_echo_bot, running_bot
from tests.waiting import eventually

CHAT = Address(channel="cli", chat_id="local")
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
NIGHT_BEFORE = datetime(2032, 11, 6, 23, 0, tzinfo=NEW_YORK)  # the clocks go back at 2:00
START = datetime(2032, 2, 29, 8, 0, tzinfo=UTC)  # Sunday 29 February 2032, 08:00 UTC


class Clock:
    def __init__(self, moment: datetime) -> None:
        self.now = moment.timestamp()

    def __call__(self) -> float:
        return self.now

    def set(self, moment: datetime | float) -> None:
        self.now = moment if isinstance(moment, float) else moment.timestamp()

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta).total_seconds()


@dataclass
class Parts:
    store: Store
    bus: Bus
    clock: Clock
    service: ReminderService
    schedulers: list[Scheduler] = field(default_factory=list)

    @property
    def db(self) -> Engine:
        return self.store.database

    def scheduler(
        self, cron_jobs: list[CronJob] | None = None, grace: timedelta = timedelta(hours=24)
    ) -> Scheduler:
        scheduler = Scheduler(
            self.store,
            self.bus,
            cron_jobs=cron_jobs or [],
            timezone="UTC",
            grace=grace,
            clock=self.clock,
        )
        self.schedulers.append(scheduler)
        return scheduler

    async def create(self, text: str, **kwargs: Any) -> reminder_store.ReminderRow:
        outcome = await self.service.create(CHAT, "owner", text, **kwargs)
        assert outcome.ok, outcome.message
        assert outcome.reminder is not None
        return outcome.reminder

    async def reminder(self, reminder_id: str) -> reminder_store.ReminderRow:
        row = await self.store.run(lambda tx: tx.reminders.get(reminder_id))
        assert row is not None
        return row

    async def outbox(self) -> list[OutboundMessage]:
        return [d.message for d in await self.store.run(lambda tx: tx.outbox.deliveries())]

    async def inbox(self) -> list[InboundMessage]:
        """What the scheduler published: the inbound of its cron jobs."""
        return await self.store.run(lambda tx: inbound_of(tx, "cron"))


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    db = Database(tmp_path / "s.sqlite3")
    store = Store(db, Masker())
    await store.open()
    clock = Clock(START)
    service = ReminderService(store, timezone="UTC", languages=["en"], max_active=100, clock=clock)
    made = Parts(
        store=store, bus=Bus(BusQueues(store), BusQueues(store)), clock=clock, service=service
    )
    try:
        yield made
    finally:
        for scheduler in made.schedulers:
            await scheduler.stop()
        await store.close()


async def settle(scheduler: Scheduler) -> None:
    """Wait for the re-arming the scheduler does in the background after a fire."""
    while scheduler._tasks:
        await asyncio.gather(*list(scheduler._tasks))


# -- one-shot reminders: on time, late, missed --------------------------------------------
async def test_on_time_reminder_has_no_late_note(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    assert row.next_at == (START + timedelta(minutes=10)).timestamp()
    parts.clock.advance(minutes=10)
    await parts.scheduler().fire_reminder(row.id, row.next_at)
    [sent] = await parts.outbox()
    assert sent.text == "⏰ tea"
    assert sent.kind == "reminder"
    assert sent.to == CHAT
    assert sent.metadata["reminder_id"] == row.id
    assert (await parts.reminder(row.id)).status == "done"


async def test_late_within_grace_says_by_how_much(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    parts.clock.set(row.next_at + 2 * 3600 + 13 * 60)
    await parts.scheduler().fire_reminder(row.id, row.next_at)
    [sent] = await parts.outbox()
    assert sent.text == "⏰ tea (late by 2 h 13 min — I was offline)"
    assert (await parts.reminder(row.id)).status == "done"


async def test_past_the_grace_it_is_reported_missed_once(parts: Parts) -> None:
    row = await parts.create("call the bank", when="in 10 minutes")
    parts.clock.set(row.next_at + 24 * 3600 + 1)
    scheduler = parts.scheduler()
    await scheduler.fire_reminder(row.id, row.next_at)
    await scheduler.fire_reminder(row.id, row.next_at)
    [sent] = await parts.outbox()
    assert sent.text.startswith("⏰ Missed reminder")
    assert "Sunday 29 February 08:10 UTC" in sent.text  # when it was due
    assert sent.text.endswith(": call the bank")
    assert (await parts.reminder(row.id)).status == "missed"
    assert await parts.store.run(lambda tx: tx.reminders.fire_outcomes()) == ["missed"]


async def test_exactly_at_the_grace_boundary_it_is_still_delivered(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    parts.clock.set(row.next_at + 24 * 3600)
    await parts.scheduler().fire_reminder(row.id, row.next_at)
    [sent] = await parts.outbox()
    assert sent.text == "⏰ tea (late by 1 d — I was offline)"
    assert (await parts.reminder(row.id)).status == "done"


async def test_a_shorter_configured_grace_is_honoured(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    parts.clock.set(row.next_at + 3601)
    await parts.scheduler(grace=timedelta(hours=1)).fire_reminder(row.id, row.next_at)
    [sent] = await parts.outbox()
    assert sent.text.startswith("⏰ Missed reminder")


async def test_an_occurrence_fires_at_most_once(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    parts.clock.advance(minutes=11)
    first, second = parts.scheduler(), parts.scheduler()
    await asyncio.gather(
        first.fire_reminder(row.id, row.next_at), second.fire_reminder(row.id, row.next_at)
    )
    await first.fire_reminder(row.id, row.next_at)
    assert [m.text for m in await parts.outbox()] == ["⏰ tea"]


async def test_the_fire_marker_holds_even_if_the_status_was_not_updated(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    parts.clock.advance(minutes=10)
    scheduler = parts.scheduler()
    await scheduler.fire_reminder(row.id, row.next_at)
    # As if the process had died between the fire marker and the status change:
    await parts.db.run(
        lambda db: db.execute("UPDATE reminders SET status = 'active' WHERE id = ?", [row.id])
    )
    await scheduler.fire_reminder(row.id, row.next_at)
    assert len(await parts.outbox()) == 1


async def test_overdue_reminder_is_delivered_at_start_and_only_once(parts: Parts) -> None:
    await parts.create("stretch", when="in 10 minutes")
    parts.clock.advance(hours=2, minutes=23)  # down from 08:00 to 10:23; due 08:10
    first = parts.scheduler()
    await first.start()
    await first.stop()
    second = parts.scheduler()  # a restart
    await second.start()
    await second.stop()
    assert [m.text for m in await parts.outbox()] == [
        "⏰ stretch (late by 2 h 13 min — I was offline)"
    ]


async def test_a_reminder_not_yet_due_is_not_delivered_at_start(parts: Parts) -> None:
    row = await parts.create("later", when="in 10 minutes")
    scheduler = parts.scheduler()
    await scheduler.start()
    await settle(scheduler)
    assert await parts.outbox() == []
    assert (await parts.reminder(row.id)).status == "active"


async def test_a_cancelled_reminder_never_fires(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    cancelled = await parts.service.cancel(CHAT, row.id)
    assert cancelled.ok
    parts.clock.advance(minutes=10)
    scheduler = parts.scheduler()
    await scheduler.start()
    await scheduler.fire_reminder(row.id, row.next_at)
    assert await parts.outbox() == []


# -- what the store announces ------------------------------------------------------------
def timers(scheduler: Scheduler) -> set[str]:
    assert scheduler._aps is not None
    return {job.id for job in scheduler._aps.get_jobs()}


async def test_a_reminder_made_while_running_gets_its_timer_from_the_commit(
    parts: Parts,
) -> None:
    scheduler = parts.scheduler()
    await scheduler.start()
    row = await parts.create("tea", when="in 10 minutes")
    await settle(scheduler)
    assert timers(scheduler) == {f"reminder:{row.id}"}
    assert (await parts.service.cancel(CHAT, row.id)).ok
    await settle(scheduler)
    assert timers(scheduler) == set()


async def test_a_stopped_scheduler_no_longer_hears_of_reminders(parts: Parts) -> None:
    scheduler = parts.scheduler()
    await scheduler.start()
    await scheduler.stop()
    heard: list[ReminderChanged] = []
    parts.store.subscribe(ReminderChanged, heard.append)
    row = await parts.create("tea", when="in 10 minutes")
    assert heard == [ReminderChanged(row.id)]
    assert scheduler._tasks == set()  # nothing re-armed on a stopped scheduler


async def test_a_fired_reminder_announces_its_outbound_for_its_chat(parts: Parts) -> None:
    row = await parts.create("tea", when="in 10 minutes")
    parts.clock.advance(minutes=10)
    outbound: list[OutboundCommitted] = []
    parts.store.subscribe(OutboundCommitted, outbound.append)
    await parts.scheduler().fire_reminder(row.id, row.next_at)
    assert [event.chat_keys for event in outbound] == [frozenset({str(CHAT)})]


# -- recurring reminders ------------------------------------------------------------------
async def test_recurring_reminder_after_downtime_fires_once_and_resumes_from_now(
    parts: Parts,
) -> None:
    row = await parts.create("read", recurrence="every day at 9:00")
    assert row.next_at == datetime(2032, 2, 29, 9, 0, tzinfo=UTC).timestamp()
    parts.clock.set(datetime(2032, 3, 3, 10, 30, tzinfo=UTC))  # missed 29 Feb … 3 Mar
    scheduler = parts.scheduler()
    await scheduler.start()
    await settle(scheduler)
    await scheduler.fire_reminder(row.id, row.next_at)  # the old timer, too late: ignored
    sent = await parts.outbox()
    # One message for four missed runs, judged by the latest (3 Mar 09:00, 1 h 30 min ago).
    assert [m.text for m in sent] == ["⏰ read (late by 1 h 30 min — I was offline)"]
    after = await parts.reminder(row.id)
    assert after.status == "active"
    assert after.next_at == datetime(2032, 3, 4, 9, 0, tzinfo=UTC).timestamp()
    assert after.fired_count == 1


async def test_recurring_reminder_on_time_advances_to_the_next_run(parts: Parts) -> None:
    row = await parts.create("stand up", recurrence="every weekday at 8:30")
    # Sunday 29 Feb → Monday 1 March 08:30
    assert row.next_at == datetime(2032, 3, 1, 8, 30, tzinfo=UTC).timestamp()
    scheduler = parts.scheduler()
    await scheduler.start()
    expected_days = [1, 2, 3, 4, 5, 8, 9]  # Friday 5 March → Monday 8 March
    seen = []
    next_at = row.next_at
    for _ in expected_days:
        seen.append(datetime.fromtimestamp(next_at, UTC).day)
        parts.clock.set(next_at)
        await scheduler.fire_reminder(row.id, next_at)
        await settle(scheduler)
        next_at = (await parts.reminder(row.id)).next_at
    assert seen == expected_days
    assert [m.text for m in await parts.outbox()] == ["⏰ stand up"] * len(expected_days)


@pytest.mark.parametrize(
    ("created", "change"),
    [
        (datetime(2032, 3, 25, 12, 0, tzinfo=UTC), datetime(2032, 3, 28).date()),
        (datetime(2032, 10, 28, 12, 0, tzinfo=UTC), datetime(2032, 10, 31).date()),
    ],
)
async def test_daily_9_berlin_stays_9_local_across_dst(
    parts: Parts, created: datetime, change: Any
) -> None:
    parts.clock.set(created)
    row = await parts.create("coffee", recurrence="every day at 9:00", timezone="Europe/Berlin")
    scheduler = parts.scheduler()
    await scheduler.start()
    local_runs = []
    next_at = row.next_at
    for _ in range(6):
        local_runs.append(datetime.fromtimestamp(next_at, BERLIN))
        parts.clock.set(next_at)
        await scheduler.fire_reminder(row.id, next_at)
        await settle(scheduler)
        next_at = (await parts.reminder(row.id)).next_at
    assert [(t.hour, t.minute) for t in local_runs] == [(9, 0)] * 6
    days = [t.date() for t in local_runs]
    assert days == [created.date() + timedelta(days=n) for n in range(1, 7)]
    assert change in days
    offsets = {t.utcoffset() for t in local_runs}
    assert offsets == {timedelta(hours=1), timedelta(hours=2)}  # it did cross the change
    assert [m.text for m in await parts.outbox()] == ["⏰ coffee"] * 6


async def test_a_daily_reminder_in_the_repeated_hour_fires_once_when_clocks_go_back(
    parts: Parts,
) -> None:
    """1:30 comes twice in New York on 7 November 2032: the reminder goes once that
    night, as on every other, and each fire takes no time to find the next."""
    parts.clock.set(datetime(2032, 11, 6, 12, 0, tzinfo=NEW_YORK))
    row = await parts.create("pill", recurrence="every day at 1:30", timezone="America/New_York")
    scheduler = parts.scheduler()
    await scheduler.start()
    runs, next_at = [], row.next_at
    for _ in range(3):
        runs.append(datetime.fromtimestamp(next_at, NEW_YORK))
        parts.clock.set(next_at + 0.2)  # the timer fires a little after the occurrence
        await scheduler.fire_reminder(row.id, next_at)
        await settle(scheduler)
        next_at = (await parts.reminder(row.id)).next_at
    assert [(t.day, t.hour, t.minute) for t in runs] == [(7, 1, 30), (8, 1, 30), (9, 1, 30)]
    assert [m.text for m in await parts.outbox()] == ["⏰ pill"] * 3


def test_a_fixed_hour_schedule_runs_once_when_clocks_go_back_and_a_starred_one_by_the_clock() -> (
    None
):
    def walk(expression: str, until: datetime) -> list[str]:
        """The fire times APScheduler's timer takes from the trigger, as offsets."""
        trigger, previous, now = cron_trigger(expression, NEW_YORK), None, NIGHT_BEFORE
        fired = []
        while (previous := trigger.get_next_fire_time(previous, now)) < until:
            fired.append(previous.isoformat(timespec="minutes")[11:])
            now = previous
        return fired

    until = datetime(2032, 11, 7, 3, 0, tzinfo=NEW_YORK)
    assert walk("30 1 * * *", until) == ["01:30-04:00"]  # one backup, not two
    assert walk("*/30 * * * *", until) == [
        "23:00-04:00", "23:30-04:00", "00:00-04:00", "00:30-04:00", "01:00-04:00", "01:30-04:00",
        "01:00-05:00", "01:30-05:00", "02:00-05:00", "02:30-05:00",
    ]  # fmt: skip
    # Strictly after, whatever the pass: never the same moment again, nor an earlier one.
    second_pass = datetime(2032, 11, 7, 1, 30, fold=1, tzinfo=NEW_YORK)
    for expression in ("30 1 * * *", "*/15 * * * *"):
        following = next_after(expression, NEW_YORK, second_pass)
        assert following is not None and following.timestamp() > second_pass.timestamp()
    assert next_after("*/15 * * * *", NEW_YORK, second_pass) == second_pass + timedelta(minutes=15)


# -- cron jobs ----------------------------------------------------------------------------
def hourly_on_leap_day(**kwargs: Any) -> CronJob:
    values: dict[str, Any] = {
        "name": "brief",
        "schedule": "0 * 29 2 *",
        "prompt": "Summarise what is due today.",
        "deliver_to": "telegram:123456789",
    }
    values.update(kwargs)
    return CronJob(**values)


async def test_a_prompt_job_publishes_one_inbound_per_occurrence(parts: Parts) -> None:
    scheduler = parts.scheduler([hourly_on_leap_day()])
    occurrence = datetime(2032, 2, 29, 9, 0, tzinfo=UTC).timestamp()
    await scheduler.run_cron("brief", occurrence)
    await scheduler.run_cron("brief", occurrence)  # the same occurrence again
    [inbound] = await parts.inbox()
    assert inbound.kind == "message"
    assert isinstance(inbound, MessageInbound)
    assert inbound.address.channel == "cron"
    assert inbound.text == "Summarise what is due today."
    assert inbound.deliver_to == Address.parse("telegram:123456789")
    assert inbound.external_id == f"brief@{int(occurrence)}"
    await scheduler.run_cron("brief", occurrence + 3600)  # the next one is new
    assert len(await parts.inbox()) == 2


async def test_a_tool_job_publishes_a_tool_call(parts: Parts) -> None:
    job = hourly_on_leap_day(prompt=None, tool="current_time", args={"timezone": "UTC"})
    scheduler = parts.scheduler([job])
    await scheduler.run_cron("brief", START.timestamp())
    [inbound] = await parts.inbox()
    assert inbound.kind == "tool_call"
    assert isinstance(inbound, ToolCallInbound)
    assert inbound.tool_call is not None
    assert (inbound.tool_call.tool, inbound.tool_call.args) == ("current_time", {"timezone": "UTC"})
    assert inbound.deliver_to == Address.parse("telegram:123456789")


async def test_missed_cron_runs_within_grace_run_once_at_start(parts: Parts) -> None:
    first = parts.scheduler([hourly_on_leap_day()])
    await first.start()  # 08:00: remembers where it is; nothing to catch up
    await first.stop()
    assert await parts.inbox() == []
    parts.clock.set(datetime(2032, 2, 29, 11, 30, tzinfo=UTC))  # 09:00, 10:00, 11:00 missed
    second = parts.scheduler([hourly_on_leap_day()])
    await second.start()
    await second.stop()
    [inbound] = await parts.inbox()
    assert inbound.metadata["occurrence"] == datetime(2032, 2, 29, 11, 0, tzinfo=UTC).timestamp()
    third = parts.scheduler([hourly_on_leap_day()])  # restart again: nothing new
    await third.start()
    assert len(await parts.inbox()) == 1


async def test_missed_cron_run_beyond_grace_does_not_run(parts: Parts) -> None:
    job = hourly_on_leap_day(schedule="0 9 29 2 *")
    first = parts.scheduler([job])
    await first.start()
    await first.stop()
    parts.clock.set(datetime(2032, 3, 1, 9, 0, 1, tzinfo=UTC))  # due 24 h 1 s ago
    second = parts.scheduler([job])
    await second.start()
    assert await parts.inbox() == []


async def test_a_day_or_weekday_schedule_is_armed(parts: Parts) -> None:
    scheduler = parts.scheduler([hourly_on_leap_day(schedule="0 9 29 2 1")])
    await scheduler.start()
    assert scheduler.health() == {"status": "ok", "timers": 1}


# -- config errors ------------------------------------------------------------------------
def check_config(tmp_path: Path, cron: str) -> tuple[int, str]:
    path = tmp_path / "bad.toml"
    path.write_text(f'[[cron]]\nname = "brief"\ndeliver_to = "cli:local"\n{cron}\n')
    result = run_echo_bot(
        "check-config", "--config", str(path), "--state-dir", str(tmp_path / "st")
    )
    return result.returncode, result.stdout + result.stderr


def test_invalid_cron_schedule_is_a_config_error_naming_the_job(tmp_path: Path) -> None:
    code, output = check_config(tmp_path, 'schedule = "61 * * * *"\nprompt = "hi"')
    assert code == 2
    assert "cron[0].schedule:" in output and "(job brief)" in output
    assert "61" in output


def test_unknown_tool_in_a_cron_job_is_a_config_error(tmp_path: Path) -> None:
    code, output = check_config(tmp_path, 'schedule = "0 9 * * *"\ntool = "no_such_tool"')
    assert code == 2
    assert "cron[0].tool: unknown tool 'no_such_tool'" in output and "(job brief)" in output


def test_unknown_timezone_in_a_cron_job_is_a_config_error(tmp_path: Path) -> None:
    code, output = check_config(
        tmp_path, 'schedule = "0 9 * * *"\ntimezone = "Mars/Olympus"\nprompt = "hi"'
    )
    assert code == 2
    assert "cron[0]" in output and "timezone" in output
    assert "Mars/Olympus" in output


def test_a_valid_cron_job_passes_check_config(tmp_path: Path) -> None:
    code, output = check_config(
        tmp_path, 'schedule = "30 7 * * 1-5"\ntimezone = "Europe/Berlin"\nprompt = "hi"'
    )
    assert code == 0, output


# -- a cron job end to end ----------------------------------------------------------------
TICK = """
[[cron]]
name = "tick"
schedule = "* * * * *"
prompt = "what time is it?"
deliver_to = "cli:local"
"""


async def test_a_cron_prompt_job_answers_in_its_deliver_to_chat(state_dir: Path) -> None:
    async with running_bot(state_dir, TICK) as bot:
        scheduler = bot.daemon.scheduler
        assert scheduler is not None
        occurrence = 1_900_000_020.0  # any minute; the test drives it directly
        await scheduler.run_cron("tick", occurrence)
        await scheduler.run_cron("tick", occurrence)

        stored = await bot.store.run(lambda tx: inbound_of(tx, "cron"))
        [inbound_id] = [m.id for m in stored if m.external_id == f"tick@{int(occurrence)}"]
        reply = await bot.channel.reply_to(inbound_id)
        assert reply.to == Address(channel="cli", chat_id="local")
        assert reply.text.startswith("It is ")


async def test_a_resync_follows_reminders_changed_through_another_daemon(tmp_path: Path) -> None:
    """With several daemons, a reminder changed through another one reaches this one's
    timers only by the resync: one moved earlier is set for its new time (not left on
    the old one, where it would do nothing), one cancelled is cleared."""
    import time

    path = tmp_path / "shared.sqlite3"
    here, there = Store(Database(path), Masker()), Store(Database(path), Masker())
    await here.open()
    await there.open()
    scheduler = Scheduler(
        here, Bus(BusQueues(here), BusQueues(here)),
        cron_jobs=[], timezone="UTC", grace=timedelta(hours=1), resync=0.1,
    )  # fmt: skip
    service = ReminderService(there, timezone="UTC", languages=["en"], max_active=10)
    try:
        await scheduler.start()
        moved = await service.create(CHAT, "owner", "stretch", when="in 1 hour")
        dropped = await service.create(CHAT, "owner", "water", when="in 1 hour")
        assert moved.reminder is not None and dropped.reminder is not None
        async with asyncio.timeout(10):
            while scheduler.health()["timers"] != 2:
                await asyncio.sleep(0.05)
        soon = time.time() + 1.0
        moved_id, dropped_id = moved.reminder.id, dropped.reminder.id
        await there.run(lambda tx: tx.reminders.advance(moved_id, soon))
        await there.run(lambda tx: tx.reminders.set_status(dropped_id, ReminderStatus.CANCELLED))

        async def sent() -> list[OutboundMessage]:
            return [d.message for d in await here.run(lambda tx: tx.outbox.deliveries())]

        await eventually(sent, 10, "the moved reminder in the outbox")
        [message] = await sent()
        assert message.text == "⏰ stretch"
        async with asyncio.timeout(10):
            while scheduler.health()["timers"] != 0:
                await asyncio.sleep(0.05)
    finally:
        await scheduler.stop()
        await here.close()
        await there.close()
