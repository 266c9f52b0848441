"""What a text becomes in Slack: ``mrkdwn``, Slack's own markup, made from the model's
Markdown, and split to fit a message.

Every text that is not markup is escaped (``&``, ``<``, ``>`` as Slack asks), so
nothing the model or a tool writes can become a mention (``<!channel>``, ``<@U…>``), a
link of its own making, or broken markup: Slack answers no API error for odd input,
and an ``@channel`` in a reply pings no one. Links are written ``<url|text>`` only for
http(s) and mailto URLs the parser validated; any other link is shown as text. A link
whose text looks like an address other than its target's (``[bank.com](evil.example)``)
shows its target too. Markdown
that mrkdwn lacks becomes its nearest: headings bold lines, tables and code blocks
preformatted, images their link.

What the renderer made is masked again (``host.masker``) right before it leaves.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token

MAX_TEXT = 3_900  # characters of one message (Slack advises ≤ 4,000; it cuts at 40,000)
_PARSER = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_INLINE_MARKS = {"strong": "*", "em": "_", "s": "~"}
_BACKQUOTES = re.compile("`(?=`)")


def escape(text: str) -> str:
    """``text`` shown as it is: Slack's three control characters escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(markdown: str) -> str:
    """The Markdown as mrkdwn (everything but the markup escaped)."""
    lines: list[str] = []
    _blocks(_PARSER.parse(markdown), lines)
    return "\n".join(lines).strip("\n")


def _blocks(tokens: list[Token], out: list[str]) -> None:
    quote = 0
    lists: list[list[int]] = []  # per open list: [next number] (ordered) or [] (bullets)
    pending: str | None = None  # the marker of a list item whose first line comes next
    row: list[str] | None = None  # the cells of a table row being read
    for token in tokens:
        prefix = "> " * quote
        kind = token.type
        if kind == "blockquote_open":
            quote += 1
        elif kind == "blockquote_close":
            quote -= 1
        elif kind in ("bullet_list_open", "ordered_list_open"):
            start = int(token.attrGet("start") or 1) if kind == "ordered_list_open" else 0
            lists.append([start] if kind == "ordered_list_open" else [])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            if not lists:
                out.append(prefix.rstrip())
        elif kind == "list_item_open":
            numbers = lists[-1]
            pending = f"{numbers[0]}." if numbers else "•"
            if numbers:
                numbers[0] += 1
        elif kind == "inline" and row is not None:  # a table cell: shown preformatted
            row.append(_plain(token.children or []))
        elif kind == "inline":
            text = _inline(token.children or [])
            indent = "    " * max(len(lists) - 1, 0)
            if pending is not None:
                text, pending = f"{indent}{pending} {text}", None
            elif lists:
                text = f"{indent}  {text}"
            out.extend(prefix + line for line in text.split("\n"))
        elif kind == "heading_close":
            out[-1] = f"{prefix}*{out[-1][len(prefix) :]}*"
            out.append(prefix.rstrip())
        elif kind == "paragraph_close" and not lists:
            out.append(prefix.rstrip())
        elif kind in ("fence", "code_block"):
            body = preformatted(token.content.rstrip("\n"))
            out.extend(prefix + line for line in f"```\n{body}\n```".split("\n"))
            out.append(prefix.rstrip())
        elif kind == "hr":
            out.extend([prefix + "――――――――", prefix.rstrip()])
        elif kind == "table_open":
            out.append(prefix + "```")
        elif kind == "tr_open":
            row = []
        elif kind == "tr_close" and row is not None:
            out.append(prefix + " | ".join(row))
            row = None
        elif kind == "table_close":
            out.extend([prefix + "```", prefix.rstrip()])


def preformatted(text: str) -> str:
    """Text inside a code block: escaped, and no two backquotes in a row (a word joiner
    after each that another follows), so no run of them can end the block early."""
    return _BACKQUOTES.sub("`\u2060", escape(text))


def _plain(children: list[Token]) -> str:
    return preformatted("".join(c.content for c in children if c.type != "softbreak"))


def _inline(children: list[Token]) -> str:
    parts: list[str] = []
    links: list[tuple[str | None, list[str]]] = []  # open links: target (None: as text), outer
    for child in children:
        kind = child.type
        mark = _INLINE_MARKS.get(kind.rsplit("_", 1)[0])
        if kind == "text":
            parts.append(escape(child.content))
        elif mark is not None and kind.endswith(("_open", "_close")):
            parts.append(mark)
        elif kind == "code_inline":
            code = escape(child.content).replace("`", "'")  # a backquote would end it
            parts.append(f"`{code}`")
        elif kind in ("softbreak", "hardbreak"):
            parts.append("\n")
        elif kind == "link_open":
            href = str(child.attrGet("href") or "")
            safe = href.lower().startswith(_SAFE_SCHEMES) and not any(c in href for c in "|<> ")
            links.append((href if safe else None, parts))
            parts = []
        elif kind == "link_close" and links:
            target, outer = links.pop()
            label = "".join(parts)
            if target and _misleading(label, target):
                outer.append(f"{label} (<{escape(target)}>)")
            else:
                outer.append(f"<{escape(target)}|{label}>" if target else label)
            parts = outer
        elif kind == "image":
            parts.append(escape(child.content or str(child.attrGet("src") or "")))
        else:
            parts.append(escape(child.content))
    while links:  # never left open by the parser; kept whole if it were
        _target, outer = links.pop()
        outer.extend(parts)
        parts = outer
    return "".join(parts)


_ADDRESS = re.compile(r"^(?:https?://)?(?:www\.)?([a-z0-9-]+(?:\.[a-z0-9-]+)+)(?:[/?#]\S*)?$", re.I)


def _misleading(label: str, target: str) -> bool:
    """Whether a link's text names an address (a host) that is not its target's."""
    found = _ADDRESS.match(label.strip())
    if found is None:
        return False
    host = (urlsplit(target).hostname or "").lower().removeprefix("www.")
    return found.group(1).lower().removeprefix("www.") != host


def split_text(text: str, limit: int = MAX_TEXT) -> list[str]:
    """``text`` in parts of at most ``limit`` characters, cut at a paragraph, line or
    space where one is near the end (never inside an escape such as ``&amp;``)."""
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = max(window.rfind("\n\n"), window.rfind("\n"), window.rfind(" "))
        if cut < limit // 2:
            cut = limit
            amp = window.rfind("&", max(0, limit - 6))
            if amp != -1 and ";" not in window[amp:]:
                cut = amp
        parts.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip("\n ")
    parts.append(rest)
    return [p for p in parts if p] or [""]
