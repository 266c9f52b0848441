"""A step's calls are inserted once, as they end up in the unit of work that adds them
(settled: approved, waiting or finished), never inserted and then updated; a read in the
same unit of work sees them, and a rolled-back one leaves none."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from echo_bot.conversation import ToolCall
from echo_bot.secrets import Masker
from echo_bot.statuses import CallStatus
from echo_bot.store import Database, Store, Tx


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    made = Store(Database(tmp_path / "calls.sqlite3"), Masker())
    made.open_sync()
    try:
        yield made
    finally:
        made.close_sync()


def add_two(tx: Tx) -> None:
    calls = [(ToolCall(id=f"c{i}", name="current_time", args={"n": i}), f"h{i}") for i in (0, 1)]
    tx.turns.add_calls("t1", 0, calls)


def traced(store: Store, fn: Callable[[Tx], None]) -> list[str]:
    """The INSERTs and UPDATEs ``fn``'s unit of work sent, each cut to its first words."""
    sent: list[str] = []

    def job(tx: Tx) -> None:
        conn: sqlite3.Connection = tx._db.conn  # type: ignore[assignment]
        conn.set_trace_callback(sent.append)
        fn(tx)
        tx.flush()
        conn.set_trace_callback(None)

    store.run_sync(job)
    return [" ".join(s.split()[:3]) for s in sent if s.split()[0] in {"INSERT", "UPDATE"}]


def test_calls_settled_where_they_are_added_are_inserted_once_as_they_end_up(
    store: Store,
) -> None:
    def settle(tx: Tx) -> None:
        add_two(tx)
        tx.turns.set_call("c0", CallStatus.APPROVED)
        tx.turns.set_call("c1", CallStatus.WAITING, approval_id="a1")

    assert traced(store, settle) == ["INSERT INTO tool_calls"] * 2  # a row each, no UPDATE
    calls = store.run_sync(lambda tx: tx.turns.calls_of_step("t1", 0))
    assert [(c.id, c.status, c.approval_id, c.args) for c in calls] == [
        ("c0", CallStatus.APPROVED, None, {"n": 0}),
        ("c1", CallStatus.WAITING, "a1", {"n": 1}),
    ]


def test_a_call_finished_where_it_is_added_keeps_its_result(store: Store) -> None:
    def finish(tx: Tx) -> None:
        add_two(tx)
        tx.turns.set_call("c1", CallStatus.DONE, result={"ok": False, "output": "invalid"})

    store.run_sync(finish)
    calls = store.run_sync(lambda tx: tx.turns.calls_of_step("t1", 0))
    assert [(c.status, c.result) for c in calls] == [
        (CallStatus.PLANNED, None),
        (CallStatus.DONE, {"ok": False, "output": "invalid"}),
    ]
    assert store.run_sync(lambda tx: tx.turns.call_count(started=True)) == 0


def test_a_read_in_the_same_unit_of_work_sees_the_calls_and_later_changes_are_updates(
    store: Store,
) -> None:
    seen: list[list[str]] = []

    def add_read_change(tx: Tx) -> None:
        add_two(tx)
        seen.append([c.id for c in tx.turns.calls_of_step("t1", 0)])
        tx.turns.set_call("c0", CallStatus.STARTED)

    assert traced(store, add_read_change) == ["INSERT INTO tool_calls"] * 2 + [
        "UPDATE tool_calls SET"
    ]
    assert seen == [["c0", "c1"]]
    assert store.run_sync(lambda tx: tx.turns.call_count(started=True)) == 1


def test_a_unit_of_work_rolled_back_leaves_no_call(store: Store) -> None:
    def add_then_fail(tx: Tx) -> None:
        add_two(tx)
        raise ValueError("the step failed before its commit")

    with pytest.raises(ValueError, match="before its commit"):
        store.run_sync(add_then_fail)
    assert store.run_sync(lambda tx: tx.turns.call_count()) == 0
