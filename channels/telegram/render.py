"""Telegram-side sending helpers: its message limit, keyboards, pacing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from channels.parts import TokenBucket
from echo_bot.events import Button

MAX_TEXT = 4096  # Telegram counts UTF-16 code units, not characters
# Telegram shows "typing…" for 5 s (or until the bot's next message): one per chat per
# 5 s keeps it on while a turn runs, and no more than that is ever sent.
TYPING_INTERVAL = 5.0


def keyboard_rows(buttons: list[list[Button]]) -> list[list[tuple[str, str]]]:
    """(label, callback_data) rows; callback data is the opaque action (≤ 64 bytes)."""
    rows = []
    for row in buttons:
        cells = [(b.label, b.action) for b in row if len(b.action.encode()) <= 64]
        if cells:
            rows.append(cells)
    return rows


class Pacer:
    """About 1 message/s per chat (small bursts) and 30/s overall, Telegram's limits.

    Telegram counts when a message arrives, not when it left: a send that leaves on
    time can still arrive early next to the one before it (a slower first request, a
    busy loop), and be refused with a 429 and a retry a second later. So the pacer keeps
    ``slack`` (5 %) under each rate; the buckets at Telegram's end then fill a little
    faster than they are drained, which absorbs such jitter.

    Typing indicators (``typing``) are the lowest priority: at most one per chat per
    ``TYPING_INTERVAL``, each taken from the overall budget but only from its spare
    (while more than half the overall burst is left), never waited for and never from
    a chat's message budget. So replies never queue behind typing: under a load that
    uses the overall budget, typing is what is left out."""

    def __init__(
        self,
        per_chat: float = 1.0,
        chat_burst: float = 3,
        overall: float = 30,
        slack: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_chat = per_chat / (1 + slack)
        self._chat_burst = chat_burst
        self._overall = TokenBucket(overall / (1 + slack), overall, clock)
        self._typing_reserve = overall / 2
        self._chats: dict[str, TokenBucket] = {}
        self._typed_at: dict[str, float] = {}
        self._previewed_at: dict[str, float] = {}
        self._previews_paused_until = 0.0
        self.clock = clock

    async def wait(self, chat: str) -> None:
        delay = self.reserve(chat)
        if delay > 0:
            await asyncio.sleep(delay)

    def reserve(self, chat: str) -> float:
        """Count one message to ``chat``; the seconds to wait before sending it."""
        bucket = self._chats.get(chat)
        if bucket is None:
            bucket = self._chats[chat] = TokenBucket(self._per_chat, self._chat_burst, self.clock)
            if len(self._chats) > 10_000:  # forget idle chats
                self._chats = {chat: bucket}
        return max(bucket.delay(), self._overall.delay())

    def preview(self, chat: str, interval: float) -> float:
        """May a preview (a draft, an edit of a reply being written) go to ``chat`` now?
        0.0: yes, and it is counted; otherwise the seconds until it may. At most one per
        ``interval`` per chat, and only from spare budget: one message of the chat's
        own and half the overall burst are always left for real messages."""
        now = self.clock()
        wait = self._previewed_at.get(chat, -1e9) + interval - now
        if now < self._previews_paused_until:
            wait = max(wait, self._previews_paused_until - now)
        bucket = self._chats.get(chat)
        if bucket is None:
            bucket = self._chats[chat] = TokenBucket(self._per_chat, self._chat_burst, self.clock)
        wait = max(
            wait, bucket.wait_for_spare(1), self._overall.wait_for_spare(self._typing_reserve)
        )
        if wait > 0:
            return wait
        bucket.take()
        self._overall.take()
        if len(self._previewed_at) > 10_000:  # forget idle chats
            self._previewed_at = {}
        self._previewed_at[chat] = now
        return 0.0

    def pause_previews(self, seconds: float) -> None:
        """Telegram said 429 to a preview: none goes anywhere for ``seconds``."""
        self._previews_paused_until = max(self._previews_paused_until, self.clock() + seconds)

    def typing(self, chat: str) -> float:
        """May a typing indicator go to ``chat`` now? 0.0: yes (and it is counted);
        otherwise the seconds until it may."""
        now = self.clock()
        last = self._typed_at.get(chat)
        if last is not None and now - last < TYPING_INTERVAL:
            return TYPING_INTERVAL - (now - last)
        wait = self._overall.spare(self._typing_reserve)
        if wait > 0:
            return wait
        if len(self._typed_at) > 10_000:  # forget idle chats
            self._typed_at = {c: t for c, t in self._typed_at.items() if now - t < TYPING_INTERVAL}
        self._typed_at[chat] = now
        return 0.0
