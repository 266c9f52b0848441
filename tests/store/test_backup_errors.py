"""`echo-bot backup` as the user ran it: into a directory, to paths that cannot be
written, out of a damaged store. One line and exit code 2 on failure, nothing left."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import sqlite3
import subprocess
from pathlib import Path

from echo_bot.store import DB_FILENAME, Database
from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env, run_echo_bot


def make_store(state: Path, rows: int = 0) -> Path:
    db = Database(state / DB_FILENAME)
    db.open_sync()
    db.close_sync()
    if rows:
        with contextlib.closing(sqlite3.connect(state / DB_FILENAME)) as conn, conn:
            conn.execute("CREATE TABLE filler (x TEXT)")
            conn.execute("CREATE INDEX filler_x ON filler (x)")
            conn.executemany(
                "INSERT INTO filler VALUES (?)", [(f"{n:08}" * 16,) for n in range(rows)]
            )
    return state / DB_FILENAME


def left_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("echo-bot: "), result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_backup_into_a_directory_writes_a_timestamped_private_checked_file(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    make_store(state, rows=100)
    backups = tmp_path / "backups"
    backups.mkdir()
    result = run_echo_bot("backup", str(backups), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    (name,) = left_in(backups)
    assert re.fullmatch(r"echo-bot-\d{8}-\d{6}\.sqlite3", name)
    copy = backups / name
    assert str(copy) in result.stdout
    assert copy.stat().st_mode & 0o777 == 0o600
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT COUNT(*) FROM filler").fetchone()[0] == 100
    again = run_echo_bot("backup", str(backups), "--state-dir", str(state))
    assert again.returncode == 0, again.stderr
    assert len([n for n in left_in(backups) if n.endswith(".sqlite3")]) == 2, (
        "a second backup never overwrites the first"
    )


def test_an_empty_store_file_is_neither_backed_up_nor_copied_to_postgresql(
    tmp_path: Path,
) -> None:
    """0 bytes: a backup of it would stand for a store that was never there, and the
    copy would first make it a new, empty store; both refuse, in one line."""
    state = tmp_path / "st"
    state.mkdir()
    (state / DB_FILENAME).touch()
    backups = tmp_path / "backups"
    backups.mkdir()
    backup = run_echo_bot("backup", str(backups), "--state-dir", str(state))
    assert backup.returncode == 1 and "is empty (0 bytes)" in backup.stderr, backup.stderr
    assert left_in(backups) == []
    env = echo_bot_env(ECHO_BOT_DATABASE_URL="postgresql://nobody@127.0.0.1:9/none")
    copied = run_echo_bot("store", "copy", "--to", "postgres", "--state-dir", str(state), env=env)
    assert copied.returncode == 2 and "is empty (0 bytes)" in copied.stderr, copied.stderr
    assert (state / DB_FILENAME).stat().st_size == 0


def test_backup_into_a_missing_directory_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    state = tmp_path / "st"
    make_store(state)
    target = tmp_path / "nonexistent-dir" / "x.sqlite3"
    result = run_echo_bot("backup", str(target), "--state-dir", str(state))
    assert_one_line_error(result, str(target), "does not exist")
    assert not target.parent.exists()


def test_backup_to_an_unwritable_place_is_one_line_and_leaves_no_partial(tmp_path: Path) -> None:
    # Tests run as root, which ignores a directory's write bits: these cannot be written
    # by anyone.
    state = tmp_path / "st"
    make_store(state)
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    for target in (a_file / "x.sqlite3", Path("/proc/echo-bot-backup.sqlite3")):
        result = run_echo_bot("backup", str(target), "--state-dir", str(state))
        assert_one_line_error(result, str(target))
    assert left_in(tmp_path) == ["file", "st"]


LIMIT = 64 * 1024


def _small_file_limit() -> None:
    # Python ignores SIGXFSZ: a write past the limit fails with EFBIG, as on a full disk.
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_backup_failing_halfway_on_a_full_disk_leaves_nothing_behind(tmp_path: Path) -> None:
    state = tmp_path / "st"
    store = make_store(state, rows=5000)
    with contextlib.closing(sqlite3.connect(store)) as conn:
        size = conn.execute("PRAGMA page_count").fetchone()[0] * 4096
    assert size > 4 * LIMIT
    backups = tmp_path / "backups"
    backups.mkdir()
    result = subprocess.run(
        echo_bot_cmd("backup", str(backups / "x.sqlite3"), "--state-dir", str(state)),
        capture_output=True, text=True, env=echo_bot_env(), cwd=ROOT, timeout=60,
        preexec_fn=_small_file_limit,
    )  # fmt: skip
    assert_one_line_error(result, str(backups / "x.sqlite3"))
    assert left_in(backups) == []


def test_backup_of_a_damaged_store_fails_its_integrity_check_and_is_removed(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    store = make_store(state, rows=200)
    # Damage only the index: the backup copies pages as they are, and quick_check (which
    # does not compare index entries with rows) would not notice.
    with contextlib.closing(sqlite3.connect(store)) as conn, conn:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = 'CREATE INDEX filler_x ON filler (x DESC)'"
            " WHERE name = 'filler_x'"
        )
    backups = tmp_path / "backups"
    backups.mkdir()
    old = backups / "x.sqlite3"
    old.write_bytes(b"an older backup")
    os.chmod(old, 0o600)
    result = run_echo_bot("backup", str(old), "--force", "--state-dir", str(state))
    assert_one_line_error(result, "integrity check", "missing from index")
    assert left_in(backups) == ["x.sqlite3"]
    assert old.read_bytes() == b"an older backup", "a failed backup keeps the previous one"


def test_backup_onto_an_existing_file_is_refused_unless_forced(tmp_path: Path) -> None:
    state = tmp_path / "st"
    make_store(state, rows=10)
    old = tmp_path / "keep.sqlite3"
    old.write_bytes(b"last week's backup")
    refused = run_echo_bot("backup", str(old), "--state-dir", str(state))
    assert_one_line_error(refused, str(old), "exists; not overwritten", "--force")
    assert refused.stdout == ""
    assert old.read_bytes() == b"last week's backup"
    # A link is a file that exists too, wherever it points (even nowhere).
    link = tmp_path / "link.sqlite3"
    link.symlink_to(tmp_path / "nowhere")
    assert_one_line_error(run_echo_bot("backup", str(link), "--state-dir", str(state)), str(link))
    assert not (tmp_path / "nowhere").exists()
    assert left_in(tmp_path) == ["keep.sqlite3", "link.sqlite3", "st"]

    forced = run_echo_bot("backup", str(old), "--force", "--state-dir", str(state))
    assert forced.returncode == 0, forced.stderr
    assert f"Backed up {state / DB_FILENAME} to {old}" in forced.stdout
    with contextlib.closing(sqlite3.connect(old)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM filler").fetchone()[0] == 10
