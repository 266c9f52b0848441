"""What a text becomes in Discord: its own Markdown dialect, written from the core's
rendering (``echo_bot.richtext``), and read back as a person sees it.

Every text that is not markup has Discord's control characters escaped with a backslash
(``* _ ~ ` | < > [ ] ( ) # - @`` and a backslash itself, and a list number's dot at a
line's start), so nothing the model or a tool writes becomes a mention, a heading, a
spoiler or markup of its own making; the message is also sent with no mention allowed.
Links are written ``[text](url)`` only for http(s) URLs; any other shows as its text.
Masking, the misleading-link rule and splitting are the pipeline's
(``echo_bot.richtext.parts``), done on the text a person sees before any of this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from echo_bot.richtext.markup import written
from echo_bot.richtext.model import Formatted, Span
from echo_bot.richtext.splitting import Unit

MAX_WIRE = 2_000  # characters of one message's content, as Discord counts them
MAX_TEXT = 1_900  # visible characters of one part (escapes and marks take the rest)
_SPECIAL = re.compile(r"([\\*_~`|<>\[\]()#@-])")
_NUMBERED = re.compile(r"(?m)^(\s*\d+)\.")
_BACKQUOTES = re.compile("`(?=`)")
_LANGUAGE = re.compile(r"[A-Za-z0-9+#.-]{1,20}")
_MARKS = {"bold": "**", "italic": "*", "strikethrough": "~~", "code": "`", "blockquote": "> "}
_LINK = re.compile(r"(?<!\\)\[((?:\\.|[^\]\\])*)\]\(<?([^()\s<>]*)>?\)")
_FENCE = re.compile(r"(?m)^(?:> )?```[A-Za-z0-9+#.-]*(?:\n|$)")
_ESCAPED = re.compile(r"\\(.)", re.S)
_URL = re.compile(r"https?://[^\s<>\[\]`|*]+")
_BRACKETED = re.compile(r"<(https?://[^\s<>]+)>")


def escape(text: str, *, urls: bool = True) -> str:
    """``text`` shown as it is, whatever Discord would read as markup; a bare URL
    written ``<url>`` (Discord links it whole, no escape inside, and shows no preview),
    unless ``urls`` is False (a link's own text)."""
    out, at = [], 0
    for match in _URL.finditer(text) if urls else ():
        url = _trimmed(match[0])
        out += [_escaped(text[at : match.start()]), f"<{url}>"]
        at = match.start() + len(url)
    return "".join([*out, _escaped(text[at:])])


def _escaped(text: str) -> str:
    return _NUMBERED.sub(r"\1\\.", _SPECIAL.sub(r"\\\1", text))


def _trimmed(url: str) -> str:
    """A URL without the punctuation after it, and without a closing parenthesis it
    does not open (``(see https://x/a)``)."""
    url = url.rstrip(".,;:!?'\"")
    while url.endswith(")") and url.count(")") > url.count("("):
        url = url[:-1].rstrip(".,;:!?'\"")
    return url


def _linkable(url: str | None) -> bool:
    return (
        bool(url)
        and str(url).lower().startswith(("http://", "https://"))
        and not any(c in str(url) for c in "()<> \n")
    )


def _marks(span: Span, quoted: bool) -> tuple[str, str]:
    """A span's opening and closing marks (a code block inside a quote: each of its
    lines quoted too, or the quote would end at its fence)."""
    if span.type == "pre":
        language = span.language if span.language and _LANGUAGE.fullmatch(span.language) else ""
        inside = "\n> " if quoted else "\n"
        return f"```{language}{inside}", f"{inside}```"
    if span.type == "text_link":
        return ("[", f"](<{span.url}>)") if _linkable(span.url) else ("", "")
    mark = _MARKS.get(span.type, "")
    return mark, "" if span.type == "blockquote" else mark


def _text(piece: str, inside: Sequence[Span]) -> str:
    kinds = {span.type for span in inside}
    if "pre" in kinds:  # no run of backquotes can end the block early
        piece = _BACKQUOTES.sub("`\u2060", piece)
    elif "code" in kinds:
        piece = piece.replace("`", "'") or " "
    else:
        piece = escape(piece, urls="text_link" not in kinds)
    return piece.replace("\n", "\n> ") if "blockquote" in kinds else piece


def markdown(part: Formatted) -> str:
    quotes = [s for s in part.spans if s.type == "blockquote"]
    quoted = {s for s in part.spans if any(q.start <= s.start and s.end <= q.end for q in quotes)}
    return written(
        part, text=_text, opening=lambda span: _marks(span, span in quoted)[0],
        closing=lambda span: _marks(span, span in quoted)[1],
    )  # fmt: skip


def shown(wire: str) -> str:
    """What Discord shows of ``wire``: a link as its text, code fences gone, escapes
    undone; and on a second line the same without any mark (``12**34**`` reads as
    ``1234``)."""
    text = _BRACKETED.sub(r"\1", _LINK.sub(lambda m: m.group(1), wire))
    text = _FENCE.sub("", text).replace("\u2060", "")
    plain = _ESCAPED.sub(r"\1", text)
    bare = _ESCAPED.sub(r"\1", re.sub(r"(?<!\\)[*_~`|]|^> ", "", text, flags=re.M))
    return f"{plain}\n{bare}"


def measured(wire: str) -> int:
    """Characters as Discord counts a message's length (UTF-16 code units: the safe
    reading of its limit)."""
    return len(wire.encode("utf-16-le")) // 2


class DiscordText:
    """Discord's wire for a message, for the core's pipeline (``richtext.Renderer``)."""

    unit: Unit = "chars"
    limit = MAX_TEXT
    wire = staticmethod(markdown)
    visible = staticmethod(shown)

    @staticmethod
    def fits(wire: str) -> bool:
        return measured(wire) <= MAX_WIRE


TEXT = DiscordText()
