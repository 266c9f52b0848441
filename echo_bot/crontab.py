"""Standard 5-field cron expressions on APScheduler 3's CronTrigger.

APScheduler 3 numbers weekdays from Monday = 0; crontab numbers them from Sunday = 0
(and 7). Weekday numbers are translated to names so "1-5" means Monday to Friday, as
everyone who writes crontab lines expects. APScheduler is imported on first use.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def _weekday(token: str) -> str:
    if token.isdigit():
        number = int(token)
        if not 0 <= number <= 7:
            raise ValueError(f"weekday {number} is out of range (0-7, 0 and 7 are Sunday)")
        return _NAMES[number]
    return token


def _weekdays(field: str) -> str:
    items = []
    for item in field.split(","):
        base, slash, step = item.partition("/")
        if "-" in base:
            first, _, last = base.partition("-")
            base = f"{_weekday(first)}-{_weekday(last)}"
        else:
            base = _weekday(base)
        items.append(base + (f"/{step}" if slash else ""))
    return ",".join(items)


def cron_trigger(expression: str, timezone: ZoneInfo) -> Any:
    """A CronTrigger for ``expression``; ValueError with a readable reason when invalid."""
    from apscheduler.triggers.cron import CronTrigger

    fields = expression.split()
    if len(fields) != 5:
        raise ValueError("a cron schedule has 5 fields: minute hour day month weekday")
    minute, hour, day, month, weekday = fields
    try:
        return CronTrigger(
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=_weekdays(weekday),
            timezone=timezone,
        )
    except ValueError as exc:
        raise ValueError(f"invalid cron schedule {expression!r}: {exc}") from None


def next_after(expression: str, timezone: ZoneInfo, moment: datetime) -> datetime | None:
    """The first occurrence strictly after ``moment``."""
    trigger = cron_trigger(expression, timezone)
    following = trigger.get_next_fire_time(None, moment)
    if following is not None and following <= moment:
        following = trigger.get_next_fire_time(None, moment + timedelta(seconds=1))
    return following
