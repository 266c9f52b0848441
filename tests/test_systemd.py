"""The systemd unit and the notify protocol the daemon speaks."""

from __future__ import annotations

import asyncio
import configparser
import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from echo_bot.sdnotify import Notifier
from tests.conftest import ROOT, echo_bot_env
from tests.fakes.notify import NotifySocket
from tests.proc import EchoBotProcess
from tests.waiting import eventually

UNIT = ROOT / "systemd" / "echo-bot.service"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_declares_what_an_admin_relies_on() -> None:
    service = unit()["Service"]
    assert service["Type"] == "notify"
    assert service["ExecStart"].endswith("echo-bot run --config /etc/echo-bot/config.toml")
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"
    assert service["WatchdogSec"]
    assert service["StateDirectory"] == "echo-bot"
    assert service["EnvironmentFile"] == "-/etc/echo-bot/env"
    assert service["User"] == "echo-bot"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
    }.items():
        assert service[key] == value, key
    assert "AF_INET" in service["RestrictAddressFamilies"]
    assert "@system-service" in service["SystemCallFilter"]


def test_systemctl_reload_sends_the_sighup_the_readme_promises() -> None:
    assert unit()["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert "SIGHUP re-reads" in (ROOT / "README.md").read_text()


def test_unit_offers_systemd_credentials_for_the_secrets() -> None:
    # Commented out: a credential whose file is missing would stop the start.
    lines = UNIT.read_text().splitlines()
    offered = [line for line in lines if line.startswith("#LoadCredential=")]
    names = {line.removeprefix("#LoadCredential=").split(":", 1)[0] for line in offered}
    assert {"TELEGRAM_BOT_TOKEN", "OPENAI_API_KEY"} <= names
    assert "LoadCredential" not in unit()["Service"]
    assert "$CREDENTIALS_DIRECTORY" in (ROOT / "systemd" / "README.md").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at this environment's echo-bot.
    echo_bot = shutil.which("echo-bot") or str(
        Path(__import__("sys").executable).parent / "echo-bot"
    )
    copy = tmp_path / "echo-bot.service"
    copy.write_text(UNIT.read_text().replace("/opt/echo-bot/.venv/bin/echo-bot", echo_bot))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def watchdog_pings(notify: NotifySocket, since: float = 0.0) -> int:
    """How many WATCHDOG=1 the socket has received (at or after ``since``, monotonic)."""
    return sum(1 for at, line in list(notify.received) if line == "WATCHDOG=1" and at >= since)


def test_ready_watchdog_and_stopping_arrive_in_order(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    env = echo_bot_env(NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="400000")
    bot = EchoBotProcess("run", "--state-dir", str(tmp_path / "st"), env=env,
                         stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        notify.wait_for("READY=1")
        asyncio.run(eventually(lambda: watchdog_pings(notify) >= 3, what="three watchdog pings"))
        assert bot.terminate() == 0
        notify.wait_for("STOPPING=1")
    finally:
        bot.cleanup()
        notify.close()
    lines = notify.lines()
    ready, stopping = lines.index("READY=1"), lines.index("STOPPING=1")
    pings = [i for i, line in enumerate(lines) if line == "WATCHDOG=1"]
    assert len(pings) >= 3  # every 0.2 s while it runs
    assert ready < pings[0] and pings[-1] < stopping
    assert any(line.startswith("STATUS=") for line in lines[:ready])


async def test_a_blocked_event_loop_stops_the_watchdog_pings(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    notifier = Notifier({"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "100000"})
    notifier.start_watchdog()
    try:
        await eventually(lambda: watchdog_pings(notify) >= 2, what="pings before the block")
        time.sleep(1.0)  # the loop is blocked: no ping may be sent meanwhile
        blocked_until = time.monotonic()
        await eventually(
            lambda: watchdog_pings(notify, since=blocked_until) >= 2, what="pings after the block"
        )
    finally:
        await notifier.close()
    notify.close()
    times = [t for t, line in notify.received if line == "WATCHDOG=1"]
    assert len(times) >= 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) >= 0.9, "pings went on while the loop was blocked"
    assert times[-1] >= blocked_until - 0.05  # and they resumed after it


def _shell_block(text: str, heading: str) -> str:
    section = text.split(heading, 1)[1]
    return section.split("```sh", 1)[1].split("```", 1)[0]


@pytest.mark.slow  # installs the checkout into a new venv with pip
def test_install_steps_leave_the_checkouts_venv_behind(tmp_path: Path) -> None:
    """The user's case: a checkout under /home with its own .venv (the README's quick
    start), installed into /opt/echo-bot by the documented steps. The service, with
    ProtectHome=yes, must not need anything of the checkout."""
    steps = (ROOT / "systemd" / "README.md").read_text()
    install, upgrade = _shell_block(steps, "## Install"), _shell_block(steps, "## Upgrade")
    assert "sudo systemd/install.sh" in install and "cp -r" not in install
    assert "sudo systemd/install.sh" in upgrade
    checkout = tmp_path / "home" / "you" / "echo-bot"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", ".*_cache"))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.update(PIP_NO_DEPS="1", PYTHON=sys.executable)  # offline: no dependencies
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "checkout"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    # The user's own files beside the tracked ones never travel to /opt.
    (checkout / "echo-bot.toml").write_text("[telegram]\nallowed_users = [1]\n")
    subprocess.run([sys.executable, "-m", "venv", str(checkout / ".venv")], check=True)
    own = checkout / ".venv" / "bin" / "python"
    subprocess.run([own, "-m", "pip", "install", "-q", str(checkout)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    assert str(checkout) in (checkout / ".venv" / "bin" / "echo-bot").read_text()

    prefix = tmp_path / "opt" / "echo-bot"
    for _ in range(2):  # install, then upgrade: the same script
        result = subprocess.run([checkout / "systemd" / "install.sh", prefix], env=env,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

    assert not (prefix / "echo-bot.toml").exists()
    assert (prefix / "pyproject.toml").exists()
    entry = prefix / ".venv" / "bin" / "echo-bot"
    assert entry.read_text().splitlines()[0] == f"#!{prefix}/.venv/bin/python"
    assert str(checkout) not in entry.read_text()
    assert str(checkout) not in (prefix / ".venv" / "pyvenv.cfg").read_text()
    (checkout.parent / "hidden").mkdir()  # ProtectHome=yes: the checkout is out of sight
    checkout.rename(checkout.parent / "hidden" / "echo-bot")
    clean = {"PATH": "/usr/bin:/bin"}
    version = subprocess.run([entry, "--version"], env=clean, cwd=tmp_path,
                             capture_output=True, text=True)  # fmt: skip
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("echo-bot ")
    where = subprocess.run(
        [prefix / ".venv" / "bin" / "python", "-c",
         "import echo_bot, channels; print(echo_bot.__file__); print(channels.__file__)"],
        env=clean, cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    for path in where.stdout.split():
        assert Path(path).is_relative_to(prefix / ".venv"), path


@pytest.mark.slow  # installs the checkout into a new venv with pip
def test_install_script_replaces_a_venv_copied_from_a_checkout(tmp_path: Path) -> None:
    """After the old `sudo cp -r . /opt/echo-bot`, /opt/echo-bot/.venv is the checkout's:
    running the script again makes it afresh instead of installing through it."""
    prefix = tmp_path / "opt" / "echo-bot"
    stale = prefix / ".venv" / "bin"
    stale.mkdir(parents=True)
    (prefix / "pyproject.toml").write_text('[project]\nname = "echo-bot"\n')
    (stale / "echo-bot").write_text("#!/home/you/echo-bot/.venv/bin/python\nimport sys\n")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.update(PIP_NO_DEPS="1", PYTHON=sys.executable)
    result = subprocess.run([ROOT / "systemd" / "install.sh", prefix], env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "made elsewhere" in result.stderr
    head = (prefix / ".venv" / "bin" / "echo-bot").read_text().splitlines()[0]
    assert head == f"#!{prefix}/.venv/bin/python"
    assert (prefix / "echo_bot" / "cli" / "main.py").exists()


def test_install_script_refuses_a_directory_that_holds_something_else(tmp_path: Path) -> None:
    elsewhere = tmp_path / "srv"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me")
    result = subprocess.run([ROOT / "systemd" / "install.sh", elsewhere],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert (elsewhere / "precious.txt").read_text() == "keep me"


def test_install_script_refuses_extras_that_are_not_names(tmp_path: Path) -> None:
    """EXTRAS goes into pip's requirement (`DIR[postgres]`): anything but names is refused
    before anything is copied."""
    prefix = tmp_path / "opt" / "echo-bot"
    env = {**os.environ, "EXTRAS": "postgres] ../../elsewhere"}
    result = subprocess.run([ROOT / "systemd" / "install.sh", prefix], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert "EXTRAS" in result.stderr
    assert not prefix.exists()
