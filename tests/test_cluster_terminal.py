"""A terminal in a cluster: `echo-bot chat` beside another `echo-bot run` on one
PostgreSQL database. The terminal is reachable only from its own process, so its
replies are delivered by that process, whichever daemon delivers the shared channels'
outbox: a piped chat prints its reply and exits."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import echo_bot_env, run_echo_bot
from tests.postgres import fresh_database
from tests.proc import daemon_process


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
