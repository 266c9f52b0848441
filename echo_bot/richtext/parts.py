"""What every channel's text passes on its way out, written once: Markdown rendered to
the text a person will see, masked there, split within the channel's limit, written in
the channel's wire format, and that wire read back as the person will see it and masked
again — a part that would still show a secret is never sent.

A channel declares only its ``Renderer``: its unit and limit, how a part is written on
its wire, and how the wire reads (entities decoded, tags and marks gone).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, TypeVar

from echo_bot.bus import Masking

from .markdown import render_markdown
from .masking import masked, masked_growing
from .model import Formatted
from .splitting import Unit, measure, split_formatted

log = logging.getLogger("echo_bot.richtext")

Wire = TypeVar("Wire")
WITHHELD = "(a part of this reply was withheld: it would have shown a secret)"
RENDER_ON_LOOP = 700  # characters of Markdown rendered on the loop (about 1 ms); more: a thread


class Renderer(Protocol[Wire]):
    """A channel's wire format."""

    @property
    def unit(self) -> Unit:
        """What the network's message limit counts."""
        ...

    @property
    def limit(self) -> int:
        """The most a message may hold, in ``unit``s of the visible text."""
        ...

    def wire(self, part: Formatted) -> Wire:
        """``part`` as the network takes it."""
        ...

    def visible(self, wire: Wire) -> str:
        """What a person will see of ``wire``, read from the wire itself: its escapes and
        entities decoded, its markup gone (several readings, one per line, where the
        network shows it in more than one way)."""
        ...

    def fits(self, wire: Wire) -> bool:
        """Whether the network takes ``wire`` as one message (markup may make it longer
        than its visible text)."""
        ...


def formatted(text: str, markdown: bool) -> Formatted:
    """``text`` as a person will read it: Markdown rendered, a plain text as it is."""
    if markdown:
        try:
            return render_markdown(text)
        except Exception:  # markdown-it never should; a reply must go out regardless
            log.exception("Markdown rendering failed; sending the text as written")
    return Formatted(text)


def message_parts(
    text: str, markdown: bool, masker: Masking | None, renderer: Renderer[Wire]
) -> list[Wire]:
    """The messages ``text`` is sent as, in order. The text is masked whole before it is
    cut: no part holds a secret, nor two parts its halves."""
    return formatted_parts(formatted(text, markdown), masker, renderer)


def formatted_parts(
    text: Formatted, masker: Masking | None, renderer: Renderer[Wire]
) -> list[Wire]:
    """``message_parts`` of a text already formatted (an approval prompt, whose call is
    a code block)."""
    parts = split_formatted(masked(text, masker), renderer.limit, renderer.unit)
    return [wire for part in parts for wire in _written(part, masker, renderer)]


async def rendered_parts(
    text: str, markdown: bool, masker: Masking | None, renderer: Renderer[Wire]
) -> list[Wire]:
    """``message_parts``, off the event loop unless short (about 1 ms per 700 chars)."""
    if len(text) > RENDER_ON_LOOP:
        return await asyncio.to_thread(message_parts, text, markdown, masker, renderer)
    return message_parts(text, markdown, masker, renderer)


def as_written(text: str, markdown: bool, masker: Masking | None) -> str:
    """``text`` for a channel that shows it as written (a terminal): itself, unless the
    Markdown would read as a secret (emphasis inside it, an escape, a character
    reference) — then what it reads as, masked."""
    if masker is None or not markdown:
        return text
    shown = formatted(text, markdown)
    if not masker.find(shown.text):
        return text
    return masked(shown, masker).text


async def rendered_as_written(text: str, markdown: bool, masker: Masking | None) -> str:
    """``as_written``, off the event loop unless short."""
    if markdown and len(text) > RENDER_ON_LOOP:
        return await asyncio.to_thread(as_written, text, markdown, masker)
    return as_written(text, markdown, masker)


def _written(part: Formatted, masker: Masking | None, renderer: Renderer[Wire]) -> list[Wire]:
    wire = renderer.wire(part)
    if not renderer.fits(wire) and len(part.text) > 1:  # the markup made it too long
        smaller = max(1, measure(part.text, renderer.unit) // 2)
        pieces = split_formatted(part, smaller, renderer.unit)
        return [wire for piece in pieces for wire in _written(piece, masker, renderer)]
    seen = renderer.visible(wire)
    if masker is not None and seen != part.text and masker.find(seen):  # else: masked already
        # The rendering showed what the masked text did not: never sent.
        log.error("a part of a reply would have shown a secret on the wire; withheld")
        return [renderer.wire(Formatted(WITHHELD))]
    return [wire]


def preview_part(
    text: str, masker: Masking | None, renderer: Renderer[Wire], mark: str = ""
) -> Wire | None:
    """What a preview shows of a reply being written: its newest part that fits one
    message (a long reply is sent as several), masked, with ``mark`` after it; None
    while there is nothing to show (what there is could begin a secret)."""
    limit = renderer.limit
    if len(text) > 3 * limit:  # only the end is shown: only the end is rendered
        tail = text[-2 * limit :]
        paragraph = tail.find("\n\n")
        text = tail[paragraph + 2 :] if 0 <= paragraph < limit else tail
    shown = masked_growing(formatted(text, True), masker)
    if not shown.text.strip():
        return None
    last = split_formatted(shown, limit, renderer.unit)[-1]
    if mark and measure(last.text + mark, renderer.unit) <= limit:
        last = Formatted(last.text + mark, last.spans)
    written = _written(last, masker, renderer)
    return written[-1]


async def rendered_preview(
    text: str, masker: Masking | None, renderer: Renderer[Wire], mark: str = ""
) -> Wire | None:
    """``preview_part``, off the event loop unless short."""
    if len(text) > RENDER_ON_LOOP:
        return await asyncio.to_thread(preview_part, text, masker, renderer, mark)
    return preview_part(text, masker, renderer, mark)
