"""`echo-bot chat` and `echo-bot run` as real processes on real SQLite files (and, where
said, on a real PostgreSQL database)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import echo_bot_env, run_echo_bot
from tests.ports import free_port
from tests.postgres import fresh_database
from tests.proc import EchoBotProcess
from tests.waiting import eventually

SHELL_CONFIG = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""

COUNT = '/tool shell_exec {"argv": ["sh", "-c", "echo ran >> count.txt"]}'


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(SHELL_CONFIG)
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The shell config on each engine, and the environment its processes get."""
    path = tmp_path / f"config-{request.param}.toml"
    if request.param == "sqlite":
        path.write_text(SHELL_CONFIG)
        yield path, echo_bot_env()
        return
    with fresh_database() as url:
        path.write_text(SHELL_CONFIG + '[storage]\nengine = "postgres"\n')
        yield path, echo_bot_env(ECHO_BOT_DATABASE_URL=url)


def processes_in(directory: Path) -> list[int]:
    """The live processes whose working directory is ``directory`` (Linux /proc)."""
    wanted = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile, a zombie, not ours
                if os.readlink(entry / "cwd") == wanted:
                    found.append(int(entry.name))
    return found


def count_runs(state_dir: Path) -> int:
    path = state_dir / "workspace" / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_piped_chat_uses_current_time_and_exits_after_last_reply(tmp_path: Path) -> None:
    result = run_echo_bot(
        "chat", "--state-dir", str(tmp_path / "st"), input="what time is it?\n/tools\n"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("It is ")
    assert "current_time" in result.stdout
    assert (tmp_path / "st" / "echo-bot.sqlite3").exists()


def test_piped_chat_run_approved_and_denied(tmp_path: Path, config: Path) -> None:
    state = tmp_path / "st"
    script = f"{COUNT}\ny\n{COUNT}\nn\n"
    result = run_echo_bot("chat", "--config", str(config), "--state-dir", str(state), input=script)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count('Approve shell_exec(argv=["sh","-c","echo ran >> count.txt"])? [y/N]') == 2
    assert "✅ Approved" in out and "exit code 0" in out
    assert "❌ Denied" in out and "APPROVAL_DENIED" in out
    assert count_runs(state) == 1


def test_run_without_terminal_keeps_running_until_a_signal(tmp_path: Path) -> None:
    bot = EchoBotProcess("run", "--state-dir", str(tmp_path / "st"), stdin=subprocess.DEVNULL)
    try:
        banner = bot.expect_stderr(r"^state: ")
        assert str(tmp_path / "st") in banner
        bot.expect_stderr(r"stop with Ctrl\+C")
        # A bounded negative check: nothing the daemon does marks "end of input seen and
        # ignored" (without a terminal it never reads stdin), so it is given a moment.
        time.sleep(1.0)
        assert bot.proc.poll() is None, "end of input must not stop the daemon"
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


def test_second_daemon_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "st"
    first = EchoBotProcess("run", "--state-dir", str(state), stdin=subprocess.DEVNULL)
    try:
        first.expect_stderr(r"^state: ")
        second = run_echo_bot("chat", "--state-dir", str(state), input="hello\n")
        assert second.returncode == 2
        assert f"pid {first.proc.pid}" in second.stderr
        assert "in use" in second.stderr
        assert first.proc.poll() is None
    finally:
        first.terminate()
        first.cleanup()


@pytest.mark.slow  # a real daemon killed and started again
def test_pending_approval_survives_kill_and_runs_exactly_once(
    tmp_path: Path, engine: tuple[Path, dict[str, str]]
) -> None:
    config, env = engine
    state = tmp_path / "st"
    args = ("chat", "--config", str(config), "--state-dir", str(state))
    manage = ("--config", str(config), "--state-dir", str(state))
    first = EchoBotProcess(*args, env=env)
    try:
        first.expect_stderr(r"^state: ")
        first.send(COUNT)
        prompt = first.expect_stdout(r"^Approve shell_exec")
        request_id = re.search(r"request ([0-9a-f]{32})", prompt).group(1)  # type: ignore[union-attr]
        first.kill9()
    finally:
        first.cleanup()
    assert count_runs(state) == 0

    listed = run_echo_bot("approvals", "list", *manage, env=env)
    assert request_id in listed.stdout, listed.stdout + listed.stderr

    second = EchoBotProcess(*args, env=env)
    try:
        second.expect_stderr(r"^state: ")
        approved = run_echo_bot("approvals", "approve", request_id, *manage, env=env)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert f"Approved: {request_id}" in approved.stdout
        second.expect_stdout(r"exit code 0")
        again = run_echo_bot("approvals", "approve", request_id, *manage, env=env)
        assert again.returncode == 1
        assert "already approved" in again.stdout
        denied = run_echo_bot("approvals", "deny", request_id, *manage, env=env)
        assert denied.returncode == 1
        second.close_stdin()
        assert second.wait() == 0
    finally:
        second.cleanup()
    assert count_runs(state) == 1
    assert sum("exit code 0" in line for line in second.stdout_lines) == 1


@pytest.mark.slow  # a real daemon killed and started again
def test_interrupted_side_effect_is_reported_not_rerun(
    tmp_path: Path, engine: tuple[Path, dict[str, str]]
) -> None:
    config, env = engine
    state = tmp_path / "st"
    args = ("chat", "--config", str(config), "--state-dir", str(state))
    slow = '/tool shell_exec {"argv": ["sh", "-c", "echo ran >> count.txt; sleep 3"]}'
    first = EchoBotProcess(*args, env=env)
    try:
        first.expect_stderr(r"^state: ")
        first.send(slow)
        first.expect_stdout(r"^Approve shell_exec")
        first.send("y")
        first.expect_stdout(r"Approved")
        deadline = time.monotonic() + 10
        while count_runs(state) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.kill9()
    finally:
        first.cleanup()
    assert count_runs(state) == 1

    second = EchoBotProcess(*args, env=env)
    try:
        second.expect_stdout(r"OUTCOME_UNKNOWN")
        second.close_stdin()
        assert second.wait() == 0
    finally:
        second.cleanup()
    # Until the orphaned `sh -c …; sleep 3` (and any re-run) has finished: a re-run would
    # have appended again by then.
    workspace = state / "workspace"
    asyncio.run(
        eventually(
            lambda: not processes_in(workspace), 30, f"no process left working in {workspace}"
        )
    )
    assert count_runs(state) == 1


def test_sigint_stops_run_cleanly(tmp_path: Path) -> None:
    bot = EchoBotProcess("run", "--state-dir", str(tmp_path / "st"), stdin=subprocess.DEVNULL)
    try:
        bot.expect_stderr(r"stop with Ctrl\+C")  # printed once started, signals handled
        assert (tmp_path / "st" / "echo-bot.sqlite3").exists()
        bot.proc.send_signal(signal.SIGINT)
        assert bot.wait(15) == 0
    finally:
        bot.cleanup()


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_management_commands_read_a_postgres_store(tmp_path: Path) -> None:
    """status, audit and reminders read the database the config names; backup says
    PostgreSQL's own tools do that; a missing URL is one line."""
    state = tmp_path / "st"
    with fresh_database() as url:
        config = tmp_path / "pg.toml"
        config.write_text('[storage]\nengine = "postgres"\n')
        env = echo_bot_env(ECHO_BOT_DATABASE_URL=url)
        chat = run_echo_bot(
            "chat", "--config", str(config), "--state-dir", str(state),
            input="what time is it?\nremind me in 2 hours to stretch\n", env=env,
        )  # fmt: skip
        assert chat.returncode == 0, chat.stderr
        assert not (state / "echo-bot.sqlite3").exists()
        manage = ("--config", str(config), "--state-dir", str(state))
        status = run_echo_bot("status", *manage, env=env)
        assert status.returncode == 0, status.stderr
        assert "state: PostgreSQL 127.0.0.1" in status.stdout
        assert "reminders active: 1" in status.stdout
        assert "echo_bot_test:" not in status.stdout  # never the password
        audit = run_echo_bot("audit", "--tail", "50", *manage, env=env)
        assert audit.returncode == 0 and "brain.decision" in audit.stdout, audit.stderr
        reminders = run_echo_bot("reminders", "list", *manage, env=env)
        assert "stretch" in reminders.stdout, reminders.stdout + reminders.stderr
        backup = run_echo_bot("backup", str(tmp_path / "copy"), *manage, env=env)
        assert backup.returncode == 2 and "pg_dump" in backup.stderr
        doctor = run_echo_bot("doctor", *manage, env=env)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert re.search(
            r"\[  ok\] store +PostgreSQL 127\.0\.0\.1:\d+/\w+: schema version \d+;", doctor.stdout
        ), doctor.stdout
        wrong = url.replace("echo_bot_test:echo_bot_test@", "echo_bot_test:not-it@")
        refused = run_echo_bot("doctor", *manage, env=echo_bot_env(ECHO_BOT_DATABASE_URL=wrong))
        assert refused.returncode == 1 and "[FAIL] store" in refused.stdout
        assert "not-it" not in refused.stdout
        missing = run_echo_bot("status", *manage)
        assert missing.returncode == 2
        assert "ECHO_BOT_DATABASE_URL is not set" in missing.stderr


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_store_copy_moves_a_stopped_store_to_postgres_and_the_work_goes_on(
    tmp_path: Path, config: Path
) -> None:
    """A pending approval, a reminder and the history made on SQLite: `store copy --to
    postgres` copies them (counts verified), refuses a database that is not empty and
    a state dir in use; a daemon on PostgreSQL then runs the approved call once."""
    state = tmp_path / "st"
    args = ("--config", str(config), "--state-dir", str(state))
    first = EchoBotProcess("chat", *args)
    try:
        first.expect_stderr(r"^state: ")
        first.send("remind me in 3 hours to stretch")
        first.expect_stdout(r"(?i)remind")
        first.send(COUNT)
        prompt = first.expect_stdout(r"^Approve shell_exec")
        request_id = re.search(r"request ([0-9a-f]{32})", prompt).group(1)  # type: ignore[union-attr]
        with fresh_database() as url:
            env = echo_bot_env(ECHO_BOT_DATABASE_URL=url)
            busy = run_echo_bot("store", "copy", "--to", "postgres", *args, env=env)
            assert busy.returncode == 2 and "in use" in busy.stderr, busy.stderr
            first.kill9()
            first.cleanup()

            copied = run_echo_bot("store", "copy", "--to", "postgres", *args, env=env)
            assert copied.returncode == 0, copied.stderr
            assert re.search(r"approvals\s+1\b", copied.stdout), copied.stdout
            assert re.search(r"reminders\s+1\b", copied.stdout), copied.stdout
            again = run_echo_bot("store", "copy", "--to", "postgres", *args, env=env)
            assert again.returncode == 2 and "not empty" in again.stderr, again.stderr

            pg_config = tmp_path / "pg.toml"
            pg_config.write_text(config.read_text() + '[storage]\nengine = "postgres"\n')
            pg_args = ("--config", str(pg_config), "--state-dir", str(state))
            listed = run_echo_bot("reminders", "list", *pg_args, env=env)
            assert "stretch" in listed.stdout, listed.stdout + listed.stderr
            second = EchoBotProcess("chat", *pg_args, env=env)
            try:
                second.expect_stderr(r"^state: ")
                approved = run_echo_bot("approvals", "approve", request_id, *pg_args, env=env)
                assert approved.returncode == 0, approved.stdout + approved.stderr
                second.expect_stdout(r"exit code 0")
                second.send("what time is it?")
                second.expect_stdout(r"^It is ")
                second.close_stdin()
                assert second.wait() == 0
            finally:
                second.cleanup()
    finally:
        first.cleanup()
    assert count_runs(state) == 1


def _healthz(port: int) -> tuple[int, dict[str, object]]:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_a_daemon_started_while_its_database_is_away_waits_degraded_then_runs(
    tmp_path: Path,
) -> None:
    """The database refuses connections at start: the daemon does not exit; /healthz
    (and every other request) answers 503 with the store unavailable; once the database
    is back the daemon opens it and is healthy. SIGTERM while waiting exits 0."""
    import psycopg

    from tests.postgres import admin_url

    port = free_port()
    with fresh_database() as url, psycopg.connect(admin_url(), autocommit=True) as admin:
        name = url.rsplit("/", 1)[1]
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        config = tmp_path / "pg.toml"
        config.write_text(
            f'[http]\nenabled = true\nport = {port}\n[storage]\nengine = "postgres"\n'
        )
        env = echo_bot_env(ECHO_BOT_DATABASE_URL=url)
        args = ("run", "--config", str(config), "--state-dir", str(tmp_path / "st"))
        daemon = EchoBotProcess(*args, env=env)
        try:
            daemon.expect_stderr(r"the store is unavailable")
            deadline = time.monotonic() + 15
            while True:
                try:
                    status, body = _healthz(port)
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert status == 503
            assert body == {
                "status": "degraded",
                "components": {"store": {"status": "unavailable"}},
            }
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            deadline = time.monotonic() + 30
            while _healthz(port)[0] != 200:
                assert time.monotonic() < deadline, daemon.stderr_lines[-5:]
                time.sleep(0.2)
            assert daemon.terminate() == 0
        finally:
            daemon.cleanup()
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
        waiting = EchoBotProcess(*args, env=env)
        try:
            waiting.expect_stderr(r"the store is unavailable")
            assert waiting.terminate() == 0
        finally:
            waiting.cleanup()


def test_a_database_out_of_connections_is_waited_for_with_a_clear_reason(
    tmp_path: Path,
) -> None:
    """The server's connection limit reached (its max_connections, a role's or a
    database's limit, a full pooler): the daemon waits degraded, saying so and what to
    change, and starts once a connection is free."""
    import psycopg

    from tests.postgres import admin_url

    port = free_port()
    with fresh_database() as url, psycopg.connect(admin_url(), autocommit=True) as admin:
        name = url.rsplit("/", 1)[1]
        admin.execute(f'ALTER DATABASE "{name}" CONNECTION LIMIT 0')
        config = tmp_path / "pg.toml"
        config.write_text(
            f'[http]\nenabled = true\nport = {port}\n[storage]\nengine = "postgres"\n'
        )
        env = echo_bot_env(ECHO_BOT_DATABASE_URL=url)
        args = ("run", "--config", str(config), "--state-dir", str(tmp_path / "st"))
        daemon = EchoBotProcess(*args, env=env)
        try:
            line = daemon.expect_stderr(r"the store is unavailable")
            assert "too many connections" in line and "max_connections" in line, line
            admin.execute(f'ALTER DATABASE "{name}" CONNECTION LIMIT -1')
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError):
                    if _healthz(port)[0] == 200:
                        break
                assert time.monotonic() < deadline, daemon.stderr_lines[-5:]
                time.sleep(0.2)
            assert daemon.terminate() == 0
        finally:
            daemon.cleanup()


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_status_lists_the_live_daemons_by_their_instance_name(
    tmp_path: Path, engine: tuple[Path, dict[str, str]]
) -> None:
    base, env = engine
    config = tmp_path / "named.toml"
    config.write_text('[bot]\ninstance = "bot-a"\n' + base.read_text())
    args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
    daemon = EchoBotProcess("run", *args, env=env)
    try:
        daemon.expect_stderr(r"started")
        status = run_echo_bot("status", *args, env=env)
        assert status.returncode == 0, status.stderr
        assert "instances: 1 live" in status.stdout, status.stdout
        assert re.search(rf"^  bot-a: .*, pid {daemon.proc.pid}, ", status.stdout, re.M)
        # A channel's outbox is delivered by a daemon that runs it: this one runs none.
        assert "delivers the outbox" not in status.stdout, status.stdout
        assert daemon.terminate() == 0
    finally:
        daemon.cleanup()
    after = run_echo_bot("status", *args, env=env)
    # It left the list when it stopped (on PostgreSQL the list is all status shows of
    # the daemons, so it says there are none).
    if env.get("ECHO_BOT_DATABASE_URL"):
        assert "instances: 0 live" in after.stdout, after.stdout
        assert "last started: bot-a; " in after.stdout, after.stdout
    else:
        assert "instances:" not in after.stdout, after.stdout
    audit = run_echo_bot("audit", "--tail", "5", *args, env=env)
    assert 'daemon.started     instance="bot-a"' in audit.stdout, audit.stdout
