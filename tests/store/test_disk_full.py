"""A disk that fills (here: the process may write no larger file, RLIMIT_FSIZE, which
the kernel answers as a full disk does): the store's work waits for room as for a store
that is away — never a failure of the turn — and /healthz says why."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from echo_bot.errors import StoreUnavailable
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store


async def test_a_full_disk_holds_the_work_and_says_so_until_there_is_room(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path / "echo-bot.sqlite3")
    await db.open()
    store = Store(db, Masker())
    try:
        await store.run(lambda tx: tx.meta.set_note("small", "x"))
        largest = max(p.stat().st_size for p in tmp_path.iterdir())
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        big = "y" * 4_000_000
        resource.setrlimit(resource.RLIMIT_FSIZE, (largest + 64 * 1024, hard))
        try:
            with pytest.raises(StoreUnavailable, match=r"full|disk|I/O"):
                await store.run(lambda tx: tx.meta.set_note("big", big))
            health = store.health()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert health["status"] == "degraded", health
        await store.run(lambda tx: tx.meta.set_note("big", big))  # room again: it goes in
        assert store.health() == {"status": "ok"}
        kept = await store.run(lambda tx: tx.meta.note("big"))
        assert kept is not None and kept[0] == big
    finally:
        await store.close()
