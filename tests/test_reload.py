"""SIGHUP: the config file is read again; live parts change, a bad file changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path

from echo_bot.config import Config
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


def test_a_chat_channels_allowlists_apply_live_and_its_other_keys_need_a_restart() -> None:
    """Changing only [matrix] allowed_users said `needs restart to apply: matrix`,
    though the access check and the approvers read it live."""
    from echo_bot.config import parse_config
    from echo_bot.live import restart_needed

    def config(section: str, **keys: object) -> Config:
        return parse_config({section: {"enabled": True, **keys}}, "t.toml")

    for section, one, two in (
        ("matrix", ["@a:example.org"], ["@a:example.org", "@b:example.org"]),
        ("slack", ["U0A"], ["U0A", "U0B"]),
        ("telegram", [1], [1, 2]),
    ):
        extra = {"user_id": "@bot:example.org"} if section == "matrix" else {}
        old = config(section, allowed_users=one, **extra)
        assert restart_needed(old, config(section, allowed_users=two, **extra)) == []
        assert restart_needed(old, config(section, allowed_users=one, approvers=one, **extra)) == []
    old = config("matrix", user_id="@bot:example.org")
    new = config("matrix", user_id="@bot:example.org", homeserver="https://other.example")
    assert restart_needed(old, new) == ["matrix.homeserver"]
