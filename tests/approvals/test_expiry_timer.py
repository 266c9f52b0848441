"""The expiry timer (``approvals.Decisions``): it sleeps until the next request's
deadline, a request committed meanwhile re-arms it, and it does not look at the store
every second to find out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from echo_bot.approvals import ApprovalGate
from echo_bot.approvals import decisions as decisions_module
from echo_bot.approvals.decisions import Decisions
from echo_bot.secrets import Masker
from echo_bot.statuses import ApprovalStatus
from echo_bot.store import Database, Store
from echo_bot.store.approvals import NewApproval
from tests.waiting import eventually


def request(approval_id: str, expires_at: float) -> NewApproval:
    return NewApproval(
        id=approval_id,
        turn_id=f"turn-{approval_id}",
        session_key="cli:local",
        trace_id="trace",
        tool="shell_exec",
        args={"command": "ls"},
        args_hash="hash",
        risk="dangerous",
        requested_by={"id": "u", "name": "Ann"},
        origin="cli:local",
        prompt_to="echo-bot:approvals",
        prompt_outbound_id=None,  # no prompt to edit
        expires_at=expires_at,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    db = Database(tmp_path / "x.sqlite3")
    await db.open()
    yield Store(db, Masker(), instance="host-1")
    await db.close()


async def test_a_new_request_rearms_the_timer_and_expires_on_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without being told, the timer would not look again for an hour.
    monkeypatch.setattr(decisions_module, "EXPIRY_RECHECK", 3600.0)
    resumed: list[str] = []
    # Expiring reads neither the approvers nor the timeout.
    gate = ApprovalGate(live=None, masker=Masker())  # type: ignore[arg-type]
    timer = Decisions(store=store, gate=gate, resume=resumed.extend)
    timer.start()
    try:
        await eventually(lambda: timer.looked >= 1, what="the timer's first look")
        soon = time.time() + 0.2
        await store.run(lambda tx: tx.approvals.insert(request("a1", soon)))
        await eventually(lambda: resumed == ["turn-a1"], what="the expired request's turn")
        row = await store.run(lambda tx: tx.approvals.get("a1"))
        assert row is not None and row.status == ApprovalStatus.EXPIRED
        # The first look, the one the request re-armed, and the one at its deadline:
        # not a look every second.
        assert timer.looked <= 3, timer.looked
    finally:
        await timer.stop()


async def test_what_fell_due_while_stopped_expires_at_start(store: Store) -> None:
    await store.run(lambda tx: tx.approvals.insert(request("old", time.time() - 1)))
    resumed: list[str] = []
    gate = ApprovalGate(live=None, masker=Masker())  # type: ignore[arg-type]
    timer = Decisions(store=store, gate=gate, resume=resumed.extend)
    timer.start()
    try:
        await eventually(lambda: resumed == ["turn-old"], what="the overdue request's turn")
    finally:
        await timer.stop()
