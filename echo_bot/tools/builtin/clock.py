"""current_time: the date and time in the chat's timezone, or in a named zone or city."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, available_timezones

from ...dates import day_text, zone_of
from ...events import Address
from ..base import ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult

_SLASHED_ZONE = re.compile(r"\b[A-Za-z][A-Za-z_\-]*(?:/[A-Za-z0-9_+\-]+)+")
# "... in Tokyo?", "... in New York right now": the words after "in".
_IN_PLACE = re.compile(r"\bin\s+([A-Za-z][\w/+'.\- ]*?)[\s?!.,]*$", re.IGNORECASE)
# "in the morning" is no place; "in my timezone", "here" mean the chat's own zone.
_NOT_A_PLACE = re.compile(r"^(?:the\s+)?(?:morning|afternoon|evening|night|day)\b", re.I)
_THIS_CHAT = re.compile(r"^(?:here|my\b|our\b|this\s+chat|local\b)", re.I)
_MAX_PLACE_WORDS = 4

# Reads the chat's own timezone (``/timezone``) for the chat an answer goes to.
ChatZone = Callable[[Address], Awaitable[str]]


@lru_cache(maxsize=1)
def _zones_by_lower() -> dict[str, str]:
    zones: dict[str, str] = {}
    for key in sorted(available_timezones()):
        if key.startswith(("posix/", "right/")):
            continue
        zones.setdefault(key.lower(), key)
    return zones


@lru_cache(maxsize=1)
def _zones_by_city() -> dict[str, str]:
    """City part of each IANA key ("Asia/Tokyo" → "tokyo", "America/New_York" →
    "new york"); when two keys share a city (links), the first in sorted order wins."""
    cities: dict[str, str] = {}
    for lower, key in _zones_by_lower().items():
        city = lower.rsplit("/", 1)[-1].replace("_", " ")
        cities.setdefault(city, key)
    return cities


def _place_key(name: str) -> str:
    return " ".join(name.replace("_", " ").lower().split())


def find_zone(name: str) -> ZoneInfo | None:
    """The zone called ``name``: an IANA key or the city part of one ("Tokyo",
    "new york"), case-insensitive; None when there is none."""
    name = name.strip()
    if not name or len(name) > 64:
        return None
    key = _zones_by_lower().get(name.lower()) or _zones_by_city().get(_place_key(name), name)
    return zone_of(key)


def _place_in(text: str) -> dict[str, Any]:
    """The zone named after "in": the longest run of leading words that is a city or
    zone; an unknown place is passed on as written, so the answer says it is unknown."""
    match = _IN_PLACE.search(text)
    if match is None:
        return {}
    phrase = match.group(1).strip()
    if _NOT_A_PLACE.match(phrase) or _THIS_CHAT.match(phrase):
        return {}
    place_words = phrase.split()[:_MAX_PLACE_WORDS]
    for size in range(len(place_words), 0, -1):
        zone = find_zone(" ".join(place_words[:size]))
        if zone is not None:
            return {"timezone": zone.key}
    return {"timezone": " ".join(place_words)[:64]}


def format_offset(moment: datetime) -> str:
    offset = moment.utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    sign = "+" if minutes >= 0 else "-"
    hours, minutes = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{minutes:02d}"


def describe_moment(moment: datetime, zone_name: str) -> str:
    return f"It is {day_text(moment)}, {moment:%H:%M} ({zone_name}, {format_offset(moment)})."


class CurrentTimeTool(Tool):
    name: ClassVar[str] = "current_time"
    description: ClassVar[str] = (
        "Tell the current date, weekday and time: in this chat's timezone, or in a given "
        "IANA timezone or city."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "timezone": {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "IANA timezone such as 'Europe/Berlin', or a city of "
                "the time zone database such as 'Tokyo'; omit for this chat's timezone.",
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

    def __init__(
        self,
        timezone: str,
        *,
        now: Callable[[], datetime] | None = None,
        chat_zone: ChatZone | None = None,
    ) -> None:
        self.default_timezone = timezone
        self._now = now or (lambda: datetime.now(UTC))
        self._chat_zone = chat_zone

    def extract_args(self, text: str) -> dict[str, Any] | None:
        for candidate in _SLASHED_ZONE.findall(text):
            zone = find_zone(candidate)
            if zone is not None:
                return {"timezone": zone.key}
        return _place_in(text)

    async def _zone_of_chat(self, ctx: ToolContext) -> str:
        if self._chat_zone is None:
            return self.default_timezone
        return await self._chat_zone(ctx.answer_to or ctx.origin)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        requested = args.get("timezone") or await self._zone_of_chat(ctx)
        zone = find_zone(requested)
        if zone is None:
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                f"unknown timezone or place {requested!r}: name a city of the time zone "
                "database (like Tokyo or New York) or an IANA zone like Europe/Berlin",
            )
        moment = self._now().astimezone(zone)
        return ToolResult.success(
            describe_moment(moment, zone.key),
            iso=moment.isoformat(timespec="seconds"),
            timezone=zone.key,
            utc_offset=format_offset(moment)[3:],
        )
