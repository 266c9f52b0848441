"""A management command run between an upgrade and the daemon's restart: it reads a
store the daemon has not migrated yet. It migrates nothing (that is `echo-bot run`'s, at
its start, as the README says) and says what to do; the daemon's start then migrates."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlite_utils import Database as SqlDb

from echo_bot.store.schema import MIGRATIONS
from tests.conftest import echo_bot_env, run_echo_bot


def version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])
    finally:
        conn.close()


def test_a_command_on_a_store_not_migrated_yet_changes_nothing_and_says_to_restart(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / "echo-bot.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for step in MIGRATIONS[:-1]:  # as the version before the last migration left it
        step(SqlDb(conn))
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute(f"INSERT INTO meta(key, value) VALUES('schema_version', '{len(MIGRATIONS) - 1}')")
    conn.execute("COMMIT")
    conn.close()
    config = tmp_path / "echo-bot.toml"  # for the commands that write: a code, a link
    config.write_text("[telegram]\nenabled = true\n[http]\nport = 0\n[console]\nenabled = true\n")
    env = {**echo_bot_env(), "TELEGRAM_BOT_TOKEN": "123456:" + "A" * 35}
    for command in (["status"], ["approvals", "list"], ["reminders", "list"], ["pair"],
                    ["console", "link"]):  # fmt: skip
        result = run_echo_bot(*command, "--config", str(config), "--state-dir", str(state),
                              env=env)  # fmt: skip
        assert result.returncode != 0, (command, result.stdout)
        assert "restart the daemon" in result.stderr and "Traceback" not in result.stderr
        assert version(path) == len(MIGRATIONS) - 1  # migrated by nobody
    # The daemon's start brings it up to date; the commands then read it.
    ran = run_echo_bot("chat", "--state-dir", str(state), input="/reminders\n")
    assert ran.returncode == 0, ran.stderr
    assert version(path) == len(MIGRATIONS)
    assert run_echo_bot("reminders", "list", "--state-dir", str(state)).returncode == 0
