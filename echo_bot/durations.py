"""Durations written as "90s", "15m", "2h", "7d" (or a bare number of seconds)."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Longer than anything sensible, short enough for timedelta and datetime arithmetic.
MAX_SECONDS = 100 * 365 * 86400
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _PATTERN.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration (use e.g. '90s', '15m', '2h', '7d')")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    if seconds > MAX_SECONDS:
        raise ValueError(f"a duration must be at most {MAX_SECONDS // 86400}d")
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    total = delta.total_seconds()
    if total != int(total):  # sub-second parts: keep them, "0.5s" must not become "0s"
        return f"{total:.6f}".rstrip("0") + "s"
    seconds = int(total)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
