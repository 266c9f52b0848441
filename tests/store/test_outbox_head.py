"""An outbound queued with nothing ahead of it in its chat is announced with its row (the
delivery worker sends it without reading it back); one queued behind another is not.
The look ahead is part of the INSERT (``RETURNING … EXISTS``): on both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from echo_bot.events import Address, OutboundMessage
from echo_bot.secrets import Masker
from echo_bot.store import OutboundCommitted, Store
from tests.conftest import store_engine


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    made = Store(store_engine(tmp_path), Masker())
    await made.open()
    try:
        yield made
    finally:
        await made.close()


@pytest.mark.usefixtures("on_both_engines")
async def test_only_an_outbound_with_nothing_ahead_in_its_chat_comes_with_its_row(
    store: Store,
) -> None:
    announced: list[OutboundCommitted] = []
    store.subscribe(OutboundCommitted, announced.append)

    def to(chat: str, text: str) -> OutboundMessage:
        return OutboundMessage(to=Address(channel="cli", chat_id=chat), text=text)

    first, second, other = to("a", "first"), to("a", "second"), to("b", "other")
    for message in (first, second, other):
        await store.run(lambda tx, m=message: tx.outbox.add(m))  # type: ignore[misc]
    await store.run(lambda tx: tx.outbox.add(first))  # the same id again: nothing new
    heads = [event.head.message.text if event.head else None for event in announced]
    assert heads == ["first", None, "other", None]
    assert [event.head.seq for event in announced if event.head] == sorted(
        event.head.seq for event in announced if event.head
    )
