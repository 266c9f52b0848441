"""Markdown → the text a person will see, with spans (``model.Formatted``).

Model replies are Markdown. It is parsed here once, for every channel, with markdown-it
(CommonMark, which never fails on any input): what a channel sends is written from the
result, so the text that is masked and measured is the text that is shown — entities
decoded, escapes and emphasis marks gone.

The spans keep the strictest network's nesting rules (Telegram's), which every other
wire format can write as they are: nothing inside ``code``/``pre``; bold, italic,
strikethrough never around code; no quote inside a quote; links only to http(s), tg and
mailto (any other shows its target as text). A link whose text names another host than
its target's (``[bank.com](https://evil.example)``) shows its target after it
(``misleading``).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token

from echo_bot.secrets import as_read

from .model import Formatted, Span

# Entity types that may wrap or sit inside others (except code and pre).
_STYLES = frozenset({"bold", "italic", "underline", "strikethrough", "spoiler"})
_CODE = frozenset({"code", "pre"})
_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")

_PARSER = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])


class _Open:
    __slots__ = ("language", "piece", "start", "type", "url")

    def __init__(self, type_: str, url: str | None = None, language: str | None = None) -> None:
        self.type, self.url, self.language = type_, url, language
        self.start: int | None = None  # set where its first text lands
        self.piece = 0  # the index in ``pieces`` of that text


class _Renderer:
    """Walks markdown-it's tokens, writing text and collecting spans."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.length = 0
        self.spans: list[Span] = []
        self.stack: list[_Open] = []
        self.pending_break = 0  # newlines owed before the next text
        self.lists: list[list[int | None]] = []  # per open list: [next number] or [None]
        self.quote_depth = 0

    # -- output -----------------------------------------------------------------------------
    def emit(self, text: str) -> None:
        if not text:
            return
        if self.pending_break and self.length:
            self._write("\n" * self.pending_break)
        self.pending_break = 0
        for item in self.stack:
            if item.start is None:
                item.start, item.piece = self.length, len(self.pieces)
        self._write(text)

    def _write(self, text: str) -> None:
        self.pieces.append(text)
        self.length += len(text)

    def block_break(self, lines: int) -> None:
        self.pending_break = max(self.pending_break, lines)

    def open(self, type_: str, url: str | None = None, language: str | None = None) -> None:
        self.stack.append(_Open(type_, url, language))

    def close(self, type_: str) -> None:
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index].type == type_:
                item = self.stack.pop(index)
                if item.start is not None and self.length > item.start:
                    self.spans.append(
                        Span(item.type, item.start, self.length, item.url, item.language)
                    )
                return

    # -- tokens -----------------------------------------------------------------------------
    def block(self, tokens: Sequence[Token]) -> None:
        for token in tokens:
            handler = _BLOCK.get(token.type)
            if handler is not None:
                handler(self, token)

    def _inline_token(self, token: Token) -> None:
        self.inline(token.children or [])

    def _paragraph_close(self, token: Token) -> None:
        self.block_break(1 if token.hidden else 2)

    def _heading_open(self, token: Token) -> None:
        self.open("bold")

    def _heading_close(self, token: Token) -> None:
        self.close("bold")
        self.block_break(2)

    def _list_open(self, token: Token) -> None:
        number: int | None = None
        if token.type == "ordered_list_open":
            start = token.attrGet("start")
            number = int(start) if start else 1
        self.lists.append([number])
        self.block_break(1)

    def _list_close(self, token: Token) -> None:
        self.lists.pop()
        self.block_break(2 if not self.lists else 1)

    def _list_item_open(self, token: Token) -> None:
        self.block_break(1)
        self.emit(self._bullet())

    def _line_break(self, token: Token) -> None:
        self.block_break(1)

    def _blockquote_open(self, token: Token) -> None:
        self.quote_depth += 1
        if self.quote_depth == 1:  # Telegram has no quote inside a quote
            self.open("blockquote")

    def _blockquote_close(self, token: Token) -> None:
        self.quote_depth -= 1
        if self.quote_depth == 0:
            self.close("blockquote")
        self.block_break(2)

    def _code_block(self, token: Token) -> None:
        language = token.info.split()[0] if token.info.strip() else None
        self.open("pre", language=_language(language))
        self.emit(token.content.rstrip("\n") or " ")
        self.close("pre")
        self.block_break(2)

    def _hr(self, token: Token) -> None:
        self.emit("———")
        self.block_break(2)

    def _cell_open(self, token: Token) -> None:
        if self.pieces and not self.pending_break and self.pieces[-1] != "\n":
            self.emit(" | ")

    def _paragraph_break(self, token: Token) -> None:
        self.block_break(2)

    def _html_block(self, token: Token) -> None:
        self.emit(token.content.rstrip("\n"))
        self.block_break(2)

    def _bullet(self) -> str:
        current = self.lists[-1] if self.lists else [None]
        indent = "   " * (len(self.lists) - 1)
        if current[0] is None:
            return f"{indent}• "
        number = current[0]
        current[0] = number + 1
        return f"{indent}{number}. "

    def inline(self, children: Sequence[Token]) -> None:
        for token in children:
            kind = token.type
            if kind in ("text", "html_inline"):
                self.emit(token.content)
            elif kind == "code_inline":
                self.open("code")
                self.emit(token.content or " ")
                self.close("code")
            elif kind in ("softbreak", "hardbreak"):
                self.emit("\n")
            elif kind in ("strong_open", "em_open", "s_open"):
                self.open(_STYLE_OF[kind])
            elif kind in ("strong_close", "em_close", "s_close"):
                self.close(_STYLE_OF[kind])
            elif kind == "link_open":
                href = str(token.attrGet("href") or "")
                self.open("text_link" if _linkable(href) else "plain", url=href)
            elif kind == "link_close":
                self._close_link()
            elif kind == "image":
                src = str(token.attrGet("src") or "")
                label = token.content or src
                if _linkable(src):
                    self.open("text_link", url=src)
                    self.emit(label)
                    self.close("text_link")
                else:
                    self.emit(label)

    def _close_link(self) -> None:
        for index in range(len(self.stack) - 1, -1, -1):
            item = self.stack[index]
            if item.type in ("text_link", "plain"):
                if item.type == "plain":  # not a link Telegram takes: show where it pointed
                    self.stack.pop(index)
                    if item.url:
                        self.emit(f" ({item.url})")
                else:
                    self.close("text_link")
                    label = "".join(self.pieces[item.piece :]) if item.start is not None else ""
                    if item.url and misleading(label, item.url):
                        self.emit(f" ({item.url})")
                return

    def result(self) -> Formatted:
        text = "".join(self.pieces)
        return Formatted(text, tuple(_legal(self.spans)))


_STYLE_OF = {
    "strong_open": "bold",
    "strong_close": "bold",
    "em_open": "italic",
    "em_close": "italic",
    "s_open": "strikethrough",
    "s_close": "strikethrough",
}

# Block tokens by type; the others (paragraph_open, list and table scaffolding) write
# nothing themselves.
_BLOCK: dict[str, Callable[[_Renderer, Token], None]] = {
    "inline": _Renderer._inline_token,
    "paragraph_close": _Renderer._paragraph_close,
    "heading_open": _Renderer._heading_open,
    "heading_close": _Renderer._heading_close,
    "bullet_list_open": _Renderer._list_open,
    "ordered_list_open": _Renderer._list_open,
    "bullet_list_close": _Renderer._list_close,
    "ordered_list_close": _Renderer._list_close,
    "list_item_open": _Renderer._list_item_open,
    "list_item_close": _Renderer._line_break,
    "blockquote_open": _Renderer._blockquote_open,
    "blockquote_close": _Renderer._blockquote_close,
    "fence": _Renderer._code_block,
    "code_block": _Renderer._code_block,
    "hr": _Renderer._hr,
    "tr_close": _Renderer._line_break,
    "thead_close": _Renderer._line_break,
    "th_open": _Renderer._cell_open,
    "td_open": _Renderer._cell_open,
    "table_close": _Renderer._paragraph_break,
    "html_block": _Renderer._html_block,
}


def _linkable(url: str) -> bool:
    return url.lower().startswith(_LINK_SCHEMES) and len(url) <= 2048 and " " not in url


def _language(word: str | None) -> str | None:
    if not word:
        return None
    cleaned = "".join(ch for ch in word if ch.isalnum() or ch in "+-#_.")
    return cleaned[:32] or None


def _legal(spans: list[Span]) -> list[Span]:
    """Spans Telegram accepts, sorted by start: code inside a link loses its entity (a
    link may not contain code), anything inside code is dropped, and styles are cut
    around code (a style may not contain code). Code spans never overlap each other,
    nor links each other (Markdown nests neither), so both are found by bisection."""
    links = sorted((s for s in spans if s.type == "text_link"), key=lambda s: s.start)
    link_starts = [s.start for s in links]

    def in_link(span: Span) -> bool:
        at = bisect.bisect_right(link_starts, span.start) - 1
        return at >= 0 and span.end <= links[at].end

    codes = sorted((s for s in spans if s.type in _CODE and not in_link(s)), key=lambda s: s.start)
    starts, ends = [c.start for c in codes], [c.end for c in codes]
    kept: list[Span] = list(codes)
    for span in spans:
        if span.type in _CODE:
            continue
        low, high = bisect.bisect_right(ends, span.start), bisect.bisect_left(starts, span.end)
        if low < high and codes[low].start <= span.start and span.end <= codes[low].end:
            continue  # inside code: not allowed
        if span.type in _STYLES and low < high:
            kept.extend(_outside(span, codes[low:high]))
        else:
            kept.append(span)
    return sorted(kept, key=lambda s: (s.start, -s.end))


def _outside(span: Span, codes: Sequence[Span]) -> list[Span]:
    """``span`` without the parts that overlap these code spans (sorted, apart)."""
    pieces = []
    start = span.start
    for code in codes:
        if code.start > start:
            pieces.append((start, min(code.start, span.end)))
        start = max(start, code.end)
    if start < span.end:
        pieces.append((start, span.end))
    return [replace(span, start=s, end=e) for s, e in pieces if e > s]


_HOST_LIKE = re.compile(
    r"^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/\s]*@)?(?:www\.)?((?:[\w-]+\.)+[\w-]+)\.?(?::\d*)?"
    r"(?:[/?#]\S*)?$"
)


def misleading(label: str, target: str) -> bool:
    """Whether a link's text, as it reads (markup gone, NFKC-folded, any case, with a
    port or a trailing dot), names a host that is not its target's."""
    found = _HOST_LIKE.match(as_read(label)[0].strip().lower())
    if found is None:
        return False
    host = (urlsplit(target).hostname or "").rstrip(".").removeprefix("www.")
    return found.group(1) != host


def render_markdown(source: str) -> Formatted:
    """``source`` as a person reads Markdown: plain text plus spans."""
    renderer = _Renderer()
    renderer.block(_PARSER.parse(source))
    formatted = renderer.result()
    if not formatted.text.strip():
        return Formatted(source)
    return formatted
