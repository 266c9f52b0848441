"""Reminders across real `echo-bot chat` processes: SIGKILL before the due time, start
again after it, and the reminder arrives once — late-marked when it is late — and never
again on a further restart. `echo-bot reminders list|cancel` work beside a daemon."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import read_store, run_echo_bot
from tests.proc import EchoBotProcess

# Slow: real echo-bot processes, started, stopped or killed, and started again, several
# seconds of a core each (`pytest -m "not slow"`, the inner loop, leaves them to the
# full run).
pytestmark = pytest.mark.slow

ID = re.compile(r"\(id ([0-9a-f]{8})\)")


@contextmanager
def chat(state: Path) -> Iterator[EchoBotProcess]:
    """`echo-bot chat` with stdin kept open: it keeps running and prints what arrives."""
    bot = EchoBotProcess("chat", "--state-dir", str(state))
    try:
        bot.expect_stderr(r"^state: ")
        yield bot
    finally:
        bot.cleanup()


def create(bot: EchoBotProcess, text: str, when: str) -> str:
    bot.send(f'/tool reminder_create {{"text": "{text}", "when": "{when}"}}')
    line = bot.expect_stdout(r"OK, I will remind you|⚠️")
    match = ID.search(line)
    assert match, line
    return match.group(1)


def quiet_until_answered(bot: EchoBotProcess) -> None:
    """Ask something and wait for its answer: anything queued for this chat before it
    (such as a reminder fired at start) is delivered first, in order."""
    bot.send("what time is it?")
    bot.expect_stdout(r"^It is ")


def reminder_lines(bot: EchoBotProcess, text: str) -> list[str]:
    return [line for line in bot.stdout_lines if line.startswith(f"⏰ {text}")]


@contextmanager
def store(state: Path) -> Iterator[sqlite3.Connection]:
    """The daemon's SQLite file, opened directly (committed and closed after)."""
    db = sqlite3.connect(state / "echo-bot.sqlite3", timeout=10)
    try:
        with db:
            yield db
    finally:
        db.close()


def reminder_row(state: Path, rid: str) -> tuple[float, str, int]:
    row = read_store(state, lambda tx: tx.reminders.get(rid))
    assert row is not None
    return row.next_at, row.status, row.fired_count


def test_reminder_due_while_killed_arrives_once_after_restart(tmp_path: Path) -> None:
    state = tmp_path / "st"
    with chat(state) as first:
        rid = create(first, "tea", "in 3 seconds")
        first.kill9()  # before it is due
    assert reminder_lines(first, "tea") == []
    next_at, status, _ = reminder_row(state, rid)
    assert status == "active"
    while time.time() < next_at + 0.5:  # stay down until it is due
        time.sleep(0.1)

    with chat(state) as second:
        second.expect_stdout(r"^⏰ tea")
        quiet_until_answered(second)
        assert reminder_lines(second, "tea") == ["⏰ tea"]  # a few seconds late: no note
        second.kill9()
    assert reminder_row(state, rid)[1:] == ("done", 1)

    with chat(state) as third:
        quiet_until_answered(third)
        assert reminder_lines(third, "tea") == []


def test_reminder_hours_overdue_says_it_is_late_and_comes_once(tmp_path: Path) -> None:
    state = tmp_path / "st"
    with chat(state) as first:
        rid = create(first, "call the bank", "in 1 hour")
        first.kill9()
    # As if the daemon had been down since 2 h 13 min before now, when it was due:
    with store(state) as db:
        db.execute("UPDATE reminders SET next_at = ? WHERE id = ?", [time.time() - 7980 - 1, rid])

    with chat(state) as second:
        line = second.expect_stdout(r"^⏰ call the bank")
        assert line == "⏰ call the bank (late by 2 h 13 min — I was offline)"
        quiet_until_answered(second)
        assert len(reminder_lines(second, "call the bank")) == 1
        second.kill9()  # no clean shutdown: the store alone must remember it fired
    assert reminder_row(state, rid)[1:] == ("done", 1)

    with chat(state) as third:
        quiet_until_answered(third)
        assert reminder_lines(third, "call the bank") == []
        third.close_stdin()
        assert third.wait() == 0


def test_shell_list_and_cancel_beside_a_running_chat(tmp_path: Path) -> None:
    state = tmp_path / "st"
    with chat(state) as bot:
        tea = create(bot, "tea", "in 5 seconds")
        cancelled = run_echo_bot("reminders", "cancel", tea, "--state-dir", str(state))
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert f"Cancelled reminder {tea}" in cancelled.stdout
        # Created after the cancel, due after the tea would have been:
        coffee = create(bot, "coffee", "in 5 seconds")

        listed = run_echo_bot("reminders", "list", "--state-dir", str(state))
        assert listed.returncode == 0, listed.stderr
        [line] = listed.stdout.splitlines()
        assert line.startswith(coffee)
        assert line.endswith("coffee  [cli:local]")
        assert re.search(r"\w+day \d{1,2} [A-Z][a-z]+ \d{4} \d{2}:\d{2} UTC", line)

        again = run_echo_bot("reminders", "cancel", tea, "--state-dir", str(state))
        assert again.returncode == 1
        assert "already cancelled" in again.stdout
        unknown = run_echo_bot("reminders", "cancel", "0badf00d", "--state-dir", str(state))
        assert unknown.returncode == 1
        assert "no reminder 0badf00d" in unknown.stdout

        # The later reminder arrives; the cancelled, earlier one never did.
        bot.expect_stdout(r"^⏰ coffee")
        quiet_until_answered(bot)
        assert reminder_lines(bot, "tea") == []
        assert reminder_lines(bot, "coffee") == ["⏰ coffee"]
        bot.close_stdin()
        assert bot.wait() == 0
    assert reminder_row(state, tea)[1] == "cancelled"
    empty = run_echo_bot("reminders", "list", "--state-dir", str(state))
    assert empty.stdout.strip() == "No active reminders."
