"""A terminal in a cluster: `echo-bot chat` beside another `echo-bot run` on one
PostgreSQL database. The terminal is reachable only from its own process, so its
replies are delivered by that process, whichever daemon delivers the shared channels'
outbox: a piped chat prints its reply and exits."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import echo_bot_env, run_echo_bot
from tests.postgres import fresh_database
from tests.proc import daemon_process
from tests.pty_proc import PtyEchoBot


def _config(name: str) -> str:
    return f"""
[bot]
instance = "{name}"
[storage]
engine = "postgres"
[http]
enabled = true
port = 0
"""


def test_a_piped_chat_beside_another_instance_prints_its_reply_and_exits(
    tmp_path: Path,
) -> None:
    with fresh_database() as url:
        env = {"ECHO_BOT_DATABASE_URL": url}
        (tmp_path / "b").mkdir()
        with daemon_process(tmp_path / "b", _config("bot-b"), env) as (config_b, _state, _port):
            config_a = tmp_path / "pg-a.toml"
            config_a.write_text(_config("bot-a").replace("enabled = true", "enabled = false"))
            try:
                chat = run_echo_bot(
                    "chat", "--config", str(config_a), "--state-dir", str(tmp_path / "a"),
                    input="what time is it?\n", timeout=90, env=echo_bot_env(**env),
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise AssertionError(f"the piped chat hung; it printed: {exc.stdout!r}") from None
            assert chat.returncode == 0, chat.stderr
            assert chat.stdout.splitlines()[0].startswith("It is "), chat.stdout
            status = run_echo_bot(
                "status", "--config", str(config_b), "--state-dir", str(tmp_path / "b" / "st"),
                env=echo_bot_env(**env),
            )  # fmt: skip
            assert "outbox: 0 queued" in status.stdout, status.stdout


def test_run_on_a_terminal_beside_another_instance_shows_its_replies(tmp_path: Path) -> None:
    """`echo-bot run` on a terminal is a daemon of the cluster with a terminal of its
    own: what is typed there is answered there."""
    with fresh_database() as url:
        env = {"ECHO_BOT_DATABASE_URL": url}
        (tmp_path / "b").mkdir()
        with daemon_process(tmp_path / "b", _config("bot-b"), env):
            config_a = tmp_path / "pg-a.toml"
            config_a.write_text(_config("bot-a").replace("enabled = true", "enabled = false"))
            args = ("--config", str(config_a), "--state-dir", str(tmp_path / "a"))
            bot = PtyEchoBot("run", *args, env=echo_bot_env(**env))
            try:
                bot.expect(r"stop with Ctrl\+C")
                bot.type("what time is it?")
                bot.expect(r"^It is ")
                assert bot.terminate() == 0
            finally:
                bot.cleanup()


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_status_on_postgres_shows_the_cluster_by_the_names_its_log_uses(tmp_path: Path) -> None:
    """A SQLite daemon runs on the state dir given to `status`; the config says
    PostgreSQL, where bot-a runs: status shows bot-a (from the store), nothing of the
    local daemon, agrees with doctor, and names bot-a as bot-a's own log does."""
    (tmp_path / "local").mkdir()
    (tmp_path / "pg").mkdir()
    local = "[http]\nenabled = true\nport = 0\n"
    with fresh_database() as url, daemon_process(tmp_path / "local", local, {}) as (_, state, _):
        env = {"ECHO_BOT_DATABASE_URL": url}
        here = run_echo_bot("status", "--state-dir", str(state))
        local_pid = re.search(r"daemon: running, pid (\d+)", here.stdout)
        assert local_pid, here.stdout
        clustered = _config("bot-a") + "[webhook]\nenabled = true\n"
        with daemon_process(tmp_path / "pg", clustered, env) as (config, _, _):
            log = tmp_path / "pg" / "daemon.log"
            deadline = time.monotonic() + 30
            while "delivers the webhook outbox" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            said = log.read_text()
            assert "started as bot-a " in said, said
            assert "this daemon (bot-a) delivers the webhook outbox now" in said, said
            args = ("--config", str(config), "--state-dir", str(state))
            status = run_echo_bot("status", *args, env=echo_bot_env(**env))
            assert status.returncode == 0, status.stderr
            assert "daemon: running" not in status.stdout, status.stdout
            assert f"pid {local_pid[1]}" not in status.stdout, status.stdout
            assert "instances: 1 live" in status.stdout, status.stdout
            assert re.search(
                r"^  bot-a: .*; delivers the outbox of webhook$", status.stdout, re.M
            ), status.stdout
            doctor = run_echo_bot("doctor", *args, env=echo_bot_env(**env))
            assert "1 daemon(s) live" in doctor.stdout, doctor.stdout
