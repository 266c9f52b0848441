"""What keeps a long-running daemon tidy and its owner told: finished work and the
inbox's files pruned after the retention (at start, then daily), and a warning for each
address that names a channel this daemon does not run."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from .config import Config, triggers
from .media.budget import prune_inbox
from .store import Store, Tx

log = logging.getLogger(__name__)

PRUNE_EVERY = 86400.0
PRUNE_BATCH = 2_000  # rows of each large table one pruning transaction deletes


class Housekeeping:
    def __init__(
        self, store: Store, *, retention: float, inbox: Path | None = None, batch: int = PRUNE_BATCH
    ) -> None:
        self._store = store
        self._batch = batch
        self._retention = retention
        self._inbox = inbox
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._prune_daily(), name="housekeeping")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def prune(self, before: float) -> dict[str, int]:
        """Delete finished rows last touched before ``before``, PRUNE_BATCH rows of each
        large table a transaction. Between two, the store's other work goes on: months of
        audit rows deleted in one (a first prune, a retention shortened) would hold
        SQLite's writer, and on PostgreSQL the store's thread, heartbeats with it, for as
        long as it takes."""
        total: dict[str, int] = {}
        again: set[str] | None = None  # the first time, every table
        while again is None or again:
            counts = await self._store.run(partial(_prune, before, self._batch, again), slow=True)
            for table, count in counts.items():
                total[table] = total.get(table, 0) + count
            again = {table for table, count in counts.items() if count >= self._batch}
            if "tool_calls" in again:  # a turn goes once none of its calls is left
                again.add("turns")
            await asyncio.sleep(0)
        return total

    async def prune_files(self, before: float, now: float | None = None) -> list[str]:
        """Remove the inbox's date folders of UTC days wholly before ``before`` (never the
        current day's), off the event loop; what was removed."""
        if self._inbox is None:
            return []
        today = datetime.fromtimestamp(time.time() if now is None else now, UTC).date()
        # A folder holds its whole day: it goes once the day's end is past ``before``.
        cut = datetime.fromtimestamp(before, UTC).date()
        return await asyncio.to_thread(prune_inbox, self._inbox, cut, today)

    async def _prune_daily(self) -> None:
        while True:
            try:
                counts = await self.prune(before=time.time() - self._retention)
                if any(counts.values()):
                    log.info("pruned finished work older than the retention: %s", counts)
            except Exception:  # housekeeping must never stop the daemon
                log.exception("pruning failed; trying again tomorrow")
            try:
                removed = await self.prune_files(before=time.time() - self._retention)
                if removed:
                    log.info("pruned %d inbox date folder(s) past the retention", len(removed))
            except Exception:
                log.exception("pruning the inbox failed; trying again tomorrow")
            await asyncio.sleep(PRUNE_EVERY)


def _prune(before: float, batch: int, only: set[str] | None, tx: Tx) -> dict[str, int]:
    return tx.meta.prune(before, batch=batch, only=only)


def warn_unreachable(config: Config, running: Iterable[str]) -> None:
    """Results for a channel that is not running wait in the outbox: say so."""
    here = set(running)
    targets = [(f"{name} {t.who}", t.deliver_to) for name, t in triggers(config)]
    targets += [(f"cron job {j.name}", j.deliver_to) for j in config.cron]
    targets.append(("[approvals] default_chat", config.approvals.default_chat))
    for what, address in targets:
        channel = address.split(":", 1)[0] if address else None
        if channel and channel not in here:
            log.warning(
                "%s delivers to %s, but the %s channel is not running here; its"
                " messages wait in the outbox until it does",
                what,
                address,
                channel,
            )
