"""Management commands whose reads moved behind the store boundary, run as the user runs
them: `echo-bot webhook deliveries` (its listing) and request ids given by a prefix."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from echo_bot.events import Address, InboundMessage, InboundStatus, MessageInbound, Sender
from echo_bot.secrets import Masker
from echo_bot.statedir import StateLock
from echo_bot.store import DB_FILENAME, Database, Store, Tx
from echo_bot.store.approvals import NewApproval
from tests.conftest import echo_bot_cmd, echo_bot_env, run_echo_bot


def seeded(state: Path, fn: Callable[[Tx], object]) -> None:
    store = Store(Database(state / DB_FILENAME), Masker())
    store.open_sync()
    try:
        store.run_sync(fn)
    finally:
        store.close_sync()


def delivery(route: str, n: int) -> InboundMessage:
    return MessageInbound(
        address=Address(channel="webhook", chat_id=route),
        sender=Sender(id="sender", name="sender"),
        text=f"body {n}",
        external_id=f"delivery-{n}",
    )


def test_webhook_deliveries_lists_the_newest_first_with_their_outcome(tmp_path: Path) -> None:
    state = tmp_path / "st"
    made = [delivery(route, n) for n, route in enumerate(["gh", "ci", "gh"])]
    chat = MessageInbound(  # not a webhook delivery: never listed
        address=Address(channel="cli", chat_id="local"),
        sender=Sender(id="me", name="me"),
        text="hello",
    )

    def seed(tx: Tx) -> None:
        for message in [*made, chat]:
            tx.inbox.add(message)
        tx.inbox.set_status(made[0].id, InboundStatus.FAILED, error="the tool\n  failed")
        tx.inbox.set_status(made[1].id, InboundStatus.DONE, result="ok " * 40)

    seeded(state, seed)
    listing = run_echo_bot("webhook", "deliveries", "--state-dir", str(state))
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert [line.split()[3] for line in lines] == [m.id for m in reversed(made)]
    assert [line.split()[4:6] for line in lines] == [
        ["gh", "accepted"],
        ["ci", "done"],
        ["gh", "failed"],
    ]
    assert lines[1].endswith("done             " + ("ok " * 40).strip()[:80])
    assert lines[2].endswith("failed           the tool failed")
    one_route = run_echo_bot(
        "webhook", "deliveries", "gh", "--limit", "1", "--state-dir", str(state)
    )
    assert [line.split()[3] for line in one_route.stdout.splitlines()] == [made[2].id]


def test_a_request_id_prefix_finds_the_request_or_says_which_ones_it_begins(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"

    def request(tx: Tx, approval_id: str) -> None:
        tx.approvals.insert(NewApproval(
            id=approval_id, turn_id="turn", session_key="cli:local", trace_id="trace",
            tool="shell_exec", args={"command": "ls"}, args_hash="hash", risk="dangerous",
            requested_by={"id": "u", "name": "Ann"}, origin="cli:local", prompt_to="cli:local",
            prompt_outbound_id=None, expires_at=4_000_000_000.0, grant_scope=None,
        ))  # fmt: skip

    def requests(tx: Tx) -> None:
        for i in ("c0ffee01", "c0ffee02", "c0ffee"):
            request(tx, i)

    seeded(state, requests)
    exact = run_echo_bot("approvals", "show", "c0ffee", "--state-dir", str(state))
    assert exact.returncode == 0, exact.stderr
    assert exact.stdout.splitlines()[0] == "request:   c0ffee"
    ambiguous = run_echo_bot("approvals", "show", "c0ffee0", "--state-dir", str(state))
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.strip() == (
        "echo-bot: c0ffee0 is ambiguous: it begins 2 request ids: c0ffee01, c0ffee02;"
        " give more characters"
    )
    unique = run_echo_bot("approvals", "show", "C0FFEE02", "--state-dir", str(state))
    assert unique.stdout.splitlines()[0] == "request:   c0ffee02"


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_one_webhook_delivery_by_a_prefix_with_readable_times(tmp_path: Path) -> None:
    state = tmp_path / "st"
    made = [delivery("gh", n) for n in range(3)]
    made[0] = made[0].model_copy(update={"id": "beef0001" + made[0].id[8:]})
    made[1] = made[1].model_copy(update={"id": "beef0002" + made[1].id[8:]})
    chat = MessageInbound(  # a prefix never finds what is not a webhook delivery
        id="beef0003" + made[2].id[8:],
        address=Address(channel="cli", chat_id="local"),
        sender=Sender(id="me", name="me"),
        text="hello",
    )

    def seed(tx: Tx) -> None:
        for message in [*made, chat]:
            tx.inbox.add(message)
        tx.inbox.set_status(made[1].id, InboundStatus.DONE, result="shell_exec: exit code 0")

    seeded(state, seed)

    def deliveries(given: str):  # type: ignore[no-untyped-def]
        return run_echo_bot("webhook", "deliveries", "--id", given, "--state-dir", str(state))

    one = deliveries("BEEF0002")
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert lines[:3] == [f"delivery:  {made[1].id}", "route:     gh", "status:    done"]
    assert re.fullmatch(r"received:  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", lines[3]), lines
    assert re.fullmatch(r"updated:   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", lines[4]), lines
    assert lines[5] == "result:    shell_exec: exit code 0"
    assert deliveries(made[2].id).stdout.splitlines()[0] == f"delivery:  {made[2].id}"

    ambiguous = deliveries("beef000")
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.strip() == (
        f"echo-bot: beef000 is ambiguous: it begins 2 delivery ids: {made[0].id},"
        f" {made[1].id}; give more characters"
    )
    assert deliveries("beef0003").returncode == 1  # the terminal's message
    assert "no webhook delivery beef0003" in deliveries("beef0003").stderr
    short = deliveries("beef")
    assert short.returncode == 2 and "at least its first 6 characters" in short.stderr


def test_ctrl_c_while_a_decision_waits_says_it_was_submitted(tmp_path: Path) -> None:
    """The owner stops `approvals approve --wait` (the daemon is slow to apply it): the
    decision is in and will be applied, and the command says so, not nothing."""
    state = tmp_path / "st"
    seeded(state, lambda tx: tx.approvals.insert(NewApproval(
        id="c0ffee01", turn_id="turn", session_key="cli:local", trace_id="trace",
        tool="shell_exec", args={"command": "ls"}, args_hash="hash", risk="dangerous",
        requested_by={"id": "u", "name": "Ann"}, origin="cli:local", prompt_to="cli:local",
        prompt_outbound_id=None, expires_at=4_000_000_000.0, grant_scope=None,
    )))  # fmt: skip
    lock = StateLock(state)  # a daemon that holds the state dir, and applies nothing yet
    lock.acquire()
    try:
        waiting = subprocess.Popen(
            echo_bot_cmd("approvals", "approve", "c0ffee01", "--wait", "30", "--state-dir",
                         str(state)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=echo_bot_env(),
        )  # fmt: skip

        def submitted(tx: Tx) -> bool:
            return any(s.session_key.endswith(":admin") for s in tx.inbox.recent("cli", limit=5))

        deadline = time.monotonic() + 20
        while not seeded_read(state, submitted) and time.monotonic() < deadline:
            time.sleep(0.1)
        waiting.send_signal(signal.SIGINT)
        _, stderr = waiting.communicate(timeout=20)
    finally:
        lock.release()
    assert waiting.returncode == 130, stderr
    assert "already submitted" in stderr and "c0ffee01" in stderr and "Traceback" not in stderr


def seeded_read(state: Path, fn: Callable[[Tx], bool]) -> bool:
    store = Store(Database(state / DB_FILENAME), Masker())
    store.open_sync(create=False)
    try:
        return store.run_sync(fn)
    finally:
        store.close_sync()
