"""How many bytes of files the inbox takes: per sender per UTC day, and in all.

Files people send are saved in ``<workspace>/inbox/<sender>/<UTC date>/`` (``inbox.py``).
Two budgets bound them, whatever the channel (``[media]``):

- ``daily_bytes_per_sender``: the bytes in one sender's folder of one date. Approvers
  are trusted (docs/SECURITY.md, "Who is trusted") and not counted against it.
- ``inbox_max``: every file under the inbox together, everyone's.

Both are counted from the files themselves, walked off the event loop when a file is
about to be fetched, so a restart, a crash, a deleted file or retention's pruning is
seen as it is; files being fetched at that moment count by their announced size. The
channel is handed what is left as the most it may download, so a file whose size was
not announced stops there. A file refused is a note in the message and a notice to
its sender (``inbound.py``), never a failed turn.

Retention (``[storage] retention``) removes whole date folders older than it
(``prune_inbox``); the folder of the current UTC day never.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Literal

from ..errors import MediaUnavailable
from ..sizes import format_size

log = logging.getLogger(__name__)

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True, slots=True)
class Usage:
    """Bytes on disk: the sender's folder for the day, and the whole inbox."""

    sender_day: int
    total: int
    files: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which budget a file does not fit, and what is left of it."""

    budget: Literal["daily", "inbox"]
    limit: int
    left: int
    resets: datetime | None = None  # the daily budget's next UTC midnight

    def reason(self, size: int | None) -> str:
        """For the model (the note in the message), in the words of the config."""
        it = f"it is {format_size(size)}" if size is not None else "it is larger"
        if self.budget == "daily":
            return (
                f"{it} and {format_size(self.left)} is left of the sender's daily budget for"
                f" files ([media] daily_bytes_per_sender = {format_size(self.limit)}) until"
                " 00:00 UTC"
            )
        return (
            f"{it} and the inbox has {format_size(self.left)} of room left ([media]"
            f" inbox_max = {format_size(self.limit)})"
        )

    def notice(self, what: str, now: datetime) -> str:
        """For the sender."""
        if self.budget == "daily":
            when = "00:00 UTC"
            if self.resets is not None:
                when += f" ({_in(self.resets - now)})"
            return (
                f"I did not save your {what}: you may send {format_size(self.limit)} of files"
                f" a day and {format_size(self.left)} of that is left today. It starts again at"
                f" {when}. Your message itself reached me."
            )
        room = f"the room for files ({format_size(self.limit)} in all)"
        state = (
            f"{room} is full"
            if self.left == 0
            else f"only {format_size(self.left)} of {room} is left"
        )
        return (
            f"I did not save your {what}: {state} until the owner makes room. Your message"
            " itself reached me."
        )


class OverBudget(MediaUnavailable):
    """A file refused by a budget: the note says which, the sender gets ``notice``."""

    def __init__(self, refusal: Refusal, size: int | None) -> None:
        super().__init__(refusal.reason(size))
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Admission:
    """A file may be fetched: at most ``bound.left`` bytes, ``bound`` being the budget
    with the least room; ``token`` releases its place."""

    bound: Refusal
    token: int

    @property
    def limit(self) -> int:
        return self.bound.left


class MediaBudget:
    def __init__(self, inbox: Path, *, daily_per_sender: int, inbox_max: int) -> None:
        self.inbox = inbox
        self.daily_per_sender = daily_per_sender
        self.inbox_max = inbox_max
        self._tokens = itertools.count(1)
        # Files being fetched now: token -> (sender folder, day, announced bytes).
        self._fetching: dict[int, tuple[str, str, int]] = {}

    async def usage(self, folder: str, day: str) -> Usage:
        measured = await asyncio.to_thread(measure, self.inbox, folder, day)
        ours = [(f, d, n) for f, d, n in self._fetching.values()]
        return Usage(
            sender_day=measured.sender_day + sum(n for f, d, n in ours if (f, d) == (folder, day)),
            total=measured.total + sum(n for _f, _d, n in ours),
            files=measured.files,
        )

    async def admit(
        self, folder: str, day: date, announced: int | None, *, exempt: bool
    ) -> Admission:
        """A place for one file of ``folder``'s sender received on ``day``, or
        ``OverBudget`` saying which budget it does not fit."""
        label = day.isoformat()
        used = await self.usage(folder, label)
        room: list[Refusal] = [
            Refusal("inbox", self.inbox_max, max(0, self.inbox_max - used.total))
        ]
        if not exempt:
            resets = datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)
            left = max(0, self.daily_per_sender - used.sender_day)
            room.append(Refusal("daily", self.daily_per_sender, left, resets))
        tightest = min(room, key=lambda r: r.left)
        if tightest.left == 0 or (announced is not None and announced > tightest.left):
            log.info(
                "media: a file of %s (%s) refused: %s budget, %s left",
                folder,
                format_size(announced) if announced is not None else "size unknown",
                tightest.budget,
                format_size(tightest.left),
            )
            raise OverBudget(tightest, announced)
        token = next(self._tokens)
        self._fetching[token] = (folder, label, announced or 0)
        return Admission(bound=tightest, token=token)

    def release(self, admission: Admission) -> None:
        self._fetching.pop(admission.token, None)


def measure(inbox: Path, folder: str | None = None, day: str | None = None) -> Usage:
    """Bytes under ``inbox`` in all, and in ``inbox/folder/day``; never follows links."""
    total = files = 0
    sender_day = 0
    own = inbox / folder / day if folder and day else None
    stack = [inbox]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    total += size
                    files += 1
                    if here == own:
                        sender_day += size
            except FileNotFoundError:  # removed while counted
                continue
    return Usage(sender_day=sender_day, total=total, files=files)


def prune_inbox(inbox: Path, before: date, today: date) -> list[str]:
    """Remove the inbox's date folders of days before ``before`` (never ``today``'s),
    in every sender's folder and in the older layout's ``inbox/<date>/``. Returns what
    was removed, relative to ``inbox``."""
    removed: list[str] = []

    def old_day(entry: os.DirEntry[str]) -> bool:
        if not (_DAY.match(entry.name) and entry.is_dir(follow_symlinks=False)):
            return False
        try:
            day = date.fromisoformat(entry.name)
        except ValueError:
            return False
        return day < before and day != today

    def remove(entry: os.DirEntry[str], name: str) -> None:
        try:
            shutil.rmtree(entry.path)
        except OSError as exc:
            log.warning("media: could not remove %s from the inbox: %s", name, exc)
            return
        removed.append(name)

    try:
        top = list(os.scandir(inbox))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in top:
        if old_day(entry):  # the older layout: inbox/<date>/
            remove(entry, entry.name)
            continue
        if _DAY.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            days = list(os.scandir(entry.path))
        except OSError:
            continue
        for day_entry in days:  # the sender's folder stays: a file may be on its way
            if old_day(day_entry):
                remove(day_entry, f"{entry.name}/{day_entry.name}")
    return removed


def _in(delta: timedelta) -> str:
    minutes = max(1, math.ceil(delta.total_seconds() / 60))
    if minutes < 60:
        return f"in {minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"in {hours} h {rest} min" if rest else f"in {hours} h"
