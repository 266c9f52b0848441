"""The terminal as the user sees it: `echo-bot run` and `echo-bot chat` on a real pty,
where stdout (the chat) and stderr (the log) share one screen."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env, run_echo_bot
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.proc import EchoBotProcess

# A line as logging's text format writes it: "2026-12-01 05:42:03,759 INFO name: …".
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) ", re.M)


class Terminal:
    """An echo-bot process whose stdin, stdout and stderr are one pty, as in a shell."""

    def __init__(self, *args: str) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            echo_bot_cmd(*args),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=echo_bot_env(),
            cwd=ROOT,
            start_new_session=True,
        )
        os.close(slave)
        self.output = ""

    def _read(self, timeout: float) -> bool:
        """One read; False at the end (every writer closed the pty)."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the process and its children are gone
            return False
        self.output += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)

    def expect(self, pattern: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.output, re.M):
            if time.monotonic() > deadline or not self._read(0.2):
                raise AssertionError(f"{pattern!r} never appeared on the terminal:\n{self.output}")

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def stop(self) -> int:
        """SIGTERM, then everything it writes until it exits."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        while self._read(0.5):
            pass
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def fire_a_reminder(term: Terminal) -> None:
    """What the user did: a reminder, and wait for it (the scheduler's busiest moment)."""
    term.expect(r"stop with Ctrl\+C")
    term.type("remind me in 2 seconds to stretch")
    term.expect(r"OK, I will remind you")
    term.expect(r"⏰ stretch")


def a_reminder_on_a_terminal(*args: str) -> Terminal:
    """``echo-bot ARGS`` on a pty: a reminder set and fired, then stopped (exit 0)."""
    term = Terminal(*args)
    try:
        fire_a_reminder(term)
        assert term.stop() == 0
    finally:
        term.close()
    return term


def test_log_lines_stay_out_of_the_terminal_chat_of_run(tmp_path: Path) -> None:
    term = a_reminder_on_a_terminal("run", "--state-dir", str(tmp_path / "st"))
    assert not LOG_LINE.search(term.output), term.output
    assert term.output.lstrip().startswith("echo-bot "), "the banner comes first"
    assert "/help lists commands" in term.output  # a chat is attached


def test_log_lines_stay_out_of_the_terminal_chat_of_chat(tmp_path: Path) -> None:
    term = a_reminder_on_a_terminal("chat", "--state-dir", str(tmp_path / "st"))
    assert not LOG_LINE.search(term.output), term.output


def test_verbose_shows_the_log_on_the_terminal_but_not_the_scheduler_chatter(
    tmp_path: Path,
) -> None:
    term = a_reminder_on_a_terminal("run", "--verbose", "--state-dir", str(tmp_path / "st"))
    assert re.search(r"INFO echo_bot\.app: echo-bot \S+ started", term.output), term.output
    assert "apscheduler" not in term.output  # per-job lines are DEBUG detail


def test_log_file_gets_the_full_log_while_the_terminal_stays_clean(tmp_path: Path) -> None:
    log_file = tmp_path / "echo-bot.log"
    log_file.write_text("an earlier run\n")
    log_file.chmod(0o644)  # an existing file is made private too
    state = str(tmp_path / "st")
    term = a_reminder_on_a_terminal("run", "--state-dir", state, "--log-file", str(log_file))
    assert not LOG_LINE.search(term.output), term.output
    written = log_file.read_text()
    assert written.startswith("an earlier run\n")  # appended to
    assert re.search(r"INFO echo_bot\.app: echo-bot \S+ started", written)
    assert "INFO echo_bot.app: stopping" in written
    assert "apscheduler" not in written
    assert log_file.stat().st_mode & 0o777 == 0o600


def test_without_a_terminal_the_banner_offers_no_chat_and_the_log_stays_on_stderr(
    tmp_path: Path,
) -> None:
    bot = EchoBotProcess("run", "--state-dir", str(tmp_path / "st"), stdin=subprocess.DEVNULL)
    try:
        stop_line = bot.expect_stderr(r"^stop with Ctrl\+C")
        assert "/help" not in stop_line  # no chat is attached to type it in
        bot.expect_stderr(r"INFO echo_bot\.app: echo-bot \S+ started")  # systemd's journal
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_each_telegram_update_is_not_an_info_line_in_the_service_log(tmp_path: Path) -> None:
    """Under systemd the log is the journal: one aiogram line per update drowned it."""
    token, owner = "123456:LOGS-test-token", 42
    config = tmp_path / "config.toml"
    async with FakeTelegramAPI(token=token) as api:
        config.write_text(
            f'[telegram]\nenabled = true\napi_base = "{api.base_url}"\n'
            f"allowed_users = [{owner}]\n[http]\nport = 0\n"
        )
        proc = await asyncio.create_subprocess_exec(
            *echo_bot_cmd("run", "--config", str(config), "--state-dir", str(tmp_path / "st")),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=echo_bot_env(TELEGRAM_BOT_TOKEN=token),
            cwd=ROOT,
        )
        try:
            for n in range(3):
                api.push_message(f"what time is it? ({n})", user_id=owner)
            await api.wait_for_calls(
                "sendMessage", 3, lambda c: "It is" in c.params.get("text", ""), timeout=30
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = await asyncio.wait_for(proc.communicate(), 30)
    log = err.decode()
    assert proc.returncode == 0, log
    assert re.search(r"INFO echo_bot\.app: echo-bot \S+ started", log), log
    assert "aiogram.event" not in log, log


def test_a_log_file_path_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "echo-bot.log").symlink_to(target)
    done = run_echo_bot("status", "--state-dir", str(tmp_path / "st"),
                        "--log-file", str(tmp_path / "echo-bot.log"))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"echo-bot: cannot write the log file {tmp_path / 'echo-bot.log'}: it is a symlink,"
        " and symlinks are refused (give the file's own path)\n"
    )
    assert target.read_text() == ""
