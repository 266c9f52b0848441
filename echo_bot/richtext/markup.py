"""Writing a ``Formatted`` text in a markup language (Slack's mrkdwn, Matrix's HTML):
each span's opening and closing marks around the text it covers, the text itself
escaped by the language's own rule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .model import Formatted, Span


def written(
    formatted: Formatted,
    *,
    text: Callable[[str, Sequence[Span]], str],
    opening: Callable[[Span], str],
    closing: Callable[[Span], str],
) -> str:
    """``formatted`` in markup. ``text(piece, inside)`` writes a piece of the text
    within the spans ``inside`` (outermost first). Spans that cross (none should) are
    closed and opened again, so the markup is always balanced."""
    source = formatted.text
    spans = sorted((s for s in formatted.spans if s.end > s.start), key=lambda s: (s.start, -s.end))
    stops = sorted({0, len(source), *(s.start for s in spans), *(s.end for s in spans)})
    out: list[str] = []
    inside: list[Span] = []
    following = 0
    for at, stop in zip(stops, [*stops[1:], len(source)], strict=True):
        if any(s.end <= at for s in inside):
            reopened = []
            while any(s.end <= at for s in inside):
                span = inside.pop()
                out.append(closing(span))
                if span.end > at:
                    reopened.append(span)
            for span in reversed(reopened):
                out.append(opening(span))
                inside.append(span)
        while following < len(spans) and spans[following].start == at:
            out.append(opening(spans[following]))
            inside.append(spans[following])
            following += 1
        if stop > at:
            out.append(text(source[at:stop], inside))
    for span in reversed(inside):
        out.append(closing(span))
    return "".join(out)
