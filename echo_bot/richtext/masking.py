"""The rendered text masked as a person will read it, its spans still valid.

The delivery worker masks the Markdown source, but rendering makes other text of it:
character references are decoded (``&#49;`` → ``1``), emphasis inside a word and
backslash escapes disappear. So what the renderer made is masked again — the whole text
before it is cut into messages (a secret across a cut is masked whole, never sent in
two halves), and every link's URL. The masker finds a secret with invisible characters
inside it or in look-alike forms too (``Masker.find``). Masking shortens the text;
spans are moved with it. A span that covers a masked secret wholly covers its ``***``;
one that covers only a part of it stops at the ``***`` (so spans that were nested or
apart stay so); one inside a secret is dropped.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from echo_bot.bus import Masking

from .model import Formatted, Span

MASK = "***"  # what ``Masking.mask`` puts in place of a secret


def masked(formatted: Formatted, masker: Masking | None) -> Formatted:
    """``formatted`` with no secret in its text, link URLs or code languages."""
    if masker is None:
        return formatted
    # Each pass shortens the text (a secret is longer than its mask): this ends.
    while found := masker.find(formatted.text):
        formatted = _replaced(formatted, found)
    spans = []
    for span in formatted.spans:
        if span.url is not None:
            span = replace(span, url=masker.mask(span.url))
        if span.language and masker.mask(span.language) != span.language:
            span = replace(span, language=None)
        spans.append(span)
    return Formatted(formatted.text, tuple(spans))


def masked_growing(formatted: Formatted, masker: Masking | None) -> Formatted:
    """``masked``, for a reply still being written (a preview): an end of the text that
    could be the start of a secret is held back, as ``Masking.mask_growing`` does."""
    formatted = masked(formatted, masker)
    if masker is None:
        return formatted
    shown = masker.mask_growing(formatted.text)
    if shown == formatted.text:
        return formatted
    if not formatted.text.startswith(shown):  # not a shorter start: nothing is kept
        return Formatted(shown)
    keep = len(shown)
    spans = (replace(s, end=min(s.end, keep)) for s in formatted.spans if s.start < keep)
    return Formatted(shown, tuple(s for s in spans if s.end > s.start))


def _replaced(formatted: Formatted, found: list[tuple[int, int]]) -> Formatted:
    """Each (start, end) of ``found`` (sorted, apart) replaced by ``MASK``."""
    text = formatted.text
    pieces, at = [], 0
    starts, ends, shifts = [], [], [0]  # shifts[i]: how much the first i masks shortened
    for start, end in found:
        pieces += [text[at:start], MASK]
        at = end
        starts.append(start)
        ends.append(end)
        shifts.append(shifts[-1] + (end - start) - len(MASK))
    pieces.append(text[at:])

    def moved(point: int, *, is_end: bool) -> int:
        before = bisect.bisect_right(ends, point)  # masks wholly at or before ``point``
        if before < len(starts) and starts[before] < point:  # inside a masked secret
            new_start = starts[before] - shifts[before]
            return new_start if is_end else new_start + len(MASK)
        return point - shifts[before]

    spans: list[Span] = []
    for span in formatted.spans:
        start, end = moved(span.start, is_end=False), moved(span.end, is_end=True)
        if end > start:
            spans.append(replace(span, start=start, end=end))
    spans.sort(key=lambda s: (s.start, -s.end))
    return Formatted("".join(pieces), tuple(spans))
