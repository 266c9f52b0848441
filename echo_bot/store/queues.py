"""The bus's inbox and outbox on the store (``bus.Inbox``, ``bus.Outbox``): each call one
unit of work, its outcome only after the COMMIT. The bus is a leaf and cannot name the
store; this is the one adapter between them. Every other part calls ``store.run``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..bus import Published
from ..events import InboundMessage, InboundStatus, OutboundMessage

if TYPE_CHECKING:
    from .tx import Store


class BusQueues:
    """``Bus(queues, queues)``: publishing commits the inbound, sending queues the
    outbound; the store tells the dispatcher and the delivery worker after the commit."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    async def add(self, message: InboundMessage) -> Published:
        """Commit ``message``. When the publisher gives up meanwhile, the dispatcher is
        told all the same (the store announces what was committed; the dispatcher's poll
        never reads this process's rows)."""
        return await self._store.run(lambda tx: tx.inbox.add(message))

    async def status_of(self, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
        return await self._store.run(lambda tx: tx.inbox.status_of(inbound_id))

    async def describe(self, inbound_id: str) -> dict[str, object] | None:
        return await self._store.run(lambda tx: tx.inbox.describe(inbound_id))

    async def enqueue(self, message: OutboundMessage) -> None:
        await self._store.run(lambda tx: tx.outbox.add(message))
