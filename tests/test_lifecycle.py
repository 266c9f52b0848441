"""Start and stop through one exit stack: the stop order is the start order reversed,
a part that fails to stop is named in the log and the others still stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from echo_bot.lifecycle import Parts
from tests.conftest import read_store, running_bot
from tests.fakes.channel import RecordingChannel


class Journal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, line: str, fail: bool = False) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.lines.append(line)
            if fail:
                raise RuntimeError(f"{line} broke")

        return run


async def test_parts_stop_in_reverse_and_a_failing_stop_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = Journal()
    async with AsyncExitStack() as stack:
        parts = Parts(stack)
        for name in ("store", "delivery", "turns"):
            fail = name == "delivery"
            await parts.start(
                name, journal.step(f"start {name}"), journal.step(f"stop {name}", fail)
            )
        assert parts.names == ["store", "delivery", "turns"]
    assert journal.lines == [
        "start store",
        "start delivery",
        "start turns",
        "stop turns",
        "stop delivery",
        "stop store",
    ]
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == ["stopping delivery failed; going on with the rest"]
    assert "delivery broke" in caplog.text  # with its traceback


async def test_a_part_that_fails_to_start_stops_only_what_started_before_it() -> None:
    journal = Journal()
    with pytest.raises(RuntimeError, match="start channel broke"):
        async with AsyncExitStack() as stack:
            parts = Parts(stack)
            await parts.start("store", journal.step("start store"), journal.step("stop store"))
            await parts.start(
                "channel", journal.step("start channel", fail=True), journal.step("stop channel")
            )
            await parts.start("http", journal.step("start http"), journal.step("stop http"))
    assert journal.lines == ["start store", "start channel", "stop store"]


class BrokenStop(RecordingChannel):
    async def stop(self) -> None:
        raise OSError("the terminal went away")


async def test_a_channel_that_fails_to_stop_is_logged_and_the_daemon_still_stops(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_bot(state_dir, channel=BrokenStop("cli")):
        assert await instances(state_dir) == 1
    # running_bot waited for run() to return; what stops after the channel did stop:
    # the daemon left the list of live ones (the instance row goes just before the store).
    assert "stopping the cli channel failed" in caplog.text
    assert "the terminal went away" in caplog.text
    assert await instances(state_dir) == 0


async def instances(state_dir: Path) -> int:
    return await asyncio.to_thread(read_store, state_dir, lambda tx: len(tx.meta.instances()))
