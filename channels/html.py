"""HTML written from the core's rendering (``echo_bot.richtext``), and read back as a
reader shows it: for the networks whose messages carry HTML (Matrix's
``formatted_body``, an e-mail's ``text/html`` part).

Sanitised by construction: all text is escaped, the only tags are the few a span
becomes (``_TAGS``, ``pre``/``code``, ``a``), and ``href`` only for http(s) and mailto.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from html.parser import HTMLParser

from echo_bot.richtext.markup import written
from echo_bot.richtext.model import Formatted, Span

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


# Blocks a mail client breaks lines at (the writer above makes none of them but ``br``).
_BREAKS = {"br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"}
_UNSHOWN = {"script", "style", "head", "title"}


class _Reader(HTMLParser):
    """The text an HTML body shows: character references decoded, tags gone, a line
    break where a block starts, nothing of what a reader never shows (a script, a
    style sheet)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._unshown = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _UNSHOWN:
            self._unshown += 1
        elif tag in _BREAKS and (tag == "br" or (self.out and not self.out[-1].endswith("\n"))):
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _UNSHOWN and self._unshown:
            self._unshown -= 1

    def handle_data(self, data: str) -> None:
        if not self._unshown:
            self.out.append(data)


def shown_html(markup: str) -> str:
    reader = _Reader()
    reader.feed(markup)
    reader.close()
    return "".join(reader.out)
