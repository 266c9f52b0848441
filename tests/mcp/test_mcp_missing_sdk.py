"""`[[mcp.servers]]` configured, the `mcp` extra not installed (a plain `pip install .`):
every place a user looks says so in one line naming the extra — `check-config`,
`doctor`, `mcp list`, the daemon's log, `/healthz` and a call of the server's tool —
instead of "not answering" and "still starting" for ever.

The environment is real: a virtual environment whose site-packages holds every package
of the one the tests run in but the mcp SDK (no file of it anywhere, as when it was never
installed), echo-bot run from it as a process."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import ROOT, echo_bot_env
from tests.ports import free_port
from tests.venv_without import python_without

INSTALL = "pip install 'echo-bot[mcp]', or pip install '.[mcp]' in a checkout"
MISSING = f"[[mcp.servers]] needs the MCP SDK: {INSTALL} (No module named 'mcp')"
ADMIN = "admin-token-for-healthz"


@pytest.fixture(scope="module")
def python_without_mcp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return python_without(tmp_path_factory.mktemp("without-mcp"), ["mcp"], "mcp")


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "echo-bot.toml"
    command = [sys.executable, str(ROOT / "tests" / "fakes" / "mcp_notes_server.py"), "stdio"]
    path.write_text(
        f"""{extra}
[[mcp.servers]]
name = "notes"
command = {json.dumps(command)}
env = {{ NOTES_DIR = {json.dumps(str(tmp_path))} }}
"""
    )
    return path


def run(python: Path, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return cast(subprocess.CompletedProcess[str], subprocess.run(
        [python, "-m", "echo_bot", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env=echo_bot_env(ECHO_BOT_ADMIN_TOKEN=ADMIN), **kwargs,  # type: ignore[call-overload]
    ))  # fmt: skip


def test_check_config_doctor_and_mcp_list_name_the_extra(
    python_without_mcp: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path)
    state = ("--config", str(config), "--state-dir", str(tmp_path / "st"))

    check = run(python_without_mcp, "check-config", *state)
    assert check.returncode == 2, check
    assert check.stderr.strip() == f"echo-bot: {MISSING}"

    doctor = run(python_without_mcp, "doctor", *state)
    assert doctor.returncode == 1, doctor
    [line] = [line for line in doctor.stdout.splitlines() if line.startswith("[FAIL]")]
    assert line.startswith("[FAIL] mcp notes") and line.endswith(f"stdio: {MISSING}"), line

    listing = run(python_without_mcp, "mcp", "list", *state)
    assert listing.returncode == 1, listing
    assert listing.stdout.splitlines() == [f"notes (stdio): down — {MISSING}"]


def test_the_daemon_says_it_in_its_log_in_healthz_and_to_a_call(
    python_without_mcp: Path, tmp_path: Path
) -> None:
    port = free_port()
    config = write_config(
        tmp_path,
        f"[http]\nenabled = true\nport = {port}\n"
        '[webhook]\nadmin_token_env = "ECHO_BOT_ADMIN_TOKEN"\n',
    )
    state = ("--config", str(config), "--state-dir", str(tmp_path / "st"))

    chat = run(python_without_mcp, "chat", *state, input="/tool notes__list_notes {}\n")
    assert chat.returncode == 0, chat
    assert chat.stdout.strip() == (
        "⚠️ TOOL_UNAVAILABLE: the tool notes__list_notes is not available: the MCP server"
        f" notes is down: {MISSING}"
    )
    assert f"ERROR echo_bot.mcp.hub: mcp notes: {MISSING}" in chat.stderr

    daemon = subprocess.Popen(
        [python_without_mcp, "-m", "echo_bot", "run", *state],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, cwd=ROOT, env=echo_bot_env(ECHO_BOT_ADMIN_TOKEN=ADMIN),
    )  # fmt: skip
    try:
        assert daemon.stderr is not None
        log = []
        for line in daemon.stderr:
            log.append(line)
            if line.startswith("stop with"):
                break
        assert any(f"mcp notes: {MISSING}" in line for line in log), log
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/healthz", headers={"Authorization": f"Bearer {ADMIN}"}
        )
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("/healthz says ok with a server down")
        except urllib.error.HTTPError as answer:
            assert answer.code == 503
            health = json.loads(answer.read())
        assert health["components"]["mcp"]["servers"]["notes"] == {
            "state": "down",
            "error": MISSING,
            "tools": 0,
        }
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0
