"""`echo-bot run` as a real process on Slack (Socket Mode, against the fake Slack in this
test's loop): killed between the receipt of an envelope and its commit, it loses and
repeats nothing — Slack sends the unacknowledged envelope again, to the next start.

The window is made certain, not hoped for: the daemon is frozen (SIGSTOP), the envelope
is written to its socket, and it is killed (SIGKILL) before it could read it; the
daemon that starts next gets the envelope again and answers it once. A burst cut by a
kill at a random point is then answered whole, each message once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from echo_bot.brains.rules import no_match_hint
from tests.channels.contract.drivers import SLACK_DM, SLACK_OWNER
from tests.conftest import echo_bot_env
from tests.fakes.slack_api import FakeSlack
from tests.proc import Daemon
from tests.waiting import eventually

pytestmark = pytest.mark.slow


def config_text(slack: FakeSlack) -> str:
    return f"""
[slack]
enabled = true
api_base = "{slack.base_url}"
allowed_users = ["{SLACK_OWNER}"]
[http]
port = 0
"""


def answers(slack: FakeSlack) -> int:
    hint = no_match_hint("!")  # Slack's commands start with !
    return sum(1 for m in slack.messages.get(SLACK_DM, []) if m.get("text") == hint)


def stored(state: Path) -> list[str]:
    """The Slack inbounds' event IDs the store holds."""
    with contextlib.closing(sqlite3.connect(state / "echo-bot.sqlite3", timeout=10)) as conn:
        rows = conn.execute("SELECT external_id FROM inbox WHERE channel = 'slack'").fetchall()
    return [str(r[0]) for r in rows]


async def test_sigkill_between_receipt_and_commit_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    state, config = tmp_path / "state", tmp_path / "config.toml"
    async with FakeSlack() as slack:
        slack.ack_timeout = 2.0  # redelivered when unacknowledged this long
        slack.delivery_timeout = 60.0  # a redelivery waits for the next connection
        config.write_text(config_text(slack))
        env = echo_bot_env(SLACK_BOT_TOKEN=slack.bot_token, SLACK_APP_TOKEN=slack.app_token)
        daemon = Daemon(config, state, env)
        await daemon.start()
        try:
            await eventually(lambda: slack.connections == 1, timeout=30, what="connected")
            first = await slack.push_message("zz first words", user=SLACK_OWNER)
            await slack.wait_acked(first, timeout=30)
            await eventually(lambda: answers(slack) == 1, timeout=30, what="the first answer")

            assert daemon.proc is not None
            os.kill(daemon.proc.pid, signal.SIGSTOP)
            frozen = await slack.push_message("zz sent to a frozen daemon", user=SLACK_OWNER)
            await daemon.kill()  # it never read the envelope: not stored, not acknowledged
            assert not slack.acked(frozen)
            assert frozen.event_id not in await asyncio.to_thread(stored, state)

            daemon = Daemon(config, state, env)
            await daemon.start()
            await eventually(lambda: len(slack.deliveries(frozen.event_id or "")) >= 2,
                             timeout=30, what="the envelope sent again")  # fmt: skip
            await eventually(lambda: answers(slack) == 2, timeout=30, what="its answer")

            # A burst, and a kill somewhere in it.
            burst = [await slack.push_message(f"zz burst {n}", user=SLACK_OWNER)
                     for n in range(20)]  # fmt: skip
            await eventually(lambda: any(slack.acked(e) for e in burst), timeout=30,
                             what="part of the burst taken")  # fmt: skip
            await daemon.kill()
            daemon = Daemon(config, state, env)
            await daemon.start()
            await eventually(lambda: answers(slack) >= 22, timeout=90, what="22 answers")
            last = await slack.push_message("zz and one more", user=SLACK_OWNER)
            await slack.wait_acked(last, timeout=30)
            await eventually(lambda: answers(slack) >= 23, timeout=30, what="the last answer")
        finally:
            await daemon.stop()
        events = await asyncio.to_thread(stored, state)
    assert sorted(events) == sorted(set(events)) and len(events) == 23
    assert frozen.event_id in events
    # Outbound is at-least-once: a reply in flight at the burst's kill may go twice.
    assert 23 <= answers(slack) <= 24, answers(slack)
