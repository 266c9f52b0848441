"""`[matrix]`, `[slack]`, `[email]` or `[discord]` enabled where its extra is not installed (a plain
`pip install .`): `check-config` and `run` say so in one line naming the extra, both
install forms, and exit 2 (the unit does not restart it), as `doctor` does — never a
traceback, never "valid".

The environment is real: a virtual environment whose site-packages holds every package
of the one the tests run in but matrix-nio, slack-sdk, aioimaplib, aiosmtplib and
discord.py,
echo-bot run from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, echo_bot_env
from tests.venv_without import python_without

pytestmark = pytest.mark.slow  # a venv, and echo-bot processes

SECTIONS = {
    "matrix": '[matrix]\nenabled = true\nuser_id = "@bot:example.org"\n',
    "slack": "[slack]\nenabled = true\n",
    "discord": "[discord]\nenabled = true\n",
    "email": '[email]\nenabled = true\naddress = "bot@example.org"\nimap_host = "imap.example.org"'
    '\nsmtp_host = "smtp.example.org"\nauth_serv_id = "mx.example.org"\n',
}
SECRETS = {
    "MATRIX_ACCESS_TOKEN": "syt_abc",
    "SLACK_BOT_TOKEN": "xoxb-1",
    "SLACK_APP_TOKEN": "xapp-1",
    "ECHO_BOT_EMAIL_PASSWORD": "pw",
    "DISCORD_BOT_TOKEN": "MTAx.bot.token",
}


@pytest.fixture(scope="module")
def python_without_extras(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("without-extras")
    return python_without(
        root,
        ["nio", "matrix_nio", "slack_sdk", "slack", "aioimaplib", "aiosmtplib", "discord"],
        "nio",
    )


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "echo_bot", *args], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=echo_bot_env(**SECRETS), stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_check_config_run_and_doctor_name_the_missing_extra(
    name: str, python_without_extras: Path, tmp_path: Path
) -> None:
    config = tmp_path / "echo-bot.toml"
    config.write_text(SECTIONS[name])
    state = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
    install = f"pip install 'echo-bot[{name}]', or pip install '.[{name}]' in a checkout"
    for command in ("check-config", "run"):
        done = run(python_without_extras, command, *state)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("echo-bot: ")]
        assert len(errors) == 1, done.stderr
        assert f"[{name}] is enabled but its library is not installed" in errors[0]
        assert install in errors[0], errors[0]
        assert "valid" not in done.stdout
    doctor = run(python_without_extras, "doctor", *state)
    assert doctor.returncode == 1 and install in doctor.stdout, doctor.stdout
