"""How a tool call is shown to a person who decides on it.

One rule for every place an approval is shown (chat prompt, edited prompt,
``/approvals``, the terminal prompt, ``echo-bot approvals list|show``): every argument,
complete, the deciding ones first, and no character that could hide, reorder or fake
text reaches the screen raw — bidi controls, zero-width and other invisible characters,
line and paragraph separators and control characters (newlines included) are shown as
escapes such as ``\\u202e`` or ``\\n``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from ..plugins import is_local

# Telegram's limit for one message, in UTF-16 code units; the smallest chat limit.
PROMPT_LIMIT = 4096
# Room the lines around the arguments may take at most (every one is clipped, below).
HEADER_BUDGET = 496
# The shown call (``tool(arg=value, …)``) must fit here, or the chat offers Deny only.
CALL_LIMIT = PROMPT_LIMIT - HEADER_BUDGET
# Caps for the lines around the call; none of these decides what a call does.
TOOL_CLIP = 64
REASON_CLIP = 80
NAME_CLIP = 64
ADDRESS_CLIP = 100

# Unicode's Default_Ignorable_Code_Point ranges that are not already format (Cf)
# characters: they render as nothing (Hangul fillers, variation selectors, …).
_IGNORABLE = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2065, 0x2065),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _hidden(ch: str) -> bool:
    """True for a character that must not reach a human's screen as itself."""
    category = unicodedata.category(ch)
    if category in _HIDDEN_CATEGORIES:
        return True
    if category == "Zs" and ch != " ":  # no-break and other look-alike spaces
        return True
    code = ord(ch)
    return any(low <= code <= high for low, high in _IGNORABLE)


def _escape_char(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# Printable ASCII is always shown as itself; only the rest needs a look.
_NOT_PLAIN = re.compile(r"[^\x20-\x7e]+")
_NOT_PLAIN_OR_BACKSLASH = re.compile(r"[^\x20-\x5b\x5d-\x7e]+")
# Combining marks shown on one base character; more are escaped: a long stack of them
# ("Zalgo" text) draws over the lines around it and could cover the deciding arguments.
MAX_MARKS = 2


def _replace(match: re.Match[str]) -> str:
    out = []
    marks = 0  # combining marks on the current base character so far
    for ch in match.group():
        if ch == "\\":
            out.append("\\\\")
            marks = 0
            continue
        mark = unicodedata.category(ch) in ("Mn", "Me")
        marks = marks + 1 if mark else 0
        out.append(_escape_char(ch) if _hidden(ch) or marks > MAX_MARKS else ch)
    return "".join(out)


def escape_text(text: str) -> str:
    """Free text (a name, a tool name, an address) made safe to show: hidden characters
    become escapes, and a backslash is doubled so an escape is never ambiguous."""
    return _NOT_PLAIN_OR_BACKSLASH.sub(_replace, text)


def _escape_json(text: str) -> str:
    """JSON text made safe to show (JSON already doubles backslashes and escapes C0)."""
    return _NOT_PLAIN.sub(_replace, text)


def show_value(value: Any) -> str:
    """One argument value, complete: JSON, then every hidden character escaped."""
    return _escape_json(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def show_json(value: Any, indent: int = 2) -> str:
    """Indented JSON of ``value`` for ``echo-bot approvals show`` (escaped as above).
    Its own line breaks stay: JSON writes any newline inside a value as ``\\n``."""
    lines = json.dumps(value, ensure_ascii=False, indent=indent).split("\n")
    return "\n".join(_escape_json(line) for line in lines)


def _show_key(key: str) -> str:
    return key if _IDENTIFIER.fullmatch(key) else show_value(key)


def order_args(args: Mapping[str, Any], key_args: Iterable[str] = ()) -> dict[str, Any]:
    """The arguments with the deciding ones (as the tool declares them) first, in the
    declared order, then the rest by name."""
    first = [k for k in dict.fromkeys(key_args) if k in args]
    rest = sorted(k for k in args if k not in first)
    return {k: args[k] for k in first + rest}


def render_call(tool: str, args: Mapping[str, Any]) -> str:
    """``tool(arg=value, …)`` with every argument complete, in the order given."""
    inner = ", ".join(f"{_show_key(k)}={show_value(v)}" for k, v in args.items())
    return f"{escape_text(tool)}({inner})"


def utf16_len(text: str) -> int:
    """Length as Telegram counts it (astral characters take two units)."""
    return sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)


def fits(call: str) -> bool:
    """Whether a rendered call can be shown completely in any chat prompt."""
    return len(call) <= CALL_LIMIT and utf16_len(call) <= CALL_LIMIT


def render_if_fits(tool: str, args: Mapping[str, Any]) -> str | None:
    """``render_call`` when the result fits a chat prompt, else None. The rendering
    holds every value's JSON and escaping only lengthens it, so a call whose values'
    JSON alone is too long is refused without rendering it: a megabyte of file content
    must not cost the event loop a noticeable time."""
    plain = 0
    for value in args.values():
        plain += len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        if plain > CALL_LIMIT:
            return None
    call = render_call(tool, args)
    return call if fits(call) else None


# Where a decision was taken, for the deciders who are the owner at the server (by the
# chat of the local channel they decided in).
_DECIDED_AT = {"admin": "echo-bot approvals", "console": "console"}


def decider(decided_by: Mapping[str, Any] | None) -> str:
    """Who decided a request, named alike in the chat's edited prompt and in
    ``echo-bot approvals``: the sender's id (a Telegram user id, the local user's login
    name), and for the owner's local tools where ("alice (terminal)", "alice
    (echo-bot approvals)"). Escaped and clipped: the id may come from a chat."""
    if not decided_by:
        return ""
    name = clip(str(decided_by.get("sender_id", "")), NAME_CLIP)
    via = str(decided_by.get("via", ""))
    where = "terminal" if is_local(via) else _DECIDED_AT.get(via)
    return f"{name} ({where})" if where else name


def clip(text: str, limit: int) -> str:
    """Free text escaped and cut to ``limit`` UTF-16 units, marked with "…" when cut.
    Only for the lines around a call (names, addresses), never for arguments."""
    shown = escape_text(text)
    if utf16_len(shown) <= limit:
        return shown
    units = 0
    for index, ch in enumerate(shown):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > limit - 1:
            return shown[:index] + "…"
    return shown
