"""Telegram-side rendering helpers: splitting long text, keyboards, pacing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from echo_bot.events import Button

MAX_TEXT = 4096  # Telegram counts UTF-16 code units, not characters


def _fitting(text: str, limit: int) -> int:
    """How many leading characters of ``text`` fit in ``limit`` UTF-16 code units."""
    units = 0
    for index, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > limit:
            return index
    return len(text)


def split_text(text: str, limit: int = MAX_TEXT) -> list[str]:
    """Split on paragraph, then line, then word boundaries; never lose a character
    (whitespace at a cut aside). Each part is at most ``limit`` UTF-16 code units, as
    Telegram measures, and none is blank (Telegram refuses an empty text)."""
    text = text if text.strip() else "(empty reply)"
    parts: list[str] = []
    rest = text
    while (size := _fitting(rest, limit)) < len(rest):
        size = max(1, size)
        window = rest[:size]
        cut = -1
        for separator in ("\n\n", "\n", " "):
            cut = window.rfind(separator)
            if cut > size // 4:
                cut += len(separator)
                break
        if cut <= size // 4:
            cut = size
        parts.append(rest[:cut].rstrip("\n") or rest[:cut])
        rest = rest[cut:]
    if rest:
        parts.append(rest)
    return [part for part in parts if part.strip()]


def keyboard_rows(buttons: list[list[Button]]) -> list[list[tuple[str, str]]]:
    """(label, callback_data) rows; callback data is the opaque action (≤ 64 bytes)."""
    rows = []
    for row in buttons:
        cells = [(b.label, b.action) for b in row if len(b.action.encode()) <= 64]
        if cells:
            rows.append(cells)
    return rows


class TokenBucket:
    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.clock = clock
        self.updated = clock()

    def delay(self) -> float:
        """Take one token; return how long to wait before using it."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class Pacer:
    """About 1 message/s per chat (small bursts) and 30/s overall, Telegram's limits.

    Telegram counts when a message arrives, not when it left: a send that leaves on
    time can still arrive early next to the one before it (a slower first request, a
    busy loop), and be refused with a 429 and a retry a second later. So the pacer keeps
    ``slack`` (5 %) under each rate; the buckets at Telegram's end then fill a little
    faster than they are drained, which absorbs such jitter."""

    def __init__(
        self,
        per_chat: float = 1.0,
        chat_burst: float = 3,
        overall: float = 30,
        slack: float = 0.05,
    ) -> None:
        self._per_chat = per_chat / (1 + slack)
        self._chat_burst = chat_burst
        self._overall = TokenBucket(overall / (1 + slack), overall)
        self._chats: dict[str, TokenBucket] = {}

    async def wait(self, chat: str) -> None:
        bucket = self._chats.get(chat)
        if bucket is None:
            bucket = self._chats[chat] = TokenBucket(self._per_chat, self._chat_burst)
            if len(self._chats) > 10_000:  # forget idle chats
                self._chats = {chat: bucket}
        delay = max(bucket.delay(), self._overall.delay())
        if delay > 0:
            await asyncio.sleep(delay)
