"""Stopping: the first signal waits for running turns, a second one exits at once —
and the store stays consistent either way."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import time
from pathlib import Path

from echo_bot.errors import StoreError
from tests.conftest import read_store
from tests.proc import EchoBotProcess

CONFIG = """
[bot]
shutdown_timeout = "30s"
[tools]
profile = "coding"
[tools.shell]
enabled = true
allow_commands = ["sleep *"]
"""


def wait_until_started(state: Path, timeout: float = 15.0) -> None:
    """Until the store says a tool call has started (its process is running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(StoreError, sqlite3.Error):  # not made yet: never made here
            if read_store(state, lambda tx: tx.turns.call_count(started=True)):
                return
        time.sleep(0.05)
    raise AssertionError("no tool call started")


def test_a_second_signal_exits_at_once_and_the_store_survives(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    state = tmp_path / "st"
    args = ("chat", "--config", str(config), "--state-dir", str(state))
    bot = EchoBotProcess(*args)
    try:
        bot.expect_stderr(r"^state: ")
        bot.send("/run sleep 20")
        wait_until_started(state)  # the command is running now
        bot.proc.send_signal(signal.SIGTERM)
        bot.expect_stderr(r"stopping")
        # A bounded negative check: after "stopping" the daemon says nothing more while
        # it waits for the turn, so the wait is given a moment to be seen.
        time.sleep(0.5)
        assert bot.proc.poll() is None, "the first signal waits for the running turn"
        started = time.monotonic()
        bot.proc.send_signal(signal.SIGTERM)
        code = bot.wait(10)
        assert time.monotonic() - started < 5
        assert code != 0
    finally:
        bot.cleanup()
    with sqlite3.connect(state / "echo-bot.sqlite3") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    again = EchoBotProcess(*args)
    try:
        again.expect_stdout(r"OUTCOME_UNKNOWN")  # reported, not run again
        again.close_stdin()
        assert again.wait() == 0
    finally:
        again.cleanup()
