"""What a text becomes in Matrix: ``body`` (the text as a person reads it) and, where it
is formatted, ``formatted_body`` (``org.matrix.custom.html``), written from the core's
rendering (``echo_bot.richtext``) and read back as a client shows it.

Sanitised by construction: all text is escaped, the only tags are the few a span
becomes (``_TAGS``, ``pre``/``code``, ``a``), and ``href`` only for http(s) and mailto.
Masking, the misleading-link rule and splitting are the pipeline's
(``echo_bot.richtext.parts``), done on the text a person sees.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from echo_bot.richtext.markup import written
from echo_bot.richtext.model import Formatted, Span
from echo_bot.richtext.splitting import Unit

MAX_BODY = 16_000  # characters of one event's text
MAX_EVENT = 60_000  # bytes of an event's content as JSON (Synapse caps an event at 64 KiB)
_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_TAGS = {"bold": "strong", "italic": "em", "strikethrough": "del", "code": "code",
         "blockquote": "blockquote"}  # fmt: skip


def _linkable(url: str | None) -> bool:
    return bool(url) and str(url).lower().startswith(_SAFE_SCHEMES)


def _opening(span: Span) -> str:
    if span.type == "pre":
        language = f' class="language-{html.escape(span.language)}"' if span.language else ""
        return f"<pre><code{language}>"
    if span.type == "text_link":
        return f'<a href="{html.escape(str(span.url), quote=True)}">' if _linkable(span.url) else ""
    tag = _TAGS.get(span.type)
    return f"<{tag}>" if tag else ""


def _closing(span: Span) -> str:
    if span.type == "pre":
        return "</code></pre>"
    if span.type == "text_link":
        return "</a>" if _linkable(span.url) else ""
    tag = _TAGS.get(span.type)
    return f"</{tag}>" if tag else ""


def _text(piece: str, inside: Sequence[Span]) -> str:
    escaped = html.escape(piece, quote=False)
    return escaped if any(s.type == "pre" for s in inside) else escaped.replace("\n", "<br>")


def to_html(part: Formatted) -> str:
    return written(part, text=_text, opening=_opening, closing=_closing)


class _Reader(HTMLParser):
    """The text an HTML body shows: character references decoded, tags gone."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        self.out.append(data)


def shown_html(markup: str) -> str:
    reader = _Reader()
    reader.feed(markup)
    reader.close()
    return "".join(reader.out)


@dataclass(frozen=True)
class MatrixText:
    """Matrix's wire: an ``m.room.message`` content."""

    limit: int = MAX_BODY
    unit: Unit = "chars"

    def wire(self, part: Formatted) -> dict[str, Any]:
        content = {"msgtype": "m.text", "body": part.text}
        if part.spans:
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = to_html(part)
        return content

    def visible(self, wire: dict[str, Any]) -> str:
        return f"{wire['body']}\n{shown_html(wire.get('formatted_body', ''))}"

    def fits(self, wire: dict[str, Any]) -> bool:
        return len(json.dumps(wire).encode()) <= MAX_EVENT


TEXT = MatrixText()


def replacement(event_id: str, new: dict[str, Any]) -> dict[str, Any]:
    """An edit (``m.replace``) of ``event_id`` into ``new``; clients that know no edits
    show the ``* ``-marked fallback."""
    content = {**new, "body": f"* {new['body']}", "m.new_content": new,
               "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}  # fmt: skip
    if "formatted_body" in new:
        content["formatted_body"] = f"* {new['formatted_body']}"
    return content
