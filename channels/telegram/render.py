"""Telegram-side sending helpers: its message limit, keyboards, pacing."""

from __future__ import annotations

import time
from collections.abc import Callable

from echo_bot.events import Button
from echo_bot.pacing import Pacer

MAX_TEXT = 4096  # Telegram counts UTF-16 code units, not characters
# Telegram shows "typing…" for 5 s (or until the bot's next message): one per chat per
# 5 s keeps it on while a turn runs.
TYPING_INTERVAL = 5.0


def keyboard_rows(buttons: list[list[Button]]) -> list[list[tuple[str, str]]]:
    """(label, callback_data) rows; callback data is the opaque action (≤ 64 bytes)."""
    rows = []
    for row in buttons:
        cells = [(b.label, b.action) for b in row if len(b.action.encode()) <= 64]
        if cells:
            rows.append(cells)
    return rows


def telegram_pacer(clock: Callable[[], float] = time.monotonic) -> Pacer:
    """About 1 message a second per chat (small bursts) and 30 a second overall,
    Telegram's limits."""
    return Pacer((1.0, 3.0), overall=(30.0, 30.0), clock=clock)
