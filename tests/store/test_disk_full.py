"""A disk that fills (here: the process may write no larger file, RLIMIT_FSIZE, which
the kernel answers as a full disk does): the store's work waits for room as for a store
that is away — never a failure of the turn — and /healthz says why."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

import pytest

from echo_bot.errors import StoreUnavailable
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store, Tx


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


async def test_a_write_ahead_log_a_reader_keeps_from_being_cut_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sqlite3 shell (or a replicator) left reading: the WAL cannot start over and
    grows with every write. The log says so, once per WAL_WARN_EVERY, not never."""
    import asyncio
    import contextlib
    import functools
    import sqlite3

    from echo_bot.store import db as store_db

    monkeypatch.setattr(store_db, "WAL_LIMIT", 1)  # any WAL is "too long" here
    monkeypatch.setattr(store_db, "CHECKPOINT_INTERVAL", 0.05)
    caplog.set_level(logging.WARNING, logger="echo_bot.store.db")
    db = Database(tmp_path / "echo-bot.sqlite3")
    await db.open()
    store = Store(db, Masker())
    with contextlib.closing(sqlite3.connect(tmp_path / "echo-bot.sqlite3")) as shell:
        try:
            await store.run(lambda tx: tx.meta.set_note("first", "x"))
            shell.execute("BEGIN")
            shell.execute("SELECT COUNT(*) FROM meta").fetchone()  # a read kept open
            for key in ("n0", "n1", "n2", "n3", "n4"):
                await store.run(functools.partial(_note, key=key))
                await asyncio.sleep(0.1)
        finally:
            shell.execute("COMMIT")
            await store.close()
    said = [r.getMessage() for r in caplog.records if "cannot be cut" in r.getMessage()]
    assert len(said) == 1 and "another connection keeps reading" in said[0], said


def _note(tx: Tx, *, key: str) -> None:
    tx.meta.set_note(key, "y" * 10_000)
