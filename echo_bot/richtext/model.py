"""Text as a person sees it, with the spans that style it: what every channel's wire
format is written from (Telegram's entities, Slack's mrkdwn, Matrix's HTML).

Span types: ``bold``, ``italic``, ``strikethrough``, ``code``, ``pre`` (a code block,
with its ``language``), ``text_link`` (with its ``url``) and ``blockquote``. Spans are
nested or apart, never inside ``code`` or ``pre``, and a style never contains code
(``markdown.render_markdown``): every wire format can write them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """One style over ``text[start:end]`` (code points)."""

    type: str
    start: int
    end: int
    url: str | None = None
    language: str | None = None


@dataclass(frozen=True, slots=True)
class Formatted:
    text: str
    spans: tuple[Span, ...] = ()


def utf16_offsets(text: str) -> list[int]:
    """``offsets[i]``: the UTF-16 offset of code point ``i`` (one entry past the end)."""
    offsets = [0] * (len(text) + 1)
    total = 0
    for index, char in enumerate(text):
        total += 2 if ord(char) > 0xFFFF else 1
        offsets[index + 1] = total
    return offsets
