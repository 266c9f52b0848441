"""Dates and times as every message shows them: "Thursday 3 December 2026", "08:24 UTC".

Names are spelled out rather than taken from strftime("%A"/"%B"), which follow the
process locale; the day has no leading zero. A leaf: stdlib only.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def day_text(moment: datetime, *, year: bool = True) -> str:
    """ "Thursday 3 December 2026" (or without the year)."""
    text = f"{DAYS[moment.weekday()]} {moment.day} {MONTHS[moment.month - 1]}"
    return f"{text} {moment.year}" if year else text


def clock_text(ts: float, zone: str | None = None, *, date: bool = False) -> str:
    """The time of day of a Unix time in a zone, named: "09:24 Europe/Berlin"; in UTC,
    "08:24 UTC", when no zone (or an unknown one) is given. ``date``: with the day in
    that zone first ("2026-12-02 09:24 Europe/Berlin")."""
    tz = (zone_of(zone) if zone else None) or ZoneInfo("UTC")
    shape = "%Y-%m-%d %H:%M" if date else "%H:%M"
    return f"{datetime.fromtimestamp(ts, tz).strftime(shape)} {tz.key}"


def zone_of(name: str) -> ZoneInfo | None:
    """The time zone called ``name``; None for none (an unknown key, a malformed one, or
    a folder of the zone database such as "Europe", which ZoneInfo opens as a file)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None
