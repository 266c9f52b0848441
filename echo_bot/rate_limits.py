"""A request to a network that may answer "too many requests", for every channel alike:
a short wait the network asks for is waited out here and the request made again (up to
``retries`` times); a longer one, or the last, goes back to the delivery worker as
``ChannelError(retry_after=…)``, which holds the message that long. Each such answer is
counted on the channel's link (``rate_limited`` on /healthz)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .bus import ChannelLink
from .errors import ChannelError, EchoBotError

log = logging.getLogger(__name__)

T = TypeVar("T")


class RateLimited(EchoBotError):
    """The network said "too many requests": again in ``wait`` seconds."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"rate limited for {wait:.1f} s")
        self.wait = wait


async def within_limits(
    attempt: Callable[[int], Awaitable[T]],
    *,
    link: ChannelLink,
    what: str,
    retries: int,
    wait_max: float,
    held: Callable[[float], None] = lambda seconds: None,
) -> T:
    """``attempt(n)`` (n: the tries before it) until it answers; it raises
    ``RateLimited`` for "too many requests", which ``held`` is told of (the channel's
    pacer holds its sends that long)."""
    for tried in range(retries + 1):
        try:
            return await attempt(tried)
        except RateLimited as limited:
            link.count("rate_limited")  # each such answer, waited out or handed back
            held(limited.wait)
            if limited.wait > wait_max or tried == retries:
                raise ChannelError(f"{what}: rate limited", retry_after=limited.wait) from None
            log.info("%s: rate limited; again in %.1f s", what, limited.wait)
    raise AssertionError("unreachable")
