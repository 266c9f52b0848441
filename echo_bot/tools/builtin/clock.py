"""current_time: the date and time in the bot's (or a named) timezone."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from ..base import ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult

# Spelled out rather than strftime("%A"/"%B"), which follow the process locale.
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip

_SLASHED_ZONE = re.compile(r"\b[A-Za-z][A-Za-z_\-]*(?:/[A-Za-z0-9_+\-]+)+")
_IN_ZONE = re.compile(r"\bin\s+([A-Za-z][A-Za-z0-9_+\-]*)\b", re.IGNORECASE)


@lru_cache(maxsize=1)
def _zones_by_lower() -> dict[str, str]:
    zones: dict[str, str] = {}
    for key in sorted(available_timezones()):
        if key.startswith(("posix/", "right/")):
            continue
        zones.setdefault(key.lower(), key)
    return zones


def find_zone(name: str) -> ZoneInfo | None:
    """The zone called ``name`` (an IANA key; case-insensitive), or None."""
    if not name or len(name) > 64:
        return None
    key = _zones_by_lower().get(name.lower(), name)
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def format_offset(moment: datetime) -> str:
    offset = moment.utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    sign = "+" if minutes >= 0 else "-"
    hours, minutes = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{minutes:02d}"


def describe_moment(moment: datetime, zone_name: str) -> str:
    return (
        f"It is {_DAYS[moment.weekday()]} {moment.day} {_MONTHS[moment.month - 1]} "
        f"{moment.year}, {moment:%H:%M} ({zone_name}, {format_offset(moment)})."
    )


class CurrentTimeTool(Tool):
    name: ClassVar[str] = "current_time"
    description: ClassVar[str] = (
        "Tell the current date, weekday and time, in the bot's timezone or a given one."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "timezone": {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "IANA timezone name such as 'Europe/Berlin'; "
                "omit for the bot's own timezone.",
            }
        },
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "basic"
    idempotent: ClassVar[bool] = True
    timeout: ClassVar[float] = 5.0
    triggers: ClassVar[tuple[str, ...]] = (
        "what time is it",
        "current time",
        "what's the time",
        "what day is it",
        "today's date",
        "what is the date",
    )
    negative_triggers: ClassVar[tuple[str, ...]] = ("remind me", "set a timer")

    def __init__(self, timezone: str, *, now: Callable[[], datetime] | None = None) -> None:
        self.default_timezone = timezone
        self._now = now or (lambda: datetime.now(UTC))

    def extract_args(self, text: str) -> dict[str, Any] | None:
        candidates = _SLASHED_ZONE.findall(text) + _IN_ZONE.findall(text)
        for candidate in candidates:
            zone = find_zone(candidate)
            if zone is not None:
                return {"timezone": zone.key}
        return {}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        requested = args.get("timezone") or self.default_timezone
        zone = find_zone(requested)
        if zone is None:
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                f"unknown timezone {requested!r} (use an IANA name like 'Europe/Berlin')",
            )
        moment = self._now().astimezone(zone)
        return ToolResult.success(
            describe_moment(moment, zone.key),
            iso=moment.isoformat(timespec="seconds"),
            timezone=zone.key,
            utc_offset=format_offset(moment)[3:],
        )
