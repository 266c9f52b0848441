"""A turn's audit rows, written together at the end of each of its transactions: all
there, in order, masked, and none lost to a crash (a real `echo-bot chat`, killed)."""

from __future__ import annotations

import random
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

from tests.conftest import echo_bot_env, run_echo_bot
from tests.proc import EchoBotProcess

SECRET = "sk-audit-secret-0123456789"
CONFIG = """
[brain]
kind = "rules"
"""
# One turn of the rules brain asking for the time: its audit trail, in order.
TRAIL = ["turn.started", "brain.decision", "tool.result", "brain.decision", "turn.finished"]


def audit_by_trace(db: Path) -> dict[str, list[tuple[str, str]]]:
    """Each trace's audit rows (kind, data as stored) in seq order."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT trace_id, kind, data FROM audit ORDER BY seq").fetchall()
    finally:
        conn.close()
    trails: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for trace_id, kind, data in rows:
        trails[trace_id].append((kind, data))
    return trails


def test_a_turns_audit_rows_are_all_there_in_order_and_masked(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    state = tmp_path / "st"
    lines = f"what time is it? ({SECRET})\nwhat time is it?\n"
    result = run_echo_bot(
        "chat",
        "--config",
        str(config),
        "--state-dir",
        str(state),
        input=lines,
        env=echo_bot_env(OPENAI_API_KEY=SECRET),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("It is ") == 2
    trails = audit_by_trace(state / "echo-bot.sqlite3")
    turns = [trail for trail in trails.values() if trail[0][0] == "turn.started"]
    assert [[kind for kind, _data in trail] for trail in turns] == [TRAIL, TRAIL]
    first = turns[0]
    assert '"tool": "current_time"' in first[2][1]
    assert all(SECRET not in data for trail in trails.values() for _kind, data in trail)
    assert "***" in first[0][1]  # the text with the key in it, masked


def committed_but_unaudited(db: Path) -> list[str]:
    """What the store holds of turns that their audit trail does not show."""
    conn = sqlite3.connect(db)
    try:
        kinds = {
            (trace_id, kind, step, call_id)
            for trace_id, kind, step, call_id in conn.execute(
                "SELECT trace_id, kind, json_extract(data, '$.step'),"
                " json_extract(data, '$.call_id') FROM audit"
            )
        }
        by_trace: dict[str, set[str]] = defaultdict(set)
        for trace_id, kind, _step, _call in kinds:
            by_trace[trace_id].add(kind)
        missing = []
        for turn_id, trace_id, status in conn.execute("SELECT id, trace_id, status FROM turns"):
            if "turn.started" not in by_trace[trace_id]:
                missing.append(f"turn {turn_id}: no turn.started")
            if status == "done" and "turn.finished" not in by_trace[trace_id]:
                missing.append(f"turn {turn_id}: done without turn.finished")
        for call_id, trace_id, step, status in conn.execute(
            "SELECT c.id, t.trace_id, c.step, c.status FROM tool_calls c"
            " JOIN turns t ON t.id = c.turn_id"
        ):
            if (trace_id, "brain.decision", step, None) not in kinds:
                missing.append(f"call {call_id}: no brain.decision for step {step}")
            if status == "done" and (trace_id, "tool.result", None, call_id) not in kinds:
                missing.append(f"call {call_id}: done without tool.result")
        return missing
    finally:
        conn.close()


def test_a_killed_daemon_loses_no_audit_row_of_what_it_committed(tmp_path: Path) -> None:
    """Killed (SIGKILL) in the middle of a stream of turns, at a different point of a turn
    each time: every step, call and turn it committed has its audit rows, and after a
    restart every turn that finished has its whole trail, once."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    state = tmp_path / "st"
    db = state / "echo-bot.sqlite3"
    args = ("chat", "--config", str(config), "--state-dir", str(state))
    chance = random.Random(14)
    for _round in range(6):
        bot = EchoBotProcess(*args)
        try:
            bot.expect_stderr(r"^state: ")
            for _ in range(50):
                bot.send("what time is it?")
            for _ in range(5):
                bot.expect_stdout(r"^It is ", timeout=30)
            time.sleep(chance.uniform(0, 0.005))  # somewhere in a later turn
            bot.kill9()
        finally:
            bot.cleanup()
        assert committed_but_unaudited(db) == []

    # The unfinished turns finish at the next start; none is audited twice.
    again = run_echo_bot(*args, input="", timeout=120)
    assert again.returncode == 0, again.stderr
    assert committed_but_unaudited(db) == []
    finished = 0
    for trail in audit_by_trace(db).values():
        kinds = [kind for kind, _data in trail]
        if "turn.finished" in kinds:
            finished += 1
            assert kinds[0] == "turn.started" and kinds.count("turn.finished") == 1, kinds
    assert finished >= 30
