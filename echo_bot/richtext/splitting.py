"""One splitter for every channel: a text cut into messages within the channel's limit,
counted in its unit (characters, UTF-16 code units as Telegram counts, or UTF-8 bytes).

Cut after a paragraph, else a line, else a word, else anywhere; never a character lost
(whitespace at a cut aside), none blank, order kept. A span cut in two continues in the
next part, so a long code block arrives as two balanced code blocks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from .model import Formatted

Unit = Literal["chars", "utf16", "bytes"]
EMPTY = "(empty reply)"  # what a blank text is sent as: no network takes an empty message


def measure(text: str, unit: Unit) -> int:
    if unit == "chars" or text.isascii():
        return len(text)
    if unit == "utf16":
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    return len(text.encode("utf-8", "surrogatepass"))


def _one_per_character(text: str, unit: Unit) -> bool:
    """Whether each character of ``text`` counts one ``unit``."""
    if unit == "chars" or text.isascii():
        return True
    return unit == "utf16" and max(text) < "\U00010000"


def _fitting(text: str, start: int, limit: int, unit: Unit) -> int:
    """How many characters of ``text`` from ``start`` fit in ``limit`` units (a text
    whose characters count more than one each)."""
    units = 0
    for index in range(start, len(text)):
        char = text[index]
        units += (2 if ord(char) > 0xFFFF else 1) if unit == "utf16" else len(char.encode())
        if units > limit:
            return index - start
    return len(text) - start


def cuts(text: str, limit: int, unit: Unit = "chars") -> list[tuple[int, int]]:
    """(start, end) of each message ``text`` is split into, each at most ``limit``."""
    parts: list[tuple[int, int]] = []
    start = 0
    simple = _one_per_character(text, unit)

    def fitting(start: int) -> int:
        return min(limit, len(text) - start) if simple else _fitting(text, start, limit, unit)

    while (size := fitting(start)) < len(text) - start:
        size = max(1, size)
        window = text[start : start + size]
        cut = -1
        for separator in ("\n\n", "\n", " "):
            cut = window.rfind(separator)
            if cut > size // 4:
                cut += len(separator)
                break
        if cut <= size // 4:
            cut = size
        parts.append((start, start + cut))
        start += cut
    if start < len(text):
        parts.append((start, len(text)))
    return parts


def split_formatted(formatted: Formatted, limit: int, unit: Unit = "chars") -> list[Formatted]:
    """``formatted`` as messages of at most ``limit`` units each."""
    text = formatted.text if formatted.text.strip() else EMPTY
    if text is formatted.text and text == text.strip() and measure(text, unit) <= limit:
        return [formatted]  # the usual reply: one message as it is
    parts: list[Formatted] = []
    for start, end in cuts(text, limit, unit):
        piece = text[start:end].rstrip()
        lead = len(piece) - len(piece.lstrip("\n"))
        body = piece[lead:]
        if not body:
            continue
        low, high = start + lead, start + lead + len(body)
        spans = tuple(
            replace(span, start=max(span.start, low) - low, end=min(span.end, high) - low)
            for span in formatted.spans
            if span.start < high and span.end > low
        )
        parts.append(Formatted(body, tuple(s for s in spans if s.end > s.start)))
    return parts or [Formatted(EMPTY)]
