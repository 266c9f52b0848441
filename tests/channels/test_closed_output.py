"""A management command whose reader went away (`echo-bot audit | head -1`) stops
quietly with status 141, as Unix tools killed by SIGPIPE do: no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_echo_bot
from tests.proc import run_with_output_closed


@pytest.mark.parametrize(
    "command", [["status"], ["audit", "--tail", "500"], ["check-config"], ["reminders", "list"]]
)
def test_a_command_piped_into_a_reader_that_left_exits_141_without_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    state = tmp_path / "st"
    chat = run_echo_bot("chat", "--state-dir", str(state), input="what time is it?\n")
    assert chat.returncode == 0, chat.stderr
    done = run_with_output_closed(*command, "--state-dir", str(state))
    assert done.returncode == 141, done.stderr.decode()
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
