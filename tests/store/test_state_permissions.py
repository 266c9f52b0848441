"""The state dir, the store and its backups are private, whatever the umask and
whatever made the dir before (a hand-made dir, systemd's default 0755)."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env

PERMISSIVE_UMASK = 0o000


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def start_daemon(state: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        echo_bot_cmd("run", "--state-dir", str(state)),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=echo_bot_env(), cwd=ROOT, umask=PERMISSIVE_UMASK,
    )  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, f"the daemon exited ({proc.poll()}) before it was ready"
        if line.startswith("stop with"):
            return proc
    raise AssertionError("no banner within 30 s")


def test_attack_world_readable_state_dir_and_store_are_made_private_at_start(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    state.mkdir()
    state.chmod(0o755)  # made before, by hand or by systemd's default StateDirectoryMode
    db = state / "echo-bot.sqlite3"
    os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o644))  # an old store (empty is valid)
    db.chmod(0o644)
    daemon = start_daemon(state)
    try:
        files = [db, state / "echo-bot.sqlite3-wal", state / "echo-bot.sqlite3-shm"]
        assert all(path.exists() for path in files)
        assert mode(state) == 0o700
        assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}
        backup = tmp_path / "backups" / "copy.sqlite3"
        backup.parent.mkdir()  # backup writes into an existing directory only
        result = subprocess.run(
            echo_bot_cmd("backup", str(backup), "--state-dir", str(state)),
            capture_output=True, text=True, env=echo_bot_env(), cwd=ROOT,
            umask=PERMISSIVE_UMASK, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert mode(backup) == 0o600, "a backup holds everything the store does"
    finally:
        daemon.terminate()
        assert daemon.wait(20) == 0


def test_a_fresh_store_is_private_under_a_permissive_umask(tmp_path: Path) -> None:
    state = tmp_path / "new" / "st"
    daemon = start_daemon(state)
    try:
        assert mode(state) == 0o700
        for suffix in ("", "-wal", "-shm"):
            assert mode(state / f"echo-bot.sqlite3{suffix}") == 0o600, suffix
    finally:
        daemon.terminate()
        assert daemon.wait(20) == 0
