"""What a text becomes in Slack: ``mrkdwn``, Slack's own markup, written from the core's
rendering (``echo_bot.richtext``), and read back as a person sees it.

Every text that is not markup is escaped (``&``, ``<``, ``>`` as Slack asks), so
nothing the model or a tool writes can become a mention (``<!channel>``, ``<@U…>``), a
link of its own making, or broken markup: Slack answers no API error for odd input,
and an ``@channel`` in a reply pings no one. Links are written ``<url|text>`` only for
http(s) and mailto URLs; any other shows as its text. Masking, the misleading-link rule
and splitting are the pipeline's (``echo_bot.richtext.parts``), done on the text a
person sees before any of this is written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from echo_bot.richtext.markup import written
from echo_bot.richtext.model import Formatted, Span
from echo_bot.richtext.splitting import Unit

MAX_TEXT = 3_900  # characters of one message (Slack advises ≤ 4,000; it cuts at 40,000)
MAX_WIRE = 12_000  # characters of mrkdwn in one message, escapes and marks included
_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_MARKS = {"bold": "*", "italic": "_", "strikethrough": "~", "code": "`"}
_BACKQUOTES = re.compile("`(?=`)")
_LINK = re.compile(r"<([^<>|]*)\|([^<>]*)>|<([^<>|]*)>")


def escape(text: str) -> str:
    """``text`` shown as it is: Slack's three control characters escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def preformatted(text: str) -> str:
    """Text inside a code block: escaped, and no two backquotes in a row (a word joiner
    after each that another follows), so no run of them can end the block early."""
    return _BACKQUOTES.sub("`\u2060", escape(text))


def _linkable(url: str | None) -> bool:
    return (
        bool(url)
        and str(url).lower().startswith(_SAFE_SCHEMES)
        and not any(c in str(url) for c in "|<> ")
    )


def _opening(span: Span) -> str:
    if span.type == "pre":
        return "```\n"
    if span.type == "text_link":
        return f"<{escape(str(span.url))}|" if _linkable(span.url) else ""
    if span.type == "blockquote":
        return "> "
    return _MARKS.get(span.type, "")


def _closing(span: Span) -> str:
    if span.type == "pre":
        return "\n```"
    if span.type == "text_link":
        return ">" if _linkable(span.url) else ""
    return "" if span.type == "blockquote" else _MARKS.get(span.type, "")


def _text(piece: str, inside: Sequence[Span]) -> str:
    kinds = {span.type for span in inside}
    if "pre" in kinds:
        return preformatted(piece)
    if "code" in kinds:
        return escape(piece).replace("`", "'")  # a backquote would end it
    piece = escape(piece)
    return piece.replace("\n", "\n> ") if "blockquote" in kinds else piece


def mrkdwn(part: Formatted) -> str:
    return written(part, text=_text, opening=_opening, closing=_closing)


def unescaped(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def shown(wire: str) -> str:
    """What Slack shows of ``wire``: a link as its text, code fences gone, escapes
    undone; and on a second line the same without any mark (``1234*56*`` reads as
    ``123456``)."""
    text = _LINK.sub(lambda m: m.group(2) if m.group(3) is None else m.group(3), wire)
    text = unescaped(text.replace("```", "").replace("\u2060", ""))
    return f"{text}\n{re.sub(r'[*_~`]', '', text)}"


@dataclass(frozen=True)
class SlackText:
    """Slack's wire for a message (or, with a smaller limit, a Block Kit section)."""

    limit: int = MAX_TEXT
    wire_limit: int = MAX_WIRE
    unit: Unit = "chars"

    def wire(self, part: Formatted) -> str:
        return mrkdwn(part)

    def visible(self, wire: str) -> str:
        return shown(wire)

    def fits(self, wire: str) -> bool:
        return len(wire) <= self.wire_limit


TEXT = SlackText()
