"""The commands that only look (check-config, status, doctor, the listings) change
nothing where there is no store yet: no schema in an empty PostgreSQL database, no file
in a state directory; they say that `echo-bot run` makes it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import echo_bot_cmd, echo_bot_env, run_echo_bot
from tests.postgres import fresh_database

LOOKING = (
    ("check-config",),
    ("status",),
    ("doctor",),
    ("approvals", "list"),
    ("audit",),
    ("reminders", "list"),
)


def _tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return [str(row[0]) for row in rows]


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_looking_at_an_empty_database_creates_no_schema(tmp_path: Path) -> None:
    config = tmp_path / "pg.toml"
    config.write_text('[storage]\nengine = "postgres"\n')
    with fresh_database() as url:
        env = echo_bot_env(ECHO_BOT_DATABASE_URL=url)
        args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
        for command in LOOKING:
            done = run_echo_bot(*command, *args, env=env)
            assert "Traceback" not in done.stderr, done.stderr
            assert _tables(url) == [], f"`echo-bot {' '.join(command)}` created tables"
            if command[0] in ("status", "approvals", "audit", "reminders"):
                # Nothing is wrong: nothing is there yet (exit 0), and it says why.
                assert done.returncode == 0, done.stdout + done.stderr
                said = done.stdout + done.stderr
                assert "has no echo-bot schema yet; `echo-bot run` creates it" in said
        assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("command", LOOKING, ids=lambda c: " ".join(c))
def test_looking_at_a_new_state_dir_creates_nothing(tmp_path: Path, command: tuple[str]) -> None:
    state = tmp_path / "st"
    done = run_echo_bot(*command, "--state-dir", str(state))
    assert "Traceback" not in done.stderr, done.stderr
    assert not state.exists(), sorted(p.name for p in state.rglob("*"))
    if command[0] in ("status", "approvals", "audit", "reminders"):
        # A state dir the daemon has not used yet: nothing there, nothing wrong.
        assert done.returncode == 0, done.stdout + done.stderr
        assert "`echo-bot run` creates it" in done.stdout + done.stderr
    if command[0] == "status":
        assert "daemon: not running" in done.stdout and "nothing yet" in done.stdout


def _as_another_user(args: list[str]) -> list[str] | None:
    """``args`` run without the power to read another user's files: as root, with the
    capabilities that bypass file permissions dropped (setpriv); as anyone else, as is."""
    if os.geteuid() != 0:
        return args
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps, *args]


def test_a_state_dir_this_user_cannot_read_is_one_clear_line(tmp_path: Path) -> None:
    """The owner forgot `sudo -u echo-bot`: every command says so, none a traceback."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "echo-bot.sqlite3").touch()
    state.chmod(0o000)
    try:
        for command in [*LOOKING[1:], ("backup", str(tmp_path))]:
            argv = _as_another_user(echo_bot_cmd(*command, "--state-dir", str(state)))
            if argv is None:
                pytest.skip("setpriv is not installed: as root nothing is unreadable")
            done = subprocess.run(argv, capture_output=True, text=True, env=echo_bot_env(),
                                  timeout=30)  # fmt: skip
            assert done.returncode != 0 and "Traceback" not in done.stderr, (command, done.stderr)
            assert "permission denied" in done.stderr.lower(), (command, done.stderr)
    finally:
        state.chmod(0o700)


def test_the_commands_that_only_look_read_beside_a_write_in_progress(tmp_path: Path) -> None:
    """The daemon is writing (its write lock held): status and the listings read beside
    it, as WAL lets them, and take no write lock of their own (they waited the whole
    busy timeout and failed 'database is locked'; a long listing held the daemon's
    writes off)."""
    state = tmp_path / "state"
    made = run_echo_bot("chat", "--state-dir", str(state), input="/help\n")
    assert made.returncode == 0, made.stderr
    writer = sqlite3.connect(state / "echo-bot.sqlite3", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # a daemon's transaction, in progress
        for command in LOOKING[1:]:
            if command == ("doctor",):
                continue
            done = run_echo_bot(*command, "--state-dir", str(state))
            assert done.returncode == 0, (command, done.stderr)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    for count in (["audit", "--tail", "-1"], ["webhook", "deliveries", "--limit", "0"]):
        refused = run_echo_bot(*count, "--state-dir", str(state))  # -1 listed every row
        assert refused.returncode == 2 and "is not 1 or more" in refused.stderr, count
