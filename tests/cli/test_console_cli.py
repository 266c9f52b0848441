"""`echo-bot console link | sessions | revoke`, run as the user runs them, on the store
the daemon would use (SQLite, and PostgreSQL where the test says so)."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from pathlib import Path

import pytest

from echo_bot.console.auth import digest, session_of, sign_in
from echo_bot.plugins import example_ids
from echo_bot.store import Tx
from tests.conftest import ON_POSTGRES, echo_bot_env, read_store, run_echo_bot

CONSOLE = "[console]\nenabled = true\n[telegram]\nallowed_users = [42, 7]\napprovers = [42]\n"
LINK = re.compile(r"^  (http://127\.0\.0\.1:8080/console/login\?t=(\S+))$", re.M)
HOUR = 3600.0


def console_cli(
    tmp_path: Path, config_text: str = CONSOLE
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The options and environment of a management command on this test's store: the
    state dir's SQLite file, or the PostgreSQL database of ``on_both_engines``."""
    env = echo_bot_env()
    url = ON_POSTGRES.get()
    if url is not None:
        config_text += '[storage]\nengine = "postgres"\n'
        env["ECHO_BOT_DATABASE_URL"] = url
    config = tmp_path / "c.toml"
    config.write_text(config_text)
    return ("--config", str(config), "--state-dir", str(tmp_path / "st")), env


def console(
    args: tuple[str, ...], env: dict[str, str], *command: str
) -> subprocess.CompletedProcess[str]:
    return run_echo_bot("console", *command, *args, env=env)


def secret_of(stdout: str) -> str:
    match = LINK.search(stdout)
    assert match, stdout
    return match.group(2)


def test_a_link_is_printed_and_signs_in_once(tmp_path: Path, on_both_engines: str) -> None:
    args, env = console_cli(tmp_path)
    made = console(args, env, "link")
    assert made.returncode == 0, made.stderr
    owner = pwd.getpwuid(os.getuid()).pw_name
    assert made.stdout.splitlines()[0] == f"Sign-in link to the console for {owner} (the owner):"
    assert re.search(r"It works once, until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\.", made.stdout)
    secret = secret_of(made.stdout)
    state = tmp_path / "st"

    first = read_store(state, lambda tx: sign_in(tx, secret, HOUR, "browser"))
    assert first is not None
    assert first.row.approver == {"channel": "echo-bot", "id": owner, "name": owner}
    assert read_store(state, lambda tx: sign_in(tx, secret, HOUR, "browser")) is None

    approver = console(args, env, "link", "--as", "telegram:42")
    assert approver.returncode == 0, approver.stderr
    assert "for telegram:42:" in approver.stdout
    signed = read_store(state, lambda tx: sign_in(tx, secret_of(approver.stdout), HOUR, "b"))
    assert signed is not None
    assert signed.row.approver == {"channel": "telegram", "id": "42", "name": "42"}
    # The store keeps a digest, never the link.
    assert read_store(state, lambda tx: tx.console.sessions(time.time())) != []


def add_session(tx: Tx, session_id: str, secret: str, *, ago: float = 0.0, agent: str = "") -> None:
    now = time.time() - ago
    approver = {"channel": "telegram", "id": "42", "name": "Ann"}
    tx.console.add_session(session_id, digest(secret), approver, "csrf", now, now + HOUR, agent)


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_sessions_are_listed_and_revoked_by_a_prefix_or_all(
    tmp_path: Path, on_both_engines: str
) -> None:
    args, env = console_cli(tmp_path)
    assert console(args, env, "link").returncode == 0  # makes the store
    state = tmp_path / "st"

    def seed(tx: Tx) -> None:
        add_session(tx, "c0ffee000001", "one", agent="Firefox\x1b[2J\u202e")
        add_session(tx, "c0ffee000002", "two")
        add_session(tx, "beef00000001", "three")
        add_session(tx, "dead00000001", "old", ago=2 * HOUR)  # expired an hour ago

    read_store(state, seed)
    listed = console(args, env, "sessions")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert sorted(line.split()[0] for line in lines) == [
        "beef00000001",
        "c0ffee000001",
        "c0ffee000002",
    ]
    first = next(line for line in lines if line.startswith("c0ffee000001"))
    assert "  telegram:42 (console)  created " in first
    assert first.endswith("Firefox\\u001b[2J\\u202e")  # escaped, never a terminal control

    ambiguous = console(args, env, "revoke", "c0ffee00000")
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.strip() == (
        "echo-bot: c0ffee00000 is ambiguous: it begins 2 session ids: c0ffee000001,"
        " c0ffee000002; give more characters"
    )
    assert read_store(state, lambda tx: session_of(tx, "two")) is not None
    ended = console(args, env, "revoke", "C0FFEE000002")
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith("Ended session c0ffee000002 of telegram:42 (console)")
    assert read_store(state, lambda tx: session_of(tx, "two")) is None
    assert read_store(state, lambda tx: session_of(tx, "one")) is not None

    again = console(args, env, "revoke", "c0ffee000002")
    assert again.returncode == 1
    assert re.fullmatch(
        r"echo-bot: session c0ffee000002 had already ended \(revoked [-0-9: ]+ UTC\);"
        r" nothing changed\n",
        again.stderr,
    )
    expired = console(args, env, "revoke", "dead00")
    assert (expired.returncode, expired.stderr) == (
        1,
        "echo-bot: session dead00000001 had already ended (expired); nothing changed\n",
    )
    unknown = console(args, env, "revoke", "abcdef")
    assert (unknown.returncode, unknown.stderr) == (1, "echo-bot: no console session abcdef\n")
    short = console(args, env, "revoke", "c0f")
    assert short.returncode == 2 and "at least its first 6 characters" in short.stderr

    everything = console(args, env, "revoke", "--all")
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.startswith("Ended 2 session(s)")
    assert read_store(state, lambda tx: [session_of(tx, s) for s in ("one", "three")]) == [
        None,
        None,
    ]
    assert console(args, env, "sessions").stdout == "No live console sessions.\n"
    states = {
        line.split()[0]: line.split("UTC  ")[2].split()[0]
        for line in console(args, env, "sessions", "--all").stdout.splitlines()
    }
    assert states == {
        "c0ffee000001": "revoked",
        "c0ffee000002": "revoked",
        "beef00000001": "revoked",
        "dead00000001": "expired",
    }
    nothing = console(args, env, "revoke", "--all")
    assert (nothing.returncode, nothing.stdout) == (
        0,
        "No live console sessions; nothing changed.\n",
    )
    both = console(args, env, "revoke", "c0ffee000001", "--all")
    assert both.returncode == 2 and "a session id or --all" in both.stderr


@pytest.mark.parametrize(
    "given",
    [
        "telegram:",
        ":1",
        "echo-bot:alice",
        "echo-bot:console",
        "cli:owner",
        "telegram:7",  # allowed to chat, not an approver
        "telegram:042",
        "telegram:42\u202e",
        "telegram:4\x1b[31m2\nfake line",
        "telegram:" + "9" * 5000,
        "nochannel",
        "@me:example.org",  # a Matrix ID without its channel
        "12345",  # a Telegram ID without its channel
    ],
    ids=lambda given: repr(given[:24]),
)
def test_a_hostile_as_value_is_one_clear_line_and_makes_no_link(tmp_path: Path, given: str) -> None:
    args, env = console_cli(tmp_path)
    refused = console(args, env, "link", "--as", given)
    assert refused.returncode == 2
    assert refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert line.startswith('echo-bot: --as "'), line
    assert "names no approver" in line or line.endswith("; no link was made"), line
    # The given value clipped (the examples, one per installed channel, aside).
    short = line.replace(str(tmp_path / "c.toml"), "c.toml").replace(example_ids(), "…")
    assert len(short) < 160, line
    assert line.isprintable() and "\u202e" not in line
    assert not (tmp_path / "st").exists()  # nothing was stored


def test_no_link_while_the_console_is_off(tmp_path: Path) -> None:
    args, env = console_cli(tmp_path, "[console]\nenabled = false\n")
    off = console(args, env, "link")
    assert off.returncode == 2 and off.stdout == ""
    assert off.stderr == (
        f"echo-bot: the console is off in {tmp_path / 'c.toml'}: set [console] enabled = true"
        " there and restart the daemon; no link was made\n"
    )
    no_config = run_echo_bot("console", "link", "--state-dir", str(tmp_path / "st"))
    assert no_config.returncode == 2
    assert "no config file was given" in no_config.stderr and "--config" in no_config.stderr
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("given", ["@me:example.org", "12345", "U0123ABCD"])
def test_an_id_without_its_channel_is_told_how_to_write_it(tmp_path: Path, given: str) -> None:
    args, env = console_cli(tmp_path)
    refused = console(args, env, "link", "--as", given)
    assert refused.returncode == 2
    assert "write CHANNEL:ID (" in refused.stderr
    for example in ("telegram:12345", "matrix:@you:example.org", "slack:U0123ABCD"):
        assert example in refused.stderr


def test_a_matrix_id_not_an_approver_is_told_of_the_matrix_section(tmp_path: Path) -> None:
    args, env = console_cli(tmp_path)
    refused = console(args, env, "link", "--as", "matrix:@stranger:example.org")
    assert refused.returncode == 2
    assert "([matrix] approvers, else its allowed_users)" in refused.stderr, refused.stderr


def test_status_names_the_console_and_its_live_sessions(tmp_path: Path) -> None:
    args, env = console_cli(tmp_path)
    assert console(args, env, "link").returncode == 0  # the store exists now
    status = run_echo_bot("status", *args, env=env)
    assert status.returncode == 0, status.stderr
    assert "console: http://127.0.0.1:8080/console/ (0 live session(s);" in status.stdout
