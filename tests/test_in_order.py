"""Deliveries pushed down one connection (echo_bot/in_order.py): taken in the order they
came, each acknowledged only once taken; one the store did not take is not
acknowledged (it comes again), one that cannot be read is, and nothing stops the rest."""

from __future__ import annotations

import asyncio
import logging

from echo_bot.errors import CommitFailed
from echo_bot.in_order import InOrder
from tests.waiting import eventually


async def test_each_is_taken_in_order_and_acknowledged_only_once_taken() -> None:
    taken: list[str] = []
    acked: list[str] = []

    async def take(item: str) -> None:
        await asyncio.sleep(0.01 if item == "a" else 0)  # a slow first one keeps its place
        if item == "refused":
            raise CommitFailed("the store is away")
        if item == "garbled":
            raise ValueError("cannot be read")
        taken.append(item)

    async def ack(item: str) -> None:
        if item == "c":
            raise ConnectionResetError("the connection went")
        acked.append(item)

    deliveries = InOrder(take, ack, named=str, log=logging.getLogger("test"))
    worker = asyncio.create_task(deliveries.run())
    try:
        for item in ("a", "refused", "b", "garbled", "c", "d"):
            deliveries.put(item)
        await eventually(lambda: acked[-1:] == ["d"], what="the last one acknowledged")
    finally:
        worker.cancel()
    assert taken == ["a", "b", "c", "d"]
    assert acked == ["a", "b", "garbled", "d"]  # not "refused"; "c"'s ack was lost
