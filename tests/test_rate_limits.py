"""'Too many requests' (echo_bot/rate_limits.py): a short wait is waited out and the
request made again, a long one or the last goes back to the delivery worker with the
wait, each counted on the channel's link and told to its pacer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from echo_bot.errors import ChannelError
from echo_bot.link import Link
from echo_bot.rate_limits import RateLimited, within_limits


def network(*waits: float) -> tuple[list[int], Callable[[int], Awaitable[str]]]:
    """An attempt refused with each of ``waits`` in turn, then answered."""
    tries: list[int] = []

    async def attempt(tried: int) -> str:
        tries.append(tried)
        if len(tries) <= len(waits):
            raise RateLimited(waits[len(tries) - 1])
        return "sent"

    return tries, attempt


def counted(link: Link) -> object:
    return link.facts.get("rate_limited")


async def test_short_waits_are_waited_out_and_a_long_one_goes_back_to_delivery() -> None:
    link = Link("net")
    held: list[float] = []
    tries, attempt = network(0.01, 0.02)
    answer = await within_limits(attempt, link=link, what="net: send", retries=3,
                                 wait_max=1.0, held=held.append)  # fmt: skip
    assert answer == "sent" and tries == [0, 1, 2] and held == [0.01, 0.02]
    assert counted(link) == 2

    tries, attempt = network(30.0)
    with pytest.raises(ChannelError) as caught:
        await within_limits(attempt, link=link, what="net: send", retries=3, wait_max=1.0)
    assert caught.value.retry_after == 30.0 and tries == [0]  # not waited here
    assert counted(link) == 3


async def test_the_last_try_refused_hands_its_wait_back() -> None:
    tries, attempt = network(0.01, 0.01, 0.01)
    with pytest.raises(ChannelError) as caught:
        await within_limits(attempt, link=Link("net"), what="net: send", retries=2,
                            wait_max=1.0)  # fmt: skip
    assert caught.value.retry_after == 0.01 and tries == [0, 1, 2]
