"""status, doctor, and a state dir that cannot be used: clear words, right exit codes."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import echo_bot_env, run_echo_bot
from tests.proc import EchoBotProcess


def test_status_while_running_and_after(tmp_path: Path) -> None:
    state = tmp_path / "st"
    bot = EchoBotProcess("run", "--state-dir", str(state), stdin=subprocess.DEVNULL)
    try:
        bot.expect_stderr(r"^stop with")
        running = run_echo_bot("status", "--state-dir", str(state))
        assert running.returncode == 0
        assert f"running, pid {bot.proc.pid}" in running.stdout
        assert "approvals pending: 0" in running.stdout
        assert bot.terminate() == 0
    finally:
        bot.cleanup()
    stopped = run_echo_bot("status", "--state-dir", str(state))
    assert "daemon: not running" in stopped.stdout


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_doctor_passes_on_defaults_and_names_what_to_fix(tmp_path: Path) -> None:
    good = run_echo_bot("doctor", "--state-dir", str(tmp_path / "st"))
    assert good.returncode == 0, good.stdout
    assert "All good." in good.stdout
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "c.toml"
    config.write_text(
        f'[telegram]\nenabled = true\napi_base = "http://127.0.0.1:{port}"\n'
        '[[webhook.routes]]\nname = "ci"\nauth = "github"\nsecret_env = "CI_SECRET"\n'
        'prompt = "x"\n[webhook]\nenabled = true\n'
    )
    bad = run_echo_bot(
        "doctor", "--config", str(config), "--state-dir", str(tmp_path / "st"),
        env=echo_bot_env(TELEGRAM_BOT_TOKEN="123:secret-token-value"),
    )  # fmt: skip
    assert bad.returncode == 1
    assert "CI_SECRET is not set" in bad.stdout
    assert "secret-token-value" not in bad.stdout + bad.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[bot\n")
    worse = run_echo_bot("doctor", "--config", str(broken), "--state-dir", str(tmp_path / "st"))
    assert worse.returncode == 1 and "invalid TOML" in worse.stdout


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_telegram_unreachable_is_reported_by_doctor(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "c.toml"
    config.write_text(f'[telegram]\nenabled = true\napi_base = "http://127.0.0.1:{port}"\n')
    result = run_echo_bot(
        "doctor", "--config", str(config), "--state-dir", str(tmp_path / "st"),
        env=echo_bot_env(TELEGRAM_BOT_TOKEN="123:abc"),
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot reach" in result.stdout and "telegram" in result.stdout


def test_an_unusable_state_dir_is_one_clear_error_not_a_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run_echo_bot("run", "--state-dir", str(blocker / "state"))
    assert result.returncode == 2
    assert result.stderr.startswith("echo-bot: ")
    assert "Traceback" not in result.stderr
    assert str(blocker / "state") in result.stderr
