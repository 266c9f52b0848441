"""The console's pages from Jinja2 templates (``console/templates``), escaped twice over:
autoescape makes every value inert HTML, and the ``shown`` filter makes characters that
could hide, reorder or fake text visible as escapes, as a chat prompt does
(``approvals/display.py``)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import jinja2
import markupsafe

from ..approvals.display import clip, escape_text


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("echo_bot.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shown"] = lambda value: escape_text(str(value))
    env.filters["clip"] = lambda value, limit=64: clip(str(value), int(limit))
    env.filters["code"] = code_spans
    return env


def code_spans(value: object) -> markupsafe.Markup:
    """A message's text with its `backquoted` parts as code, the rest escaped (the texts
    are the ones a chat or the terminal shows, written with backquotes)."""
    parts = str(value).split("`")
    if len(parts) % 2 == 0:  # an unpaired backquote: shown as it is
        return markupsafe.escape(str(value))
    return markupsafe.Markup("").join(
        markupsafe.Markup("<code>{}</code>").format(part) if n % 2 else markupsafe.escape(part)
        for n, part in enumerate(parts)
    )


class Clock:
    """Times as people read them, in the daemon's time zone."""

    def __init__(self, zone: str) -> None:
        self.zone = ZoneInfo(zone)
        self.name = zone

    def at(self, ts: float | None) -> str:
        if ts is None:
            return "—"
        return datetime.fromtimestamp(ts, self.zone).strftime("%Y-%m-%d %H:%M:%S")

    def short(self, ts: float | None) -> str:
        if ts is None:
            return "—"
        return datetime.fromtimestamp(ts, self.zone).strftime("%H:%M:%S")

    @staticmethod
    def until(ts: float, now: float | None = None) -> str:
        left = ts - (time.time() if now is None else now)
        if left <= 0:
            return "now"
        return "in " + span(left)

    @staticmethod
    def ago(ts: float, now: float | None = None) -> str:
        gone = (time.time() if now is None else now) - ts
        return span(max(0.0, gone)) + " ago"

    def context(self) -> dict[str, Any]:
        return {"at": self.at, "short": self.short, "until": self.until, "ago": self.ago}


def span(seconds: float) -> str:
    """A length of time as people say it: "45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if whole < 3600:
        return f"{minutes} min"
    if whole < 86400:
        return f"{hours} h {minutes % 60} min"
    return f"{days} d {hours % 24} h"
