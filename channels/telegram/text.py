"""What a text becomes on its way to and from Telegram: messages with entities (rendered,
masked, split), a preview's part, and clean Unicode from an update."""

from __future__ import annotations

import asyncio

from aiogram.types import MessageEntity

from echo_bot.bus import Masking

from .common import log
from .markdown import Formatted, render_markdown, split_formatted, utf16_offsets
from .masking import masked, masked_growing
from .render import MAX_TEXT, split_text

RENDER_ON_LOOP = 700  # characters of Markdown rendered on the loop (about 1 ms); more: a thread


def message_parts(
    text: str, markdown: bool, masker: Masking | None = None, *, limit: int = MAX_TEXT
) -> list[Formatted]:
    """The messages a text is sent as: Markdown rendered to entities (plain text if the
    renderer fails on it), split within ``limit``. What the renderer made is masked
    whole before it is cut: no part holds a secret, nor two parts its halves."""
    if markdown:
        try:
            return split_formatted(masked(render_markdown(text), masker), limit)
        except Exception:  # markdown-it never should; a reply must go out regardless
            log.exception("telegram: Markdown rendering failed; sending the text as written")
    return [Formatted(part) for part in split_text(masked(Formatted(text), masker).text, limit)]


async def rendered(text: str, markdown: bool, masker: Masking | None) -> list[Formatted]:
    """``message_parts``, off the event loop unless short (about 1 ms per 700 chars)."""
    if markdown and len(text) > RENDER_ON_LOOP:
        return await asyncio.to_thread(message_parts, text, markdown, masker)
    return message_parts(text, markdown, masker)


def preview_part(text: str, mark: str = "", masker: Masking | None = None) -> Formatted | None:
    """What a preview shows of a reply being written: its newest part that fits one
    message (a long reply is sent as several), formatted and masked, with ``mark`` after
    it; None while there is nothing to show (what there is could begin a secret)."""
    if len(text) > 3 * MAX_TEXT:  # only the end is shown: only the end is rendered
        tail = text[-2 * MAX_TEXT :]
        paragraph = tail.find("\n\n")
        text = tail[paragraph + 2 :] if 0 <= paragraph < MAX_TEXT else tail
    try:
        rendered = render_markdown(text)
    except Exception:  # as in message_parts: shown as written
        rendered = Formatted(text)
    rendered = masked_growing(rendered, masker)
    if not rendered.text.strip():
        return None
    last = split_formatted(rendered)[-1]
    if not mark:
        return last
    fits = utf16_offsets(last.text)[-1] + len(mark.encode("utf-16-le")) // 2 <= MAX_TEXT
    return Formatted(last.text + mark, last.spans) if fits else last


async def rendered_preview(text: str, mark: str, masker: Masking | None) -> Formatted | None:
    """``preview_part``, off the event loop unless short."""
    if len(text) > RENDER_ON_LOOP:
        return await asyncio.to_thread(preview_part, text, mark, masker)
    return preview_part(text, mark, masker)


def entities(part: Formatted) -> list[MessageEntity]:
    return [MessageEntity(**entity) for entity in part.entities()]


def clean(text: str) -> str:
    """Valid Unicode only. JSON may carry a lone surrogate ("\\ud800"), which no store
    can encode: such an update would fail to commit on every try and stall the queue."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
