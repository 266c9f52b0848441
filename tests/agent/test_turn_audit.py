"""A turn's audit rows, written together at the end of each of its transactions: all
there, in order, masked, and none lost to a crash (a real `echo-bot chat`, killed)."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from pathlib import Path

import pytest

from echo_bot.store import Tx
from echo_bot.store.audit import AuditRow
from echo_bot.store.turns import CallRow, TurnRow
from tests.conftest import echo_bot_env, read_store, run_echo_bot
from tests.proc import EchoBotProcess

SECRET = "sk-audit-secret-0123456789"
CONFIG = """
[brain]
kind = "rules"
"""
EVERY = 1_000_000_000  # a tail of the audit log longer than any it has here
# One turn of the rules brain asking for the time: its audit trail, in order.
TRAIL = ["turn.started", "brain.decision", "tool.result", "brain.decision", "turn.finished"]


def audit_by_trace(state: Path) -> dict[str | None, list[tuple[str, str]]]:
    """Each trace's audit rows (kind, data as stored: ``json.dumps`` of it, as it was
    written) in seq order."""
    rows = read_store(state, lambda tx: tx.audit.read(tail=EVERY))
    trails: dict[str | None, list[tuple[str, str]]] = defaultdict(list)
    for row in rows:
        trails[row.trace_id].append((row.kind, json.dumps(row.data)))
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
    trails = audit_by_trace(state)
    turns = [trail for trail in trails.values() if trail[0][0] == "turn.started"]
    assert [[kind for kind, _data in trail] for trail in turns] == [TRAIL, TRAIL]
    first = turns[0]
    assert '"tool": "current_time"' in first[2][1]
    assert all(SECRET not in data for trail in trails.values() for _kind, data in trail)
    assert "***" in first[0][1]  # the text with the key in it, masked


def committed_but_unaudited(state: Path) -> list[str]:
    """What the store holds of turns that their audit trail does not show."""

    def read(tx: Tx) -> tuple[list[AuditRow], list[TurnRow], list[CallRow]]:
        return tx.audit.read(tail=EVERY), tx.turns.every_turn(), tx.turns.every_call()

    audit, turns, calls = read_store(state, read)
    kinds = {(a.trace_id, a.kind, a.data.get("step"), a.data.get("call_id")) for a in audit}
    by_trace: dict[str | None, set[str]] = defaultdict(set)
    for trace_id, kind, _step, _call in kinds:
        by_trace[trace_id].add(kind)
    missing = []
    for turn in turns:
        if "turn.started" not in by_trace[turn.trace_id]:
            missing.append(f"turn {turn.id}: no turn.started")
        if turn.status == "done" and "turn.finished" not in by_trace[turn.trace_id]:
            missing.append(f"turn {turn.id}: done without turn.finished")
    trace_of = {turn.id: turn.trace_id for turn in turns}
    for call in calls:
        trace_id, step = trace_of[call.turn_id], call.step
        if (trace_id, "brain.decision", step, None) not in kinds:
            missing.append(f"call {call.id}: no brain.decision for step {step}")
        if call.status == "done" and (trace_id, "tool.result", None, call.id) not in kinds:
            missing.append(f"call {call.id}: done without tool.result")
    return missing


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_a_killed_daemon_loses_no_audit_row_of_what_it_committed(tmp_path: Path) -> None:
    """Killed (SIGKILL) in the middle of a stream of turns, at a different point of a turn
    each time: every step, call and turn it committed has its audit rows, and after a
    restart every turn that finished has its whole trail, once."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    state = tmp_path / "st"
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
        assert committed_but_unaudited(state) == []

    # The unfinished turns finish at the next start; none is audited twice.
    again = run_echo_bot(*args, input="", timeout=120)
    assert again.returncode == 0, again.stderr
    assert committed_but_unaudited(state) == []
    finished = 0
    for trail in audit_by_trace(state).values():
        kinds = [kind for kind, _data in trail]
        if "turn.finished" in kinds:
            finished += 1
            assert kinds[0] == "turn.started" and kinds.count("turn.finished") == 1, kinds
    assert finished >= 30
