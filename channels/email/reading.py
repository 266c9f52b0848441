"""A mail as the channel reads it: who sent it (one address, and whether the receiving
server vouched for it), whether a program sent it (never answered), which thread it
belongs to, its text and its files. Parsed with the standard library's ``email`` package
and its default policy; a header that does not parse reads as absent, never as a crash.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field
from email import errors, policy
from email.message import EmailMessage, Message
from email.parser import BytesParser
from typing import Any, cast

from channels.html import shown_html
from channels.parts import clean

MAX_TEXT = 32_000  # characters of a mail's text handed on
MAX_HTML = 64_000  # characters of an HTML body read as text (its parser is slow on hostile markup)
MAX_PARTS = 500  # parts of a mail looked at for files
MAX_REFERENCES = 20
_MESSAGE_ID = re.compile(r"<[^<>\s]{1,250}>")
_QUOTE_INTRO = re.compile(r"^(On .{1,300} wrote:|-{2,}\s*Original Message\s*-{2,})\s*$", re.I)


@dataclass(frozen=True)
class MailFile:
    index: int  # its place among the message's parts (``walk()`` order)
    name: str | None
    mime_type: str
    size: int


@dataclass(frozen=True)
class Mail:
    message_id: str | None
    root: str  # the thread's first message's id (the mail's own when it starts one)
    sender: str | None  # the one From: address, lowercased; None: none, several or malformed
    name: str
    subject: str
    references: list[str]  # References, then In-Reply-To: the thread, oldest first
    in_reply_to: str | None
    recipients: list[str]  # To: and Cc:, lowercased
    automatic: str | None  # why a program sent it (never answered), or None
    vouched: bool  # the receiving server vouched for the sender (``authentic``)
    text: str = ""
    files: list[MailFile] = field(default_factory=list)

    @property
    def thread(self) -> str:
        """The thread's key: its first message's id hashed, so every mail of a thread,
        and the bot's replies, share it."""
        return hashlib.sha256(self.root.encode()).hexdigest()[:16]

    def direct(self, bot: str) -> bool:
        """To the bot alone: nobody else reads the answer."""
        return self.recipients == [bot]


def parsed(raw: bytes) -> EmailMessage:
    message = BytesParser(policy=policy.default).parsebytes(raw)
    assert isinstance(message, EmailMessage)
    return message


def _header(message: Message, name: str) -> str:
    try:
        value = message.get(name)
        return clean(str(value)) if value is not None else ""
    except Exception:  # a header the parser cannot make sense of: as if absent
        return ""


def _addresses(message: Message, *names: str) -> list[tuple[str, str]] | None:
    """The (name, address) pairs the headers ``names`` hold; None when one does not
    parse cleanly: a malformed ``From: a@x.org <b@x.org>`` reads as a@x.org, while the
    server that vouched for it may have read b@x.org, the sender's own."""
    found: list[tuple[str, str]] = []
    try:
        for name in names:
            # The default policy's headers: parsed, with what was wrong with them.
            for header in cast(list[Any], message.get_all(name, [])):  # AddressHeader
                if any(isinstance(d, errors.InvalidHeaderDefect) for d in header.defects):
                    return None
                found += [(a.display_name, a.addr_spec) for a in header.addresses]
    except Exception:
        return None
    return found


def automatic(message: Message) -> str | None:
    """Why a program sent this (RFC 3834's Auto-Submitted, a bulk Precedence, a mailing
    list, a bounce): answering it could start a loop between two robots."""
    submitted = _header(message, "Auto-Submitted").strip().lower()
    if submitted and not submitted.startswith("no"):
        return f"Auto-Submitted: {submitted[:40]}"
    precedence = _header(message, "Precedence").strip().lower()
    if precedence in {"bulk", "junk", "list", "auto_reply"}:
        return f"Precedence: {precedence}"
    for name in ("X-Autoreply", "X-Autorespond", "List-Id", "List-Unsubscribe"):
        if _header(message, name):
            return f"it has {name}"
    if _header(message, "Return-Path").strip() == "<>":
        return "an empty return path (a bounce)"
    if message.get_content_type() == "multipart/report":
        return "a delivery report"
    senders = _addresses(message, "From") or []
    if any(address.lower().startswith(("mailer-daemon@", "postmaster@")) for _, address in senders):
        return "a mailer daemon"
    return None


def _results(value: str) -> list[list[str]] | None:
    """An Authentication-Results value (RFC 8601) as it came, never decoded (an encoded
    word is text): its parts at ``;`` and their words, read outside comments (nested,
    dropped) and quoted strings (part of one word, whatever they hold). None when a
    quote or a comment is left open."""
    parts: list[list[str]] = [[]]
    word: list[str] = []
    depth, quoted, escaped = 0, False, False
    for char in value + " ":
        if escaped:
            word += [char] if not depth else []
            escaped = False
        elif char == "\\" and (quoted or depth):
            escaped = True
        elif quoted:
            quoted = char != '"'
            word += [char] if quoted else []
        elif depth or char == "(":
            depth += (char == "(") - (char == ")")
        elif char == '"':
            quoted = True
        elif char == ";" or char.isspace():
            if word:
                parts[-1].append("".join(word))
                word.clear()
            if char == ";":
                parts.append([])
        else:
            word.append(char)
        if depth and word:  # a comment ends the word before it
            parts[-1].append("".join(word))
            word.clear()
    return None if quoted or depth else parts


def topmost_results(message: Message, header: str) -> list[list[str]] | None:
    """The topmost ``header`` as ``_results`` reads it (its first word the authserv-id
    of the server that wrote it); None when there is none or it does not read."""
    value = next((v for k, v in message.raw_items() if k.lower() == header.lower()), None)
    return _results(str(value)) if value is not None else None


def authentic(message: Message, sender: str, header: str, serv_id: str) -> bool:
    """Whether the receiving server vouched for ``sender``: the topmost ``header``
    (the last added, by the server that received the mail: any below it came with
    the mail and could be forged) is ``serv_id``'s and says ``dmarc=pass`` for the
    sender's domain, or ``dkim=pass`` for it or a domain it belongs to (two labels at
    least), and no ``dmarc`` failure for it. Read as it came (``_results``): a value
    the sender wrote (an envelope address, a HELO name) is one word, whatever its
    quotes, comments or encoded words hold."""
    parts = topmost_results(message, header)
    if not parts or not parts[0] or parts[0][0].lower() != serv_id.lower():
        return False
    domain = sender.rpartition("@")[2]
    vouched = False
    for words in parts[1:]:
        if not words or "=" not in words[0]:
            continue
        method, _, outcome = words[0].lower().partition("=")
        props = dict(w.lower().partition("=")[::2] for w in words[1:] if "=" in w)
        if method == "dmarc" and props.get("header.from") == domain:
            if outcome == "fail":
                return False  # the domain's own policy says the mail is not its
            vouched = vouched or outcome == "pass"  # none (no policy), temperror: not a veto
        elif method == "dkim" and outcome == "pass":
            signer = props.get("header.d") or props.get("header.i", "").lstrip("@")
            if "." in signer and (domain == signer or domain.endswith("." + signer)):
                vouched = True
    return vouched


def _unquoted(text: str) -> str:
    """A reply's own words: the quoted mail under it (``>`` lines, and the line that
    introduces them) left out."""
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and (not lines[-1].strip() or lines[-1].startswith(">")):
        lines.pop()
    if lines and _QUOTE_INTRO.match(lines[-1].strip()):
        lines.pop()
    return "\n".join(lines).strip()


def _content(part: Message) -> str:
    try:
        content = part.get_content()  # type: ignore[attr-defined]
    except (LookupError, UnicodeError, ValueError, AssertionError):  # a charset unknown
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    return content if isinstance(content, str) else ""


def _text(message: EmailMessage) -> str:
    """Its plain text, or its HTML as a reader shows it."""
    try:
        body = message.get_body(preferencelist=("plain", "html"))
    except Exception:
        body = None
    if body is None:
        return ""
    content = _content(body)
    if body.get_content_type() == "text/html":
        content = shown_html(content[:MAX_HTML])
    return clean(_unquoted(content))[:MAX_TEXT]


def _files(message: EmailMessage) -> list[MailFile]:
    files = []
    for index, part in enumerate(itertools.islice(message.walk(), MAX_PARTS)):
        if part.is_multipart() or part.get_content_disposition() != "attachment":
            continue
        payload = part.get_payload()
        size = len(payload) * 3 // 4 if isinstance(payload, str) else 0  # base64's
        name = part.get_filename()
        files.append(MailFile(index, clean(name)[:256] if name else None,
                              part.get_content_type()[:128], size))  # fmt: skip
    return files[:10]


def _asked_in(subject: str) -> str:
    """A mail with nothing but its subject (a question asked there): the subject is its
    text, unless it only says it is a reply."""
    return "" if re.match(r"(?i)^(re|aw|sv|fwd?):", subject) else subject


def read(raw: bytes, *, auth: tuple[str, str], whole: bool = True) -> Mail:
    """``raw`` read, its sender checked by ``auth`` (the header, the server's id);
    ``whole=False``: its headers only (a mail too large to read)."""
    message = parsed(raw)
    found = _addresses(message, "From") or []
    one = len(found) == 1 and "@" in found[0][1]  # else not one sender: never answered
    sender = found[0][1].strip().lower() if one else None
    references = _MESSAGE_ID.findall(_header(message, "References"))
    replied = _MESSAGE_ID.findall(_header(message, "In-Reply-To"))
    if replied and replied[-1] not in references:
        references.append(replied[-1])
    own = _MESSAGE_ID.findall(_header(message, "Message-ID"))
    subject = " ".join(_header(message, "Subject").split())[:200]
    return Mail(
        message_id=own[0] if own else None,
        root=(references or own or [""])[0],
        sender=sender,
        name=clean(found[0][0])[:100] if one else "",
        subject=subject,
        references=references[-MAX_REFERENCES:],
        in_reply_to=replied[-1] if replied else None,
        recipients=sorted({a.lower() for _, a in _addresses(message, "To", "Cc") or [] if a}),
        automatic=automatic(message),
        vouched=sender is not None and authentic(message, sender, *auth),
        text=(_text(message) or _asked_in(subject)) if whole else "",
        files=_files(message) if whole else [],
    )
