"""A reply's preview on a network without drafts (echo_bot/edited_previews.py): the keys
its sends carry. A network that dedupes by key (Matrix's transaction ids, kept for about
half an hour) answers a repeated key with the message it made the first time, so a
preview made after an earlier one was removed must never repeat the removed one's keys:
else the new preview, and the reply written into it, land in the removed message."""

from __future__ import annotations

import asyncio

from echo_bot.background import Tasks
from echo_bot.edited_previews import EditedPreviews
from echo_bot.events import Address

CHAT = Address(channel="matrix", chat_id="!room:hs")


async def test_a_preview_after_a_removed_one_sends_under_keys_of_its_own() -> None:
    posted: dict[str, str] = {}  # key → message id, as a homeserver keeps transactions
    removed: list[str] = []

    async def show(to: Address, key: str, message_id: str | None, text: str, shown: int) -> str:
        txn = f"{key}.preview.{shown}"
        if message_id is None:
            return posted.setdefault(txn, f"$ev{len(posted) + 1}")
        return message_id

    async def remove(to: Address, message_id: str) -> None:
        removed.append(message_id)

    tasks = Tasks()
    previews = EditedPreviews(show, remove, tasks, interval=0.0, mark=" ✍️", keep=0.01)
    await previews.show_preview(CHAT, "inbound-1", "Let me look")
    await previews.end_preview(CHAT, "inbound-1")  # the turn waits for an approval
    await asyncio.sleep(0.1)
    assert removed == ["$ev1"]
    await previews.show_preview(CHAT, "inbound-1", "Done")  # the turn goes on
    assert len(posted) == 2  # a new message, not the removed one answered again
    await previews.end_preview(CHAT, "inbound-1")
    await tasks.cancel_all()
