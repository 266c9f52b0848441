"""The terminal chat as a new user meets it: ``echo-bot run``/``chat`` on a real pty,
``echo-bot approvals`` as a second real process, and a real pipe closed early."""

from __future__ import annotations

import getpass
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env, read_store, run_echo_bot
from tests.proc import run_with_output_closed
from tests.pty_proc import PtyEchoBot

SHELL_CONFIG = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""
# Long enough to type an answer on a loaded machine, short enough to watch it expire.
EXPIRING_CONFIG = SHELL_CONFIG + '[approvals]\ntimeout = "3s"\n'

REQUEST = r"request ([0-9a-f]{32})"
USER = re.escape(getpass.getuser())


def config_file(tmp_path: Path, text: str = SHELL_CONFIG) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def request_id(line: str) -> str:
    match = re.search(REQUEST, line)
    assert match is not None, line
    return match.group(1)


def workspace(state: Path) -> Path:
    return state / "workspace"


def test_a_prompt_settled_elsewhere_does_not_swallow_the_next_line(tmp_path: Path) -> None:
    state = tmp_path / "st"
    args = ("--config", str(config_file(tmp_path)), "--state-dir", str(state))
    bot = PtyEchoBot("run", *args)
    try:
        bot.expect(r"stop with Ctrl\+C")
        bot.type("/run rm -rf build")
        prompt = bot.expect(r'^Approve shell_exec\(command="rm -rf build"\)\? \[y/N\]')
        approval = request_id(prompt)

        approved = run_echo_bot("approvals", "approve", approval, *args)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        bot.expect(rf"^✅ Approved by .*{approval}")
        bot.expect(r"exit code 0")

        bot.type("/run touch x")
        line = bot.expect(r"^Approve shell_exec|Already decided")
        assert line.startswith('Approve shell_exec(command="touch x")? [y/N]'), line
        bot.type("y")
        bot.expect(rf"^✅ Approved by .*{request_id(line)}")
        bot.expect(r"exit code 0")
        assert (workspace(state) / "x").exists()
        assert "touch x" in run_echo_bot("audit", *args).stdout
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


def test_an_expired_prompt_does_not_swallow_the_next_line(tmp_path: Path) -> None:
    state = tmp_path / "st"
    args = ("--config", str(config_file(tmp_path, EXPIRING_CONFIG)), "--state-dir", str(state))
    bot = PtyEchoBot("run", *args)
    try:
        bot.expect(r"stop with Ctrl\+C")
        bot.type("/run touch late")
        approval = request_id(bot.expect(r"^Approve shell_exec"))
        bot.expect(rf"^⌛ Expired .*{approval}")
        bot.expect(r"APPROVAL_EXPIRED")
        bot.type("what time is it?")
        line = bot.expect(r"^It is |Already decided")
        assert line.startswith("It is "), line
        assert not (workspace(state) / "late").exists()
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


def test_after_a_restart_the_terminal_shows_the_pending_prompt_and_y_answers_it(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    args = ("--config", str(config_file(tmp_path)), "--state-dir", str(state))
    first = PtyEchoBot("run", *args)
    try:
        first.expect(r"stop with Ctrl\+C")
        first.type("/run touch x")
        approval = request_id(first.expect(r"^Approve shell_exec"))
        assert first.terminate() == 0
    finally:
        first.cleanup()

    second = PtyEchoBot("run", *args)
    try:
        second.expect(r"still waiting for your answer")
        again = second.expect(r'^Approve shell_exec\(command="touch x"\)\? \[y/N\]')
        assert request_id(again) == approval
        second.type("y")
        second.expect(rf"^✅ Approved by .*{approval}")
        second.expect(r"exit code 0")
        assert (workspace(state) / "x").exists()
        # Shown once: the prompt is not printed a second time from the outbox.
        assert sum(line.startswith("Approve shell_exec") for line in second.lines) == 1
        assert second.terminate() == 0
    finally:
        second.cleanup()


def test_ctrl_d_on_the_attached_chat_says_the_daemon_keeps_running(tmp_path: Path) -> None:
    state = tmp_path / "st"
    bot = PtyEchoBot("run", "--state-dir", str(state))
    try:
        bot.expect(r"stop with Ctrl\+C")
        bot.type("what time is it?")
        bot.expect(r"^It is ")
        bot.ctrl_d()
        line = bot.expect(r"keeps running")
        assert f"kill {bot.proc.pid}" in line and "Ctrl+C" in line
        # Still running: it still holds the state dir.
        other = run_echo_bot("chat", "--state-dir", str(state), input="hello\n")
        assert other.returncode == 2 and f"pid {bot.proc.pid}" in other.stderr
        assert bot.proc.poll() is None
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


def outbox_rows(state: Path) -> list[tuple[str, str | None, str]]:
    stored = read_store(state, lambda tx: tx.outbox.deliveries())
    return [(d.status, d.last_error, d.message.text) for d in stored if d.chat_key == "cli:local"]


def chat_until_its_output_closes(
    args: tuple[str, ...], then: bytes, env: dict[str, str]
) -> tuple[int, str]:
    """`echo-bot chat` asked the time; its reader leaves after that first line (as
    `| head -1` does) while ``then`` is typed: (exit status, stderr). A hang fails."""
    proc = subprocess.Popen(
        echo_bot_cmd("chat", *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"what time is it?\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith(b"It is ")
        proc.stdout.close()
        proc.stdin.write(then)
        proc.stdin.close()
        code = proc.wait(60)
        return code, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_chat_ends_when_its_output_pipe_closes_and_keeps_the_reply_undelivered(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    env = echo_bot_env()
    env.pop("PYTHONUNBUFFERED")  # as a user's shell runs it: stdout block-buffered
    code, stderr = chat_until_its_output_closes(
        ("--state-dir", str(state)), b"/help\nwhat time is it?\n", env
    )
    assert code == 141, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert "output is closed" in stderr, stderr

    rows = outbox_rows(state)
    help_rows = [r for r in rows if "Commands:" in r[2]]
    assert len(help_rows) == 1, rows
    status, error, _text = help_rows[0]
    assert status == "queued" and error and "output is closed" in error
    assert not any("Commands:" not in r[2] and r[0] != "sent" for r in rows), rows

    # A closed output is no failed delivery: however often it happens, nothing counts
    # against the message's attempts (8 of them would mark it failed for good).
    for _ in range(3):
        again = run_with_output_closed(
            "chat", "--state-dir", str(state), input=b"what time is it?\n", env=env
        )
        assert again.returncode == 141, again.stderr
    queued = read_store(state, lambda tx: tx.outbox.deliveries("queued"))
    attempts = [(d.attempts, d.next_attempt_at <= d.created_at) for d in queued]
    assert attempts and all(row == (0, True) for row in attempts), attempts

    # The next chat shows it first, marked as held from before, in the chat's time zone.
    zone = tmp_path / "zone.toml"
    zone.write_text('[bot]\ntimezone = "Asia/Tokyo"\n')
    later = run_echo_bot(
        "chat", "--config", str(zone), "--state-dir", str(state), input="what time is it?\n"
    )
    assert later.returncode == 0, later.stderr
    lines = later.stdout.splitlines()
    held = r"^\(from (\d{4}-\d\d-\d\d )?\d\d:\d\d Asia/Tokyo, not shown until now\) Commands:"
    assert re.match(held, lines[0]), lines
    assert lines[-1].startswith("It is "), lines
    assert all(r[0] == "sent" for r in outbox_rows(state))


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_the_chat_and_the_cli_name_the_decider_alike(tmp_path: Path) -> None:
    state = tmp_path / "st"
    args = ("--config", str(config_file(tmp_path)), "--state-dir", str(state))
    user = getpass.getuser()
    bot = PtyEchoBot("run", *args)
    try:
        bot.expect(r"stop with Ctrl\+C")
        bot.type("/run touch y")
        at_terminal = request_id(bot.expect(r"^Approve shell_exec"))
        bot.type("n")
        bot.expect(rf"^❌ Denied by {USER} \(terminal\) at \d\d:\d\d UTC .*{at_terminal}")
        bot.expect(r"APPROVAL_DENIED")
        again = run_echo_bot("approvals", "approve", at_terminal, *args)
        assert again.returncode == 1
        assert f"already denied by {user} (terminal) at" in again.stdout
        shown = run_echo_bot("approvals", "show", at_terminal, *args)
        assert f"deny by {user} (terminal) at" in shown.stdout

        bot.type("/run touch z")
        by_cli = request_id(bot.expect(r"^Approve shell_exec"))
        approved = run_echo_bot("approvals", "approve", by_cli, *args)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        bot.expect(rf"^✅ Approved by {USER} \(echo-bot approvals\) at .*{by_cli}")
        again = run_echo_bot("approvals", "approve", by_cli, *args)
        assert f"already approved by {user} (echo-bot approvals) at" in again.stdout
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


COUNT = '/tool shell_exec {"argv": ["sh", "-c", "echo ran >> count.txt"]}'


def count_runs(state: Path) -> int:
    path = workspace(state) / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_piped_lines_never_answer_a_prompt_from_before(tmp_path: Path) -> None:
    state = tmp_path / "st"
    args = ("chat", "--config", str(config_file(tmp_path)), "--state-dir", str(state))
    first = run_echo_bot(*args, input=f"{COUNT}\n")
    assert first.returncode == 0, first.stderr
    approval = request_id(first.stdout)
    assert "stays pending" in first.stdout

    second = run_echo_bot(*args, input="y\n")
    assert second.returncode == 0, second.stderr
    listed, entry = second.stdout.splitlines()[:2]
    assert "still pending (piped lines do not answer it)" in listed
    assert entry.startswith("• Approval asked: shell_exec(") and approval in entry
    assert count_runs(state) == 0
    assert approval in run_echo_bot("approvals", "list", "--state-dir", str(state)).stdout


def test_a_prompt_the_closed_pipe_could_not_show_is_shown_once_at_the_next_start(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    args = ("--config", str(config_file(tmp_path)), "--state-dir", str(state))
    code, _stderr = chat_until_its_output_closes(args, f"{COUNT}\ny\n".encode(), echo_bot_env())
    assert code == 141
    assert count_runs(state) == 0, "the unseen prompt must not have been answered"

    bot = PtyEchoBot("run", *args)
    try:
        bot.expect(r"still waiting for your answer")
        approval = request_id(bot.expect(r"^Approve shell_exec"))
        bot.type("y")
        # Its first delivery, still queued, comes before this edit (one queue per chat).
        bot.expect(rf"^✅ Approved by .*{approval}")
        bot.expect(r"exit code 0")
        assert sum(line.startswith("Approve shell_exec") for line in bot.lines) == 1
        assert count_runs(state) == 1
        assert bot.terminate() == 0
    finally:
        bot.cleanup()


def test_a_line_the_terminal_cut_is_not_sent_and_says_how_to_pass_a_long_call(
    tmp_path: Path,
) -> None:
    """A terminal passes at most 4095 bytes of one line and drops the rest: such a line
    is not sent as it is ("not valid JSON: Unterminated string"); the terminal says it
    was cut and how to pass a long call, and /tool NAME @FILE takes the arguments."""
    state = tmp_path / "st"
    workspace(state).mkdir(parents=True)
    (workspace(state) / "notes.txt").write_text("kept in the workspace\n")
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"path": "notes.txt"}))
    args = ("--config", str(config_file(tmp_path)), "--state-dir", str(state))
    bot = PtyEchoBot("run", *args)
    try:
        bot.expect(r"stop with Ctrl\+C")
        bot.type('/tool file_write {"path": "long.txt", "content": "' + "a" * 5000 + '"}')
        bot.expect(r"its end was most likely cut off; it was not sent")
        bot.type(f"/tool file_read @{arguments}")
        bot.expect(r"kept in the workspace")
        bot.type("/tool file_read @/nonexistent/args.json")
        bot.expect(r"Cannot read the arguments from /nonexistent/args.json: No such file")
        assert not (workspace(state) / "long.txt").exists()
    finally:
        bot.cleanup()


def test_the_terminal_offers_allow_here_for_an_hour_as_the_console_does(tmp_path: Path) -> None:
    """The console offered "Allow here for 1 h" for the terminal's requests, which the
    terminal's [y/N] never did: `a` answers it there now."""
    state = tmp_path / "st"
    args = ("--config", str(config_file(tmp_path)), "--state-dir", str(state))
    bot = PtyEchoBot("run", *args)
    try:
        bot.expect(r"stop with Ctrl\+C")
        write = '/tool file_write {"path": "log.txt", "content": "x", "append": true}'
        bot.type(write)
        bot.expect(r"^Approve file_write\(.*\)\? \[y/N\] .* — or a: allow it here for 1 h")
        bot.type("a")
        bot.expect(r"Appended 1 bytes")
        bot.type(write)  # the same call again: runs unasked within the hour
        bot.expect(r"Appended 1 bytes")
        assert (workspace(state) / "log.txt").read_text() == "xx"
        assert not any(line.startswith("Approve") for line in bot.lines[-3:])
    finally:
        bot.cleanup()
