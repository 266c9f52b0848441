"""Reading times people write ("in 10 minutes", "tomorrow at 9am", "every weekday at
8:30") in a timezone. Unclear phrases come back as a question, never as a guess.

dateparser is imported on first use, with the configured languages only (without them
its first parse costs seconds and tens of MB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from ..dates import day_text
from ..errors import EchoBotError

MAX_AHEAD = timedelta(days=5 * 366)
_EXAMPLES = "e.g. “in 10 minutes”, “at 17:30”, “tomorrow at 9am”, “friday at noon”"

_TIME_OF_DAY = re.compile(
    r"\b(\d{1,2}(:\d{2})?\s*(am|pm)|\d{1,2}:\d{2}|noon|midnight)\b", re.IGNORECASE
)
_RELATIVE = re.compile(
    r"\bin\s+(an?|\d+|one|two|three|four|five|ten|fifteen|twenty|thirty)\s+"
    r"(sec|second|min|minute|hour|day|week|month|year)s?\b",
    re.IGNORECASE,
)
_ELAPSED = {"sec", "second", "min", "minute", "hour"}
# "at 9" (not "at 9:30", "at 9am", "at 9.30", "at 21h", nor "at 8 30": that is unclear).
_BARE_AT_HOUR = re.compile(r"\bat\s+(\d{1,2})\b(?!\s*(:|am|pm|\.|h\b|\d))", re.IGNORECASE)
# Clocks written "9.30", "21h" or "21h30" after "at" (not alone: "1.12" may be a date).
_OTHER_CLOCK = re.compile(r"\bat\s+(\d{1,2})(?:\.(\d{2})|h(\d{2})?)\b", re.IGNORECASE)
_WEEKDAY = re.compile(r"\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", re.I)
_ONLY_TIME = re.compile(
    r"^\s*(at\s+)?(\d{1,2}(:\d{2})?\s*(am|pm)?|noon|midnight)\s*$", re.IGNORECASE
)

_DAYS = {
    "monday": "1", "tuesday": "2", "wednesday": "3", "thursday": "4", "friday": "5",
    "saturday": "6", "sunday": "0", "day": "*", "weekday": "1-5", "weekend": "0,6",
}  # fmt: skip
_EVERY = re.compile(r"^\s*every\s+(?P<day>[a-z]+?)s?\s+at\s+(?P<time>.+?)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class When:
    at: datetime  # timezone-aware


@dataclass(frozen=True, slots=True)
class Unclear:
    question: str


@dataclass(frozen=True, slots=True)
class Recurrence:
    cron: str
    description: str


def _normalise(phrase: str) -> str:
    text = " ".join(phrase.strip().split())
    text = re.sub(r"\bnoon\b", "12:00", text, flags=re.IGNORECASE)
    text = re.sub(r"\bmidnight\b", "00:00", text, flags=re.IGNORECASE)
    text = _OTHER_CLOCK.sub(lambda m: f"at {m.group(1)}:{m.group(2) or m.group(3) or '00'}", text)
    # "at 9" means 9:00, not "9 minutes past the current hour".
    return _BARE_AT_HOUR.sub(lambda m: f"at {m.group(1)}:00", text)


def _clock(text: str) -> tuple[int, int] | None:
    """ "17:30", "9am", "9:15 pm", "9" → (hour, minute)."""
    match = re.fullmatch(
        r"\s*(\d{1,2})(?::(\d{2}))?\s*(am|pm)?\s*", _normalise(text).removeprefix("at "), re.I
    )
    if not match:
        return None
    hour, minute = int(match.group(1)), int(match.group(2) or 0)
    suffix = (match.group(3) or "").lower()
    if suffix:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if suffix == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    return hour, minute


def _dateparser(
    phrase: str, zone: ZoneInfo, now: datetime, languages: list[str]
) -> datetime | None:
    import dateparser

    base = now.astimezone(zone).replace(tzinfo=None)
    # No TO_TIMEZONE and no RETURN_AS_TIMEZONE_AWARE: a phrase without a zone comes back
    # as naive local wall-clock time, localised below. dateparser's own conversion keeps
    # the UTC offset of `now`, so "tomorrow at 9am" on the eve of a DST change would come
    # back as 10:00 or 08:00 local.
    settings: dict[str, Any] = {
        "PREFER_DATES_FROM": "future",
        "TIMEZONE": str(zone.key),
        "RELATIVE_BASE": base,
    }
    try:
        moment = dateparser.parse(phrase, languages=languages, settings=settings)
    except (ValueError, OverflowError, TypeError):
        return None
    if moment is None:
        return None
    _check_read(phrase, moment)
    if moment.tzinfo is not None:  # the phrase named its own zone ("9am CET")
        return moment.astimezone(zone)
    relative = _RELATIVE.search(phrase)
    if relative and relative.group(2).lower() in _ELAPSED and not _TIME_OF_DAY.search(phrase):
        # "in 10 minutes" is elapsed time, also across a DST change.
        return (now.astimezone(UTC) + (moment - base)).astimezone(zone)
    # Wall-clock time; a time skipped by a DST change moves forward by the gap.
    return moment.replace(tzinfo=zone).astimezone(UTC).astimezone(zone)


class _Misread(EchoBotError):
    """dateparser's answer is not what the phrase says: asked, never taken."""


def _check_read(phrase: str, moment: datetime) -> None:
    """``moment`` as dateparser read ``phrase`` (its wall time, before any zone) keeps
    the phrase's clock and weekday: dateparser drops what it cannot read ("24:00",
    "9:75") and keeps the current time of day, or takes a stray number for a day."""
    clock = _TIME_OF_DAY.search(phrase)
    if clock is not None:
        read = _clock(clock.group(0))
        if read is None:
            raise _Misread(f"I could not read the time “{clock.group(0)}”. Try {_EXAMPLES}.")
        if (moment.hour, moment.minute) != read:
            raise _Misread(f"I could not read a time in “{phrase}”. Try {_EXAMPLES}.")
    named = {day.lower() for day in _WEEKDAY.findall(phrase)}
    if named and moment.strftime("%A").lower() not in named:
        raise _Misread(f"I could not read a day in “{phrase}”. Try {_EXAMPLES}.")


def parse_when(
    phrase: str, zone: ZoneInfo, now: datetime, languages: list[str] | None = None
) -> When | Unclear:
    """One moment in the future, or the question to ask instead."""
    try:
        return _parse_when(phrase, zone, now, languages or ["en"])
    except _Misread as exc:
        return Unclear(str(exc))


def _parse_when(phrase: str, zone: ZoneInfo, now: datetime, languages: list[str]) -> When | Unclear:
    text = _normalise(phrase)
    if not text:
        return Unclear(f"When should I remind you? Say {_EXAMPLES}.")
    if len(text) > 200:
        return Unclear("That time phrase is too long. Say " + _EXAMPLES + ".")
    local_now = now.astimezone(zone)
    if _ONLY_TIME.match(text):
        clock = _clock(text)
        if clock is None:
            return Unclear(f"I could not read a time in “{phrase}”. Try {_EXAMPLES}.")
        today = local_now.replace(hour=clock[0], minute=clock[1], second=0, microsecond=0)
        if today > local_now:
            return When(today)
        return Unclear(
            f"{clock[0]:02d}:{clock[1]:02d} has already passed today. Did you mean tomorrow? "
            f"Say “tomorrow at {clock[0]:02d}:{clock[1]:02d}”."
        )
    if not _TIME_OF_DAY.search(text) and not _RELATIVE.search(text):
        parsed_day = _dateparser(text, zone, now, languages)
        if parsed_day is None or re.search(r"\bat\b", text, re.IGNORECASE):
            # A day, and after "at" something that is no time ("at 8 30"): never a
            # suggestion to add a second time to it.
            return Unclear(f"I could not read a time in “{phrase}”. Try {_EXAMPLES}.")
        return Unclear(f"At what time {text}? Say e.g. “{text} at 9:00”.")
    moment = _dateparser(text, zone, now, languages)
    if moment is None:
        return Unclear(f"I could not read a time in “{phrase}”. Try {_EXAMPLES}.")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    moment = moment.astimezone(zone)
    if moment.timestamp() <= now.timestamp():  # local-time `<=` would ignore DST fold
        return Unclear(
            f"{day_text(moment)} {moment:%H:%M} is in the past. When should it be? Try {_EXAMPLES}."
        )
    if moment - local_now > MAX_AHEAD:
        return Unclear("That is more than 5 years away; I only keep reminders up to 5 years.")
    return When(moment)


def parse_recurrence(phrase: str) -> Recurrence | Unclear:
    """ "every weekday at 8:30" → cron "30 8 * * 1-5"; a 5-field cron passes through."""
    text = " ".join(phrase.strip().split())
    if len(text.split()) == 5 and not text.lower().startswith("every"):
        return Recurrence(cron=text, description=f"on the schedule “{text}”")
    match = _EVERY.match(text)
    if not match:
        return Unclear(
            f"I could not read a repetition in “{phrase}”. Say e.g. “every day at 21:00” or "
            "“every weekday at 8:30”."
        )
    day = match.group("day").lower()
    clock = _clock(match.group("time"))
    if day not in _DAYS or clock is None:
        return Unclear(
            f"I could not read a repetition in “{phrase}”. Say e.g. “every day at 21:00”, "
            "“every weekday at 8:30” or “every monday at 9:00”."
        )
    hour, minute = clock
    return Recurrence(
        cron=f"{minute} {hour} * * {_DAYS[day]}",
        description=f"every {day} at {hour:02d}:{minute:02d}",
    )


def describe(moment: datetime) -> str:
    return f"{day_text(moment)} at {moment:%H:%M} ({moment.tzinfo})"


def describe_lateness(seconds: float) -> str:
    minutes = int(seconds // 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days} d"] if days else []
    if hours:
        parts.append(f"{hours} h")
    if minutes or not parts:
        parts.append(f"{minutes} min")
    return " ".join(parts)
