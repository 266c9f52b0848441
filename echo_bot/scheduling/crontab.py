"""Standard 5-field cron expressions on APScheduler 3's CronTrigger.

APScheduler 3 numbers weekdays from Monday = 0; crontab numbers them from Sunday = 0
(and 7). The weekday field is expanded to a list of day names so "1-5" means Monday to
Friday, "0-6" every day and "*/2" Sunday, Tuesday, Thursday, Saturday, as everyone who
writes crontab lines expects. APScheduler is imported on first use.

When the clocks go back, a schedule with a fixed hour runs once, at the first pass of
the repeated hour, as crontab runs it (``30 1 * * *`` is one backup a night, not two);
one whose hour is ``*`` runs by the clock in both passes (every 15 minutes stays every
15 minutes of real time).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _weekday(token: str, *, range_end: bool = False) -> int:
    """A crontab weekday: 0-7 (0 and 7 are Sunday) or a name; Sunday = 0 (7 as a range end)."""
    token = token.strip().lower()
    if token.isdigit():
        number = int(token)
        if not 0 <= number <= 7:
            raise ValueError(f"weekday {number} is out of range (0-7, 0 and 7 are Sunday)")
        return number
    if token in _NAMES:
        number = _NAMES.index(token)
        return 7 if range_end and number == 0 else number
    raise ValueError(f"weekday {token!r} is not a number 0-7 or a name like mon")


def _weekdays(field: str) -> str:
    """The crontab weekday field as APScheduler day names, expanded ("0-6", "*/2" and
    "1-5" keep their crontab meaning; APScheduler's own ranges and steps count from
    Monday, so they are never passed through)."""
    days: set[int] = set()
    for item in field.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ValueError(f"weekday step {step_text!r} is not a positive number")
            step = int(step_text)
        if base == "*":
            first, last = 0, 6
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            first, last = _weekday(first_text), _weekday(last_text, range_end=True)
            if first > last:
                raise ValueError(f"weekday range {base!r} runs backwards")
        else:
            first = _weekday(base)
            last = 6 if slash else first
        days.update(day % 7 for day in range(first, last + 1, step))
    if not days:
        raise ValueError(f"weekday field {field!r} names no day")
    if len(days) == 7:
        return "*"
    return ",".join(_NAMES[day] for day in sorted(days))


def cron_trigger(expression: str, timezone: ZoneInfo) -> Any:
    """A CronTrigger for ``expression``; ValueError with a readable reason when invalid."""
    from apscheduler.triggers.cron import CronTrigger

    fields = expression.split()
    if len(fields) != 5:
        raise ValueError("a cron schedule has 5 fields: minute hour day month weekday")
    minute, hour, day, month, weekday = fields
    trigger: Any
    try:
        days = _weekdays(weekday)
        if not day.startswith("*") and not weekday.startswith("*"):
            # crontab runs when *either* the day of month or the weekday matches;
            # APScheduler's CronTrigger would need both.
            from apscheduler.triggers.combining import OrTrigger

            trigger = OrTrigger(
                [
                    CronTrigger(minute=minute, hour=hour, day=day, month=month, timezone=timezone),
                    CronTrigger(
                        minute=minute, hour=hour, month=month, day_of_week=days, timezone=timezone
                    ),
                ]
            )
        else:
            trigger = CronTrigger(
                minute=minute,
                hour=hour,
                day=day,
                month=month,
                day_of_week=days,
                timezone=timezone,
            )
    except ValueError as exc:
        raise ValueError(f"invalid cron schedule {expression!r}: {exc}") from None
    return trigger if hour.startswith("*") else _once_when_clocks_go_back()(trigger)


def next_after(expression: str, timezone: ZoneInfo, moment: datetime) -> datetime | None:
    """The first occurrence strictly after ``moment`` (compared as instants: two
    datetimes in one zone compare by their wall time, a repeated hour's fold unseen)."""
    trigger = cron_trigger(expression, timezone)
    following: datetime | None = trigger.get_next_fire_time(None, moment)
    if following is not None and following.timestamp() <= moment.timestamp():
        later = moment.astimezone(UTC) + timedelta(seconds=1)  # a wall time's step loses its fold
        following = trigger.get_next_fire_time(None, later)
    return following


def _repeated(moment: datetime) -> bool:
    """Whether ``moment`` is the second pass of a wall time the clocks went back over."""
    return moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset()


@functools.cache
def _once_when_clocks_go_back() -> type:
    """The trigger class that skips a schedule's second pass of a repeated hour (made
    on first use: APScheduler is imported only then)."""
    from apscheduler.triggers.base import BaseTrigger

    class OnceWhenClocksGoBack(BaseTrigger):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def get_next_fire_time(self, previous: datetime | None, now: datetime) -> Any:
            following = self.inner.get_next_fire_time(previous, now)
            for _ in range(4):  # one repeated hour a day at most
                if following is None or not _repeated(following):
                    break
                later = following.astimezone(UTC) + timedelta(seconds=1)
                following = self.inner.get_next_fire_time(following, later)
            return following

        def __str__(self) -> str:
            return str(self.inner)

    return OnceWhenClocksGoBack
