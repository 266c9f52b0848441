"""Deliveries a network pushes down one connection (Slack's Socket Mode envelopes; a
gateway's events), for every channel alike: each handed on in the order it came, and
acknowledged only once the store took it.

``put`` queues a delivery before any await (so the order the connection gave is
kept); one worker (``run``) takes each in turn. A delivery the store did not take
(``CommitFailed``) is not acknowledged: the network sends it again. One that cannot be
read is logged and acknowledged, or it would come back for ever. A failed
acknowledgement is only logged: the connection went, and the network sends again what
it did not hear acknowledged (the inbox drops the repeat).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .errors import CommitFailed

T = TypeVar("T")


class InOrder(Generic[T]):
    def __init__(
        self,
        take: Callable[[T], Awaitable[None]],
        ack: Callable[[T], Awaitable[None]],
        *,
        named: Callable[[T], str],
        log: logging.Logger,
    ) -> None:
        self._take, self._ack, self._named, self._log = take, ack, named, log
        self._queue: asyncio.Queue[T] = asyncio.Queue()

    def put(self, delivery: T) -> None:
        self._queue.put_nowait(delivery)

    async def run(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                await self._take(delivery)
            except CommitFailed as exc:
                self._log.warning("%s not stored (it comes again): %s", self._named(delivery), exc)
                continue
            except Exception:  # one delivery never stops the ones after it
                self._log.exception("%s could not be read", self._named(delivery))
            try:
                await self._ack(delivery)
            except Exception as exc:  # the connection went: it comes again
                self._log.info("the ack of %s was not sent: %s", self._named(delivery), exc)
