"""Work that waits for the store to come back (PostgreSQL restarting, the network
between) instead of failing: tried again while it fails with ``StoreUnavailable``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import StoreError, StoreUnavailable

T = TypeVar("T")

# The first pause after the store went away, doubling up to the second.
STORE_RETRY_FIRST = 0.5
STORE_RETRY_MAX = 15.0


async def once_the_store_is_back(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    stopping: Callable[[], bool],
    log: logging.Logger,
    *,
    retried: type[StoreError] = StoreUnavailable,
) -> T | None:
    """``attempt()``, again while it fails with StoreUnavailable (after 0.5 s, doubling
    to 15 s), each pause said on the caller's ``log``; None when ``stopping()`` says the
    caller stops meanwhile (the work stays in the store for the next start).
    ``retried=StoreError``: with any store error (work that must not be left undone
    while the store refuses it for a reason of its own, as a write lock held elsewhere)."""
    pause = STORE_RETRY_FIRST
    while True:
        try:
            return await attempt()
        except retried as exc:
            if stopping():
                return None
            log.warning("%s paused (%s); again in %.1f s", what, exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, STORE_RETRY_MAX)
