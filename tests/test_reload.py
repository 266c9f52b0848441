"""SIGHUP: the config file is read again; live parts change, a bad file changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import echo_bot_env
from tests.proc import EchoBotProcess

BASE = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""


def test_sighup_reloads_the_policy_and_keeps_running_on_a_bad_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(BASE)
    bot = EchoBotProcess(
        "chat", "--config", str(config), "--state-dir", str(tmp_path / "st"), env=echo_bot_env()
    )
    try:
        bot.expect_stderr(r"^state: ")
        bot.send("/run true")
        bot.expect_stdout(r"^Approve shell_exec")
        bot.send("n")
        bot.expect_stdout(r"APPROVAL_DENIED")
        # Allow `true` without asking, and change something that needs a restart.
        config.write_text(BASE + 'allow_commands = ["true"]\n[bot]\nmax_concurrent_turns = 3\n')
        bot.proc.send_signal(signal.SIGHUP)
        line = bot.expect_stderr(r"SIGHUP: config reloaded")
        assert "needs restart" in line and "bot" in line and "tools" not in line
        bot.send("/run true")
        bot.expect_stdout(r"exit code 0")
        # A broken file: logged, and the running config stays.
        config.write_text("[tools\n")
        bot.proc.send_signal(signal.SIGHUP)
        bot.expect_stderr(r"SIGHUP: the config was not reloaded")
        bot.send("/run true")
        bot.expect_stdout(r"exit code 0")
        assert bot.proc.poll() is None
        bot.close_stdin()
        assert bot.wait() == 0
    finally:
        bot.cleanup()
