"""Who may use the console, and how they sign in: one-time links, then a session.

A link is made on the server (``echo-bot console link``) or asked for by an approver in
their own chat with the bot (``/console``). It is bound to one approver, works once and
for ``[console] link_ttl``; using it makes a session: a new random secret in an HttpOnly
cookie, and a CSRF token for the session's forms. The store keeps only digests of both
secrets (``store/console.py``).

Two kinds of people sign in:

- an approver of a chat channel (``telegram:12345``): they decide in the console what they
  could decide with the prompt's buttons (``ApprovalGate._may_decide``);
- the owner at the server (a link made by ``echo-bot console link`` without ``--as``),
  named by their login name: they decide what ``echo-bot approvals`` can.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..approvals.display import clip
from ..approvals.routing import OWNER_CONSOLE, VIA_CONSOLE
from ..errors import ConfigError
from ..events import Address
from ..plugins import example_ids
from ..store import Tx
from ..store.console import ConsoleSessionRow

__all__ = ["OWNER_CONSOLE", "VIA_CONSOLE", "ConsoleUser", "NewSession"]
COOKIE = "echo_bot_console"
# The agent string kept with a session, at most (a header may be 8 KiB).
AGENT_CLIP = 200


@dataclass(frozen=True, slots=True)
class ConsoleUser:
    """Who a link or session is for."""

    channel: str  # "telegram", …; "echo-bot" for the owner at the server
    id: str
    name: str

    @property
    def owner(self) -> bool:
        return self.channel == OWNER_CONSOLE.channel

    @property
    def address(self) -> Address:
        """Where their decisions say they come from: the owner's console, or the
        approver's own chat with the bot."""
        return OWNER_CONSOLE if self.owner else Address(channel=self.channel, chat_id=self.id)

    @property
    def label(self) -> str:
        return f"{self.name} (console)" if self.owner else f"{self.channel}:{self.id} (console)"

    def to_json(self) -> dict[str, Any]:
        return {"channel": self.channel, "id": self.id, "name": self.name}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ConsoleUser:
        return cls(channel=str(raw["channel"]), id=str(raw["id"]), name=str(raw.get("name", "")))

    @classmethod
    def parse(cls, text: str) -> ConsoleUser:
        """``telegram:12345`` (an approver), as ``echo-bot console link --as`` takes it."""
        channel, sep, user_id = text.partition(":")
        if not sep or not channel or not user_id or channel == OWNER_CONSOLE.channel:
            raise ConfigError(
                f"{clip(text, 40)!r} is not an approver: give CHANNEL:ID ({example_ids()})"
            )
        return cls(channel=channel, id=user_id, name=user_id)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def new_link(tx: Tx, user: ConsoleUser, ttl: float, now: float | None = None) -> str:
    """A one-time sign-in secret for ``user``, valid for ``ttl`` seconds."""
    now = time.time() if now is None else now
    secret = secrets.token_urlsafe(32)
    tx.console.add_link(digest(secret), user.to_json(), now, now + ttl)
    return secret


@dataclass(frozen=True, slots=True)
class NewSession:
    secret: str  # the cookie's value: shown to the browser once, never stored
    row: ConsoleSessionRow


def sign_in(
    tx: Tx, link: str, ttl: float, agent: str, now: float | None = None
) -> NewSession | None:
    """Use ``link`` (once) and open a session for its approver; None when the link is not
    valid (unknown, used, expired: not told apart)."""
    now = time.time() if now is None else now
    approver = tx.console.use_link(digest(link), now)
    if approver is None:
        return None
    secret = secrets.token_urlsafe(32)
    session_id = secrets.token_hex(6)
    csrf = secrets.token_urlsafe(24)
    tx.console.add_session(
        session_id, digest(secret), approver, csrf, now, now + ttl, agent[:AGENT_CLIP]
    )
    row = ConsoleSessionRow(session_id, approver, csrf, now, now + ttl, None, agent[:AGENT_CLIP])
    return NewSession(secret=secret, row=row)


def audit_session(
    tx: Tx, event: str, approver: dict[str, Any], session_id: str, **data: Any
) -> None:
    """A sign-in, sign-out or revocation in the audit log (``console.signed_in``…): who,
    which session, and what else is known (the address it came from, who revoked it),
    so the Audit page answers who was signed in, from where, and when."""
    user = ConsoleUser.from_json(approver)
    who = user.name if user.owner else f"{user.channel}:{user.id}"
    tx.audit.write(event, trace_id=None, session_key=None, approver=who, session=session_id, **data)


def session_of(tx: Tx, secret: str, now: float | None = None) -> ConsoleSessionRow | None:
    """The live session of a cookie's value (None: none, ended or revoked)."""
    if not secret or len(secret) > 256:
        return None
    return tx.console.session(digest(secret), time.time() if now is None else now)


def link_url(base: str, secret: str) -> str:
    return f"{base.rstrip('/')}/console/login?t={secret}"
