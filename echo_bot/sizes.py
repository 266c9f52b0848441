"""Sizes in bytes as people write them in a config ("20MB", "512 KB") and read them."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3}  # fmt: skip
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
MAX_BYTES = 1000**4  # a terabyte: anything larger is a typo


def parse_size(value: str | int) -> int:
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '20MB'")
    if isinstance(value, int):
        size = value
    else:
        match = _PATTERN.match(str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            raise ValueError(
                f"{value!r} is not a size (use e.g. '512KB', '20MB', '1GB'; the units are B, KB,"
                " MB, GB and KiB, MiB, GiB, up to 1000GB)"
            )
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError("a size must be positive")
    if size > MAX_BYTES:
        raise ValueError("a size must be at most 1000GB")
    return size


def format_size(size: int) -> str:
    """``size`` bytes for a reader: "950 B", "12.3 KB", "4.0 MB" (decimal units)."""
    if size < 1000:
        return f"{size} B"
    for unit in ("KB", "MB", "GB"):
        size_in = size / 1000
        if size_in < 1000 or unit == "GB":
            return f"{size_in:.1f} {unit}"
        size = int(size_in)
    return f"{size} GB"  # not reached
