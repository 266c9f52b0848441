"""What a text becomes in Matrix: ``body`` (plain) and, for Markdown, ``formatted_body``
(``org.matrix.custom.html``).

Sanitised by construction, then checked: markdown-it renders with raw HTML off (so any
``<script>`` in the source is escaped as text) and only links it validated; the HTML
it made is then re-read and only the tags the renderer makes (ALLOWED_TAGS) survive,
with ``href`` only on ``a`` and only for http(s)/mailto. Everything else is escaped.
What the renderer made is masked again (``host.masker``) right before it leaves.
"""

from __future__ import annotations

import html
from html.parser import HTMLParser
from typing import Any

from markdown_it import MarkdownIt

from echo_bot.bus import Masking

MAX_BODY = 16_000  # characters of one event's text (Synapse caps an event at 64 KiB)
_PARSER = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
ALLOWED_TAGS = frozenset(
    [
        "p",
        "br",
        "strong",
        "em",
        "del",
        "s",
        "code",
        "pre",
        "blockquote",
        "ul",
        "ol",
        "li",
        "a",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "hr",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
    ]
)  # what the Markdown renderer makes
_SAFE_SCHEMES = ("http://", "https://", "mailto:")


class _Sanitiser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ALLOWED_TAGS:
            return
        kept = ""
        if tag == "a":
            href = next((v for k, v in attrs if k == "href" and v), "")
            if href.lower().startswith(_SAFE_SCHEMES):
                kept = f' href="{html.escape(href, quote=True)}"'
        elif tag == "ol":
            start = next((v for k, v in attrs if k == "start" and v), "")
            if start.isdigit():
                kept = f' start="{start}"'
        self.out.append(f"<{tag}{kept}>")

    def handle_endtag(self, tag: str) -> None:
        if tag in ALLOWED_TAGS and tag not in ("br", "hr"):
            self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        self.out.append(html.escape(data, quote=False))


def sanitise(markup: str) -> str:
    """Only ALLOWED_TAGS (and safe links) of ``markup``; all text escaped."""
    parser = _Sanitiser()
    parser.feed(markup)
    parser.close()
    return "".join(parser.out)


def to_html(markdown: str) -> str:
    return sanitise(_PARSER.render(markdown)).strip()


def split_text(text: str, limit: int = MAX_BODY) -> list[str]:
    """``text`` in parts of at most ``limit`` characters, cut at a paragraph, line or
    space where one is near the end."""
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), window.rfind("\n"), window.rfind(" "))
        if cut < limit // 2:
            cut = limit
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip("\n ")
    parts.append(rest)
    return [p for p in parts if p] or [""]


def contents(text: str, markdown: bool, masker: Masking) -> list[dict[str, str]]:
    """The ``m.room.message`` contents a text is sent as, in order."""
    out: list[dict[str, str]] = []
    for part in split_text(text):
        content = {"msgtype": "m.text", "body": masker.mask(part)}
        if markdown:
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = masker.mask(to_html(part))
        out.append(content)
    return out


def replacement(event_id: str, new: dict[str, Any]) -> dict[str, Any]:
    """An edit (``m.replace``) of ``event_id`` into ``new``; clients that know no edits
    show the ``* ``-marked fallback."""
    content = {**new, "body": f"* {new['body']}", "m.new_content": new,
               "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}  # fmt: skip
    if "formatted_body" in new:
        content["formatted_body"] = f"* {new['formatted_body']}"
    return content


def plain_html(text: str) -> str:
    """A plain text as HTML: escaped, line breaks kept (an approval prompt as rendered)."""
    return html.escape(text, quote=False).replace("\n", "<br>")
