"""The soak test, shortened: a real `echo-bot run` under mixed load (Telegram messages,
signed webhook deliveries, reminders, approvals) is SIGKILLed and restarted a few times;
nothing is lost, nothing runs twice, duplicates are only sends in flight at a kill.

The long run is `python bench/soak.py --kills 20 --seed 1` (bench/README.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _load_soak() -> ModuleType:
    name = "echo_bot_bench_soak"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


soak = _load_soak()


def _row(seq: int, text: str, receipt: str | None, finished_at: float = 100.0) -> object:
    return soak.OutRow(
        seq=seq,
        id=f"out{seq}",
        chat_key="telegram:7",
        status="sent",
        finished_at=finished_at,
        payload={"text": text, "kind": "reply"},
        receipt=receipt,
    )


def _sent(index: int, text: str, message_id: int, incarnation: int) -> object:
    return soak.Sent(
        index=index,
        at=float(index),
        chat=7,
        text=text,
        reply_to=None,
        message_id=message_id,
        incarnation=incarnation,
    )


def test_duplicates_are_told_apart_by_the_kills_between_their_copies() -> None:
    incarnations = [
        soak.Incarnation(0, pid=1, spawn_mono=0.0, kill_mono=2.5, kill_wall=50.0),
        soak.Incarnation(1, pid=2, spawn_mono=3.0),
    ]
    rows = [_row(1, "one", "11"), _row(2, "two", "13"), _row(3, "three", "14")]
    sent = [
        _sent(1, "one", 10, 0),  # the daemon was killed before it marked this sent…
        _sent(4, "one", 11, 1),  # …so the next one sent it again: in flight
        _sent(5, "two", 12, 1),  # repeated by the same daemon, no kill between: a bug
        _sent(6, "two", 13, 1),
        _sent(7, "three", 14, 1),
        _sent(8, "stray", 15, 1),  # no outbox row explains it
    ]
    alignment = soak.align(rows, sent)
    assert [s.message_id for s in alignment.unattributed] == [15]
    assert alignment.out_of_order == []
    dups = soak.judge_duplicates(alignment.copies.values(), incarnations)
    assert (dups.in_flight, dups.otherwise) == (1, 1)
    assert dups.otherwise_rows == {"out2"}

    # Marked sent before the kill, yet sent again afterwards: not "in flight" either.
    early = [_row(1, "one", "11", finished_at=40.0)]
    alignment = soak.align(early, sent[:2])
    dups = soak.judge_duplicates(alignment.copies.values(), incarnations)
    assert (dups.in_flight, dups.otherwise) == (0, 1)


@pytest.mark.timeout(180)
@pytest.mark.xdist_group("bench")
async def test_short_soak_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    """On the benchmarks' xdist worker (``xdist_group("bench")``, tests/test_bench_smoke):
    the soak's daemon, its load and its kills keep a core busy for a minute, which the
    benchmark scripts must not share."""
    cfg = soak.SoakConfig(
        seed=1,
        kills=3,
        users=3,
        messages=12,
        reminders=4,
        webhooks=5,
        approvals=3,
        min_up=0.3,
        max_up=1.5,
        max_down=0.5,
        startup_kill_chance=0.25,
        late_outage=0.0,
        min_reminder_delay=2,
        max_reminder_delay=8,
        drain_timeout=45.0,
        quiet=1.0,
        max_seconds=150.0,
    )
    result = await soak.run_soak(cfg, tmp_path / "soak")
    table = result.table()
    print(table)
    counts = result.counts
    assert result.ok, table
    assert counts["kills"] == 3
    assert counts["sent"] == counts["acknowledged"] == counts["answered"] == 19
    assert counts["lost"] == 0 and counts["dup_otherwise"] == 0, table
    assert counts["webhooks_accepted"] == counts["webhooks_finished"] == 5
    assert counts["reminders_delivered"] == counts["reminders_set"] > 0
    assert counts["reminders_twice"] == 0 and counts["effects_twice"] == 0
    assert counts["effects"] + counts["unknown_approvals"] >= counts["approvals_pressed"] == 3
    assert counts["integrity"] == "ok" and counts["exit_code"] == 0
