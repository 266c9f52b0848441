"""MCP tools in a piped `echo-bot chat` (`printf '/tool …\\n' | echo-bot chat`), as real
processes with the notes server: the first line is handled once every server has
answered or failed its first attempt (bounded by its start timeout), never while it is
still starting."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_echo_bot

SERVER = ROOT / "tests" / "fakes" / "mcp_notes_server.py"
LIST = "/tool notes__list_notes {}\n"


def write_config(path: Path, command: list[str], env: dict[str, str]) -> Path:
    pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    path.write_text(
        f"""
[[mcp.servers]]
name = "notes"
command = {json.dumps(command)}
env = {{ {pairs} }}
risk = {{ list_notes = "read" }}
"""
    )
    return path


@pytest.mark.slow
def test_piped_chat_waits_for_a_server_slow_to_start(tmp_path: Path) -> None:
    """A server that takes longer to start than the daemon waits before READY (5 s; an
    `npx` server on its first run, a loaded machine): the piped line still gets the
    server's answer, not TOOL_UNAVAILABLE "still starting"."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "milk.note").write_text("buy milk")
    config = write_config(
        tmp_path / "echo-bot.toml",
        [sys.executable, str(SERVER), "stdio"],
        {"NOTES_DIR": str(notes), "NOTES_START_DELAY": "8"},
    )
    result = run_echo_bot(
        "chat", "--config", str(config), "--state-dir", str(tmp_path / "st"),
        input=LIST, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "TOOL_UNAVAILABLE" not in result.stdout, result.stdout
    assert result.stdout.splitlines()[0] == "milk", result.stdout


@pytest.mark.slow
def test_piped_chat_says_why_a_server_that_never_answers_is_unavailable(tmp_path: Path) -> None:
    """A server that never answers `initialize`: the line is answered once its start
    timeout is over, with the reason — and the chat ends, it does not hang."""
    config = write_config(
        tmp_path / "echo-bot.toml",
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        {"NOTES_DIR": str(tmp_path)},
    )
    result = run_echo_bot(
        "chat", "--config", str(config), "--state-dir", str(tmp_path / "st"),
        input=LIST, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "TOOL_UNAVAILABLE" in result.stdout, result.stdout
    assert "the MCP server notes is down: no answer to initialize within 20 s" in result.stdout
    assert "still starting" not in result.stdout
