"""A management command whose reader went away (`echo-bot audit | head -1`) stops
quietly with status 141, as Unix tools killed by SIGPIPE do: no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env, run_echo_bot


@pytest.mark.parametrize(
    "command", [["status"], ["audit", "--tail", "500"], ["check-config"], ["reminders", "list"]]
)
def test_a_command_piped_into_a_reader_that_left_exits_141_without_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    state = tmp_path / "st"
    chat = run_echo_bot("chat", "--state-dir", str(state), input="what time is it?\n")
    assert chat.returncode == 0, chat.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a line is written
    try:
        done = subprocess.run(
            echo_bot_cmd(*command, "--state-dir", str(state)),
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=60,
            env=echo_bot_env(),
            cwd=ROOT,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
