"""Retention prunes finished work only; backups are consistent and restorable."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from echo_bot.housekeeping import Housekeeping
from echo_bot.store import DB_FILENAME
from tests.conftest import ROOT, run_echo_bot, running_bot
from tests.proc import EchoBotProcess

SHELL = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""


async def test_prune_removes_old_finished_work_and_keeps_pending_work(state_dir: Path) -> None:
    async with running_bot(state_dir, SHELL) as bot:
        done = await bot.channel.say("what time is it?")
        await bot.channel.reply_to(done)
        waiting = await bot.channel.say("/run touch x")
        await bot.channel.prompt_for(waiting)
        kept = await bot.channel.reply_to(await bot.channel.say("/remind in 2 hours kept"))
        set_one = await bot.channel.reply_to(await bot.channel.say("/remind in 3 hours gone"))
        gone = re.search(r"\(id ([0-9a-f]+)\)", set_one.text)
        assert gone is not None and "(id " in kept.text
        await bot.channel.reply_to(await bot.channel.say(f"/cancel {gone.group(1)}"))
        future = time.time() + 3600  # everything is "old" relative to this cut-off
        counts = await bot.store.run(lambda tx: tx.meta.prune(future))
        assert counts["inbox"] >= 1 and counts["audit"] >= 1
        reminders = await bot.db.run(
            lambda db: db.execute("SELECT text, status FROM reminders").fetchall()
        )
        assert [tuple(r) for r in reminders] == [("kept", "active")]  # the cancelled one gone
        # Finished turns go with their calls; the one waiting for its approval stays.
        assert counts["turns"] >= 1 and counts["tool_calls"] >= 1
        turns = await bot.db.run(lambda db: db.execute("SELECT status FROM turns").fetchall())
        assert [r[0] for r in turns] == ["waiting"]
        calls = await bot.db.run(lambda db: db.execute("SELECT name FROM tool_calls").fetchall())
        assert [r[0] for r in calls] == ["shell_exec"]
        rows = await bot.db.run(lambda db: db.execute("SELECT id, status FROM inbox").fetchall())
        assert (waiting, "waiting_approval") in [tuple(r) for r in rows]
        assert done not in [r[0] for r in rows]
        pending = await bot.db.run(
            lambda db: db.execute(
                "SELECT COUNT(*) FROM approvals WHERE status='pending'"
            ).fetchone()[0]
        )
        assert pending == 1
        # The pending request still works after pruning: approve it.
        prompt = await bot.channel.prompt_for(waiting)
        await bot.channel.press(prompt.buttons[0][0].action)
        reply = await bot.channel.reply_to(waiting)
        assert "exit code 0" in reply.text


async def test_a_prune_of_months_of_rows_lets_a_turn_through_meanwhile(
    on_both_engines: str, state_dir: Path
) -> None:
    """A first prune, or a retention shortened, deletes months of audit rows: a batch a
    transaction, so a message that comes meanwhile is answered before the prune ends
    (in one transaction it waited for all of it, and so did the daemon's heartbeat)."""
    old = time.time() - 90 * 86400
    kept_a_year = '[storage]\nretention = "365d"\n'  # the daemon's own prune leaves them
    async with running_bot(state_dir, kept_a_year) as bot:
        # Rows enough that one transaction deleting them all outlasts a turn (SQLite
        # deletes fast; PostgreSQL runs the store's jobs one after another anyway).
        rows, batch = (4_000, 10) if on_both_engines == "postgres" else (100_000, 500)

        def months(db: Any) -> None:
            for _ in range(rows):
                db.execute("INSERT INTO audit (ts, kind, data) VALUES (?, 'old', '{}')", [old])

        await bot.db.run(months)
        cut = time.time() - 30 * 86400
        house = Housekeeping(bot.store, retention=0, batch=batch)
        pruning = asyncio.create_task(house.prune(cut))
        await asyncio.sleep(0)
        reply = await bot.channel.reply_to(await bot.channel.say("what time is it?"))
        answered_first = not pruning.done()
        counts = await pruning
        kept = await bot.db.run(
            lambda db: db.execute("SELECT COUNT(*) FROM audit WHERE kind = 'old'").fetchone()[0]
        )
    assert reply.text.startswith("It is"), reply.text
    assert answered_first
    assert counts["audit"] == rows and kept == 0


async def test_a_daemon_started_on_an_empty_store_file_says_so_and_works(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / DB_FILENAME).touch()
    caplog.set_level(logging.WARNING, "echo_bot.store.db")
    async with running_bot(state_dir) as bot:
        reply = await bot.channel.reply_to(await bot.channel.say("what time is it?"))
    assert reply.text.startswith("It is"), reply.text
    said = [r.getMessage() for r in caplog.records if "is empty (0 bytes)" in r.getMessage()]
    assert len(said) == 1 and "restore a backup" in said[0], said


def test_retention_below_seven_days_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[storage]\nretention = "2d"\n')
    result = run_echo_bot("check-config", "--config", str(config))
    assert result.returncode == 2
    assert "storage.retention" in result.stderr


def test_backup_while_the_daemon_runs_is_consistent_and_restores(tmp_path: Path) -> None:
    state = tmp_path / "st"
    bot = EchoBotProcess("chat", "--state-dir", str(state))
    try:
        bot.expect_stderr(r"^state: ")
        for n in range(20):
            bot.send(f"/remind in {n + 2} hours item {n}")
            bot.expect_stdout(rf"item {n}")
        backup = tmp_path / "backup.sqlite3"
        result = run_echo_bot("backup", str(backup), "--state-dir", str(state))
        assert result.returncode == 0, result.stderr
        assert "consistent" in result.stdout
        bot.close_stdin()
        assert bot.wait() == 0
    finally:
        bot.cleanup()
    with sqlite3.connect(backup) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT COUNT(*) FROM reminders").fetchone()[0] == 20
    # Restore: the copy replaces the store (and its WAL files) of a fresh state dir.
    restored = tmp_path / "restored"
    restored.mkdir()
    (restored / "echo-bot.sqlite3").write_bytes(backup.read_bytes())
    listed = run_echo_bot("reminders", "list", "--state-dir", str(restored))
    assert listed.returncode == 0
    assert sum("item" in line for line in listed.stdout.splitlines()) == 20
    assert ROOT.exists()


KEEP_WRITING = """
import sqlite3, sys
writer = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
n = 0
while True:
    writer.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('beat', ?)", [n])
    n += 1
"""


def test_a_backup_finishes_while_another_process_keeps_writing(tmp_path: Path) -> None:
    """The daemon writes every few seconds at least (its heartbeat), a busy one all the
    time: a backup of a store larger than one copy step still finishes, consistent."""
    from concurrent.futures import ThreadPoolExecutor

    from echo_bot.store.db import Database, backup_to

    store = tmp_path / "echo-bot.sqlite3"
    db = Database(store)
    db.open_sync()
    db.close_sync()
    with sqlite3.connect(store) as conn:  # ~12 MB: a dozen of the old 1,024-page steps
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [(f"filler:{n}", "x" * 3000) for n in range(4000)],
        )
    # Another process, as the daemon is: each write it makes restarts a step-wise copy.
    writer = subprocess.Popen([sys.executable, "-c", KEEP_WRITING, str(store)])
    pool = ThreadPoolExecutor(1)
    try:
        deadline = time.monotonic() + 30
        while not _written(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        # A bound for a hang, not a speed: the step-wise copy never finished here.
        pages = pool.submit(backup_to, store, tmp_path / "backup.sqlite3").result(60)
    finally:
        writer.kill()  # first: a copy still restarting then ends
        writer.wait()
        pool.shutdown()
    assert pages > 1024
    with sqlite3.connect(tmp_path / "backup.sqlite3") as conn:
        copied = conn.execute("SELECT COUNT(*) FROM meta WHERE key LIKE 'filler:%'").fetchone()
    assert copied[0] == 4000


def _written(store: Path) -> bool:
    with contextlib.closing(sqlite3.connect(store, timeout=30)) as conn:
        return conn.execute("SELECT 1 FROM meta WHERE key = 'beat'").fetchone() is not None
