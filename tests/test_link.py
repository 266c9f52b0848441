"""A channel's first contact and its health are the host's (``echo_bot.link``): a peer
away never stops the daemon, a refusal fails the start once, and a channel cannot get
either wrong, whatever its own code does."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Any, cast

import pytest

from echo_bot.bus import Bus, Capabilities
from echo_bot.channel_host import start_channels
from echo_bot.errors import ConfigError, PeerAway
from echo_bot.lifecycle import Parts
from echo_bot.link import Backoff, Link
from echo_bot.previews import Previews
from echo_bot.secrets import Masker
from tests.waiting import eventually


class Peer:
    """What a channel's connect meets, one answer per try: "away", "refused", "hangs",
    or "ok" (the last one repeats)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.tries = 0

    async def connect(self) -> None:
        self.tries += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "away":
            raise PeerAway("cannot reach the peer: connection refused")
        if answer == "refused":
            raise ConfigError("token_env: the peer refused the token")
        if answer == "hangs":
            await asyncio.sleep(3600)
        if answer == "bug":
            raise RuntimeError("the channel's own bug")


class Channel:
    """The least a channel that ``connects`` is: its link, and its peer's answers."""

    name = "fake"
    capabilities = Capabilities(connects=True)

    def __init__(self, peer: Peer) -> None:
        self.link = Link("fake")
        self.link.backoff = Backoff(first=0.01, cap=0.05)
        self.link.connect_timeout = 0.2
        self.peer = peer
        self.stopped = 0

    async def start(self, bus: Bus) -> None:
        pass

    async def connect(self) -> None:
        await self.peer.connect()

    async def stop(self) -> None:
        self.stopped += 1

    def health(self) -> dict[str, object]:
        return self.link.state()


class Parts_:
    """What start_channels hands a channel to besides: no media; delivery lets go of a
    channel at once."""

    def __init__(self) -> None:
        self.released: list[str] = []

    def add_channel(self, channel: Any) -> None:
        pass

    async def release(self, name: str) -> None:
        self.released.append(name)


async def started(channel: Channel, stack: AsyncExitStack) -> None:
    delivery = Parts_()
    await start_channels(
        Parts(stack), [cast(Any, channel)], bus=cast(Any, None), delivery=cast(Any, delivery),
        media=cast(Any, None), previews=Previews(Masker()), started=[],
    )  # fmt: skip


async def test_a_peer_away_at_start_leaves_the_channel_degraded_and_tried_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = Channel(Peer("away", "away", "away", "ok"))
    async with AsyncExitStack() as stack:
        with caplog.at_level(logging.INFO, logger="channels"):
            await started(channel, stack)  # the start returns: the daemon runs
            assert channel.health()["status"] == "degraded"
            assert "connection refused" in str(channel.health()["error"])
            await eventually(lambda: channel.health() == {"status": "ok"}, what="connected")
        assert channel.peer.tries == 4
    said = [r.getMessage() for r in caplog.records]
    assert said.count("fake: cannot reach the peer: connection refused (retrying)") == 1, said
    assert "fake: connected again" in said
    assert channel.stopped == 1


async def test_a_refusal_at_start_fails_the_start_and_stops_the_channel() -> None:
    channel = Channel(Peer("refused"))
    with pytest.raises(ConfigError, match="refused the token"):
        async with AsyncExitStack() as stack:
            await started(channel, stack)
    assert channel.stopped == 1 and channel.peer.tries == 1


async def test_a_refusal_after_the_peer_was_away_leaves_the_channel_down_and_tries_no_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = Channel(Peer("away", "refused"))
    async with AsyncExitStack() as stack:
        with caplog.at_level(logging.ERROR, logger="channels"):
            await started(channel, stack)
            await eventually(lambda: channel.health()["status"] == "down", what="down")
            await asyncio.sleep(0.2)
        assert channel.peer.tries == 2
    assert channel.health()["error"] == "token_env: the peer refused the token"
    assert [r.getMessage() for r in caplog.records] == [
        "fake: token_env: the peer refused the token; fix it and restart"
    ]


async def test_a_peer_that_never_answers_is_away_and_the_stop_ends_the_tries() -> None:
    channel = Channel(Peer("hangs"))
    async with AsyncExitStack() as stack:
        await started(channel, stack)
        assert channel.health() == {"status": "degraded", "error": "no answer in 0.2 s"}
        await eventually(lambda: channel.peer.tries >= 2, what="tried again")
    tries = channel.peer.tries
    await asyncio.sleep(0.3)
    assert channel.peer.tries == tries and channel.stopped == 1


async def test_a_channel_bug_while_retrying_is_logged_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = Channel(Peer("away", "bug", "ok"))
    async with AsyncExitStack() as stack:
        with caplog.at_level(logging.ERROR, logger="channels"):
            await started(channel, stack)
            await eventually(lambda: channel.health() == {"status": "ok"}, what="connected")
    assert channel.peer.tries == 3
    assert any(r.exc_info and "connecting failed" in r.getMessage() for r in caplog.records)


async def test_whose_turn_it_is_is_said_once_per_change_and_a_standby_is_ok(
    caplog: pytest.LogCaptureFixture,
) -> None:
    link = Link("fake")

    async def answer(mine: bool) -> bool:
        return mine

    async def store_away() -> bool:
        raise OSError("the database is away")

    with caplog.at_level(logging.INFO, logger="channels"):
        assert not await link.takes_turn(store_away(), "poll", "polling now", "another polls")
        assert link.state()["status"] == "degraded"
        for mine in (False, False, True, True):
            assert (
                await link.takes_turn(answer(mine), "poll", "polling now", "another polls") is mine
            )
            if not mine:
                assert link.state() == {"status": "ok", "poll": "another daemon"}
    assert link.state() == {"status": "ok"}
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert said == ["fake: another polls", "fake: connected again", "fake: polling now"]


def test_a_link_with_parts_is_ok_once_no_part_is_away() -> None:
    link = Link("fake")
    link.connected()
    link.reconnecting("the socket is down", "socket")
    link.reconnecting("cannot reach the API", "web")
    link.back("socket")
    assert link.state() == {"status": "degraded", "error": "cannot reach the API"}
    link.back("web")
    assert link.state() == {"status": "ok"}
    link.back("web")  # a call that worked while nothing was away says nothing
    assert link.state() == {"status": "ok"}


def test_facts_show_when_set_and_counters_count() -> None:
    link = Link("fake")
    link.facts.update(mode="socket", standby=None)
    link.count("rate_limited")
    link.count("rate_limited")
    link.refused("refused the token")
    assert link.state() == {
        "status": "down", "mode": "socket", "rate_limited": 2, "error": "refused the token"
    }  # fmt: skip


async def test_receiving_takes_turns_resumes_rides_out_the_peer_and_survives_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    link = Link("fake")
    link.backoff = Backoff(first=0.01, cap=0.01)
    turns = iter([True, False, True] + [True] * 100)
    rounds: list[str] = []
    resumed: list[int] = []

    async def turn() -> bool:
        return next(turns)

    async def resume() -> None:
        resumed.append(len(rounds))

    async def once() -> None:
        rounds.append("round")
        if len(rounds) == 2:
            raise OSError("peer gone")
        if len(rounds) == 3:
            raise KeyError("a bug")
        if len(rounds) >= 5:
            await asyncio.Event().wait()

    task = asyncio.create_task(link.receive(once, resume=resume, turn=turn, away=(OSError,)))
    await eventually(lambda: len(rounds) >= 5, what="rounds after the failures")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # Resumed at the start, after standing by (the 2nd turn), and after the bug; the peer
    # away is the same position asked again.
    assert resumed == [0, 1, 3]
    assert "cannot reach the peer: peer gone" in caplog.text
    assert "receiving failed; going on" in caplog.text and "KeyError" in caplog.text
