"""The console's Audit page: the audit log, newest first, 50 rows a page (keyset by
``seq``: ``?before=`` / ``?after=``), filtered by chat, tool, trace id and time.

What a person sees is limited in the query itself (``scope.Scope``). The rows were
masked when written (``store/audit.AuditWriter``); they are masked again with the
runtime's masker before they are shown, as indented JSON escaped like every value here.
A filter that cannot be read is said so on the page and applies nothing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from ..approvals.display import show_json
from ..store import Tx
from ..store.audit import AuditFilter, AuditRow
from .scope import Scope

if TYPE_CHECKING:
    from aiohttp import web

    from .web import Console, Visitor

PAGE = 50
# A filter's value, at most (characters); longer ones are refused, not cut.
MAX_FILTER = 200
_TRACE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
_SEQ = re.compile(r"^[0-9]{1,18}$")
_DAY = "%Y-%m-%d"
_MINUTE = ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M")
FIELDS = ("chat", "tool", "trace", "from", "to")


@dataclass(frozen=True, slots=True)
class Shown:
    seq: int
    ts: float
    kind: str
    chat: str
    trace_id: str
    summary: str  # its first facts on one line (masked), shown with the row closed
    data: str  # indented JSON, masked, escaped


@dataclass(frozen=True, slots=True)
class Asked:
    """What the page was asked for: the filter, the form's values, what was wrong."""

    wanted: AuditFilter
    values: dict[str, str]
    problems: list[str]


def parse_time(text: str, zone: ZoneInfo, *, end: bool) -> float:
    """``YYYY-MM-DD`` or ``YYYY-MM-DD HH:MM`` in ``zone``, as Unix time; an end is
    inclusive (the whole day, the whole minute). ValueError when it is neither."""
    for form, step in ((_DAY, timedelta(days=1)), *((m, timedelta(minutes=1)) for m in _MINUTE)):
        try:
            at = datetime.strptime(text, form).replace(tzinfo=zone)
        except ValueError:
            continue
        try:
            return (at + step if end else at).timestamp()
        except OverflowError:
            break
    raise ValueError(text)


def asked(query: Any, zone: ZoneInfo) -> Asked:
    values = {name: str(query.get(name, "")).strip() for name in FIELDS}
    problems: list[str] = []
    for name, value in values.items():
        if len(value) > MAX_FILTER:
            problems.append(f"The {name} filter is longer than {MAX_FILTER} characters.")
            values[name] = ""
    trace = values["trace"]
    if trace and not _TRACE.match(trace):
        problems.append("A trace id is letters, digits, '-' and '_' only (at most 64).")
        values["trace"] = trace = ""
    times: dict[str, float | None] = {"from": None, "to": None}
    for name in times:
        if values[name]:
            try:
                times[name] = parse_time(values[name], zone, end=name == "to")
            except ValueError:
                problems.append(
                    f"The '{name}' time is not a date like 2026-03-01 or a time like "
                    "2026-03-01 14:30; it was not applied."
                )
    if times["from"] is not None and times["to"] is not None and times["from"] >= times["to"]:
        problems.append(
            "The 'from' time is after the 'to' time, so no row could match; neither was applied."
        )
        times = {"from": None, "to": None}
    before = query.get("before", "")
    after = query.get("after", "")
    wanted = AuditFilter(
        chat=values["chat"] or None,
        tool=values["tool"] or None,
        trace_id=trace or None,
        since=times["from"],
        until=times["to"],
        before=int(before) if _SEQ.match(before) else None,
        after=int(after) if _SEQ.match(after) and not _SEQ.match(before) else None,
    )
    return Asked(wanted, values, problems)


class AuditPage:
    def __init__(self, console: Console) -> None:
        self.console = console

    async def handle(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        console = self.console
        ask = asked(request.query, console.clock.zone)
        user = visitor.user

        def read(tx: Tx) -> tuple[list[AuditRow], bool, bool]:
            return self._read(tx, Scope.read(tx, user).narrow(ask.wanted))

        rows, newer, older = await console.store.run(read)
        kept = {name: value for name, value in ask.values.items() if value}
        return console.render(
            request,
            "audit.html",
            visitor,
            rows=[self._shown(row) for row in rows],
            values=ask.values,
            problems=ask.problems,
            newer=f"/console/audit?{urlencode({**kept, 'after': rows[0].seq})}" if newer else "",
            older=f"/console/audit?{urlencode({**kept, 'before': rows[-1].seq})}" if older else "",
            trace_link=lambda trace: "/console/audit?" + urlencode({"trace": trace}),
        )

    @staticmethod
    def _read(tx: Tx, wanted: AuditFilter) -> tuple[list[AuditRow], bool, bool]:
        """A page of rows (newest first) and whether there are newer and older ones."""
        if wanted.after is not None:
            rows = tx.audit.page(wanted, PAGE + 1, oldest_first=True)
            if rows:
                newer = len(rows) > PAGE
                rows = rows[:PAGE][::-1]
                older = bool(tx.audit.page(replace(wanted, after=None, before=rows[-1].seq), 1))
                return rows, newer, older
            wanted = replace(wanted, after=None)  # nothing newer: the newest page
        rows = tx.audit.page(wanted, PAGE + 1)
        older = len(rows) > PAGE
        rows = rows[:PAGE]
        newer = bool(rows) and bool(
            tx.audit.page(replace(wanted, before=None, after=rows[0].seq), 1, oldest_first=True)
        )
        return rows, newer, older

    def _shown(self, row: AuditRow) -> Shown:
        masker = self.console.gate.masker
        data = masker.mask_data(row.data)
        return Shown(
            seq=row.seq,
            ts=row.ts,
            kind=row.kind,
            chat=row.session_key or "",
            trace_id=row.trace_id or "",
            summary=_summary(data),
            data=show_json(data),
        )


SUMMARY = 120  # characters of a row's one-line summary


def _summary(data: dict[str, Any]) -> str:
    """A row's facts on one line (``tool=file_write status=approved …``), cut to
    SUMMARY: the whole row is one tap away."""
    parts = []
    for key, value in data.items():
        if value in (None, "", [], {}):
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{key}={' '.join(str(shown).split())}")
    line = " ".join(parts)
    return line if len(line) <= SUMMARY else line[: SUMMARY - 1] + "…"
