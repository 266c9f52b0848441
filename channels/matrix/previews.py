"""A reply shown while it is written, in Matrix: one message, sent with the first text
and edited (``m.replace``) as it grows, then replaced by the reply itself
(``channels/previewing.py`` keeps the state; this says how Matrix shows and removes).

A homeserver counts an edit as a message (Synapse's ``rc_message``), so a text is sent
only from spare budget (``Outbound.send_preview``: none while the room's or the
account's sends wait, a send in progress or a recent ``M_LIMIT_EXCEEDED``), tried once;
a left preview is redacted. Nothing is shown before the first sync (rooms unknown) or
on a daemon that does not sync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nio import AsyncClient

from channels.previewing import EditedPreviews
from echo_bot.bus import ChannelHost
from echo_bot.events import Address
from echo_bot.richtext import parts as richtext

from .common import Tasks
from .formatting import TEXT, replacement

EDIT_INTERVAL = 3.0  # seconds between two texts of one preview
PREVIEW_MARK = " ✍️"  # ends the preview message while the reply is written
PREVIEW_KEEP = 30.0  # seconds a preview no reply took the place of is kept, then redacted

# Outbound.send_preview: one event sent from spare budget (its ID), or None when the
# room's or the account's sends wait now.
SendPreview = Callable[[str, dict[str, Any], str], Awaitable[str | None]]


def previews(
    host: ChannelHost,
    client: AsyncClient,
    send: SendPreview,
    tasks: Tasks,
    synced: asyncio.Event,
) -> EditedPreviews:
    masker = host.masker

    async def show(chat: Address, key: str, event_id: str | None, text: str, n: int) -> str | None:
        content = await richtext.rendered_preview(text, masker, TEXT)
        if content is None:
            return None
        if event_id is not None:
            content = replacement(event_id, content)
        return await send(chat.chat_id, content, f"{key}.preview.{n}")

    async def redact(chat: Address, event_id: str) -> None:
        why = "a preview of a reply that was not sent"
        await client.room_redact(chat.chat_id, event_id, reason=why)

    return EditedPreviews(
        show, redact, tasks, interval=EDIT_INTERVAL, mark=PREVIEW_MARK, keep=PREVIEW_KEEP,
        ready=synced.is_set,
    )  # fmt: skip
