"""``echo-bot console``: sign-in links to the web console, and its sessions.

A link is made here, at the server, for the owner (named by the login name) or, with
``--as CHANNEL:ID``, for a configured approver who cannot ask for one in their chat.
It is printed once; the store keeps only its digest. With ``[console] enabled = false``
no link is made: it could not be used, and the most common cause is a command that
reads another config than the daemon's (no ``--config``), whose link would point at
the wrong address as well.
"""

from __future__ import annotations

import sys
import time

from ..approvals.display import escape_text
from ..approvals.routing import ApproverDirectory
from ..commands.console import owner_at_server
from ..config import LoadedConfig, channel_names, console_base
from ..console.auth import ConsoleUser, audit_session, link_url, new_link
from ..errors import ConfigError
from ..events import Address
from ..plugins import example_ids, is_local
from ..store import Tx
from ..store.console import ConsoleSessionRow
from .admin import StoreAt, _ambiguous, _clock, _id_prefix, _listed, _with_store

# How much of a bad --as value an error shows (it is escaped, and one line).
SHOWN = 40


def link_command(loaded: LoadedConfig, at: StoreAt, as_: str | None) -> int:
    config = loaded.config
    if not config.console.enabled:
        how = (
            f"in {loaded.path}: set [console] enabled = true there and restart the daemon"
            if loaded.from_file
            else "(no config file was given: point at the daemon's with --config PATH or"
            " $ECHO_BOT_CONFIG)"
        )
        print(f"echo-bot: the console is off {how}; no link was made", file=sys.stderr)
        return 2
    user = owner_at_server() if as_ is None else _approver(loaded, as_)
    if user is None:
        return 2
    ttl = config.console.link_ttl.total_seconds()
    now = time.time()
    secret = _with_store(at, lambda tx: new_link(tx, user, ttl, now), create=True)
    who = f"{user.name} (the owner)" if user.owner else f"{user.channel}:{user.id}"
    print(f"Sign-in link to the console for {escape_text(who)}:")
    print(f"  {link_url(console_base(config), secret)}")
    print(
        f"It works once, until {_clock(now + ttl)}. Whoever opens it is signed in:"
        " do not forward it."
    )
    return 0


def _approver(loaded: LoadedConfig, given: str) -> ConsoleUser | None:
    """The approver ``--as`` names, or None (said in one line) when it names none."""
    shown = _shown(given)
    try:
        user = ConsoleUser.parse(given)
    except ConfigError:
        user = None
    if user is None or user.channel not in channel_names():
        print(
            f'echo-bot: --as "{shown}" names no approver: write CHANNEL:ID ({example_ids()})',
            file=sys.stderr,
        )
        return None
    directory = ApproverDirectory(loaded.config)
    if is_local(user.channel):
        why = "the terminal's user is the owner: leave out --as"
    elif not directory.approves(Address(channel=user.channel, chat_id=user.id), user.id):
        source = loaded.path or "the embedded defaults"
        why = f"not an approver in {source} ([{user.channel}] approvers, else its allowed_users)"
    else:
        return user
    print(f'echo-bot: --as "{shown}": {why}; no link was made', file=sys.stderr)
    return None


def _shown(given: str) -> str:
    """Something the user typed, in an error: escaped, and not more than a line."""
    return escape_text(given[:SHOWN]) + ("…" if len(given) > SHOWN else "")


# -- sessions -----------------------------------------------------------------------------
def sessions_command(at: StoreAt, *, every: bool) -> int:
    now = time.time()
    rows = _listed(at, lambda tx: tx.console.sessions(now, ended=every))
    if not rows:
        print("No console sessions." if every else "No live console sessions.")
        return 0
    for row in rows:
        state = f"  {_state(row, now)}" if every else ""
        print(
            f"{row.id}  {_who(row)}  created {_clock(row.created_at)}  "
            f"expires {_clock(row.expires_at)}{state}  {escape_text(row.agent) or '-'}"
        )
    return 0


def _who(row: ConsoleSessionRow) -> str:
    try:
        return escape_text(ConsoleUser.from_json(row.approver).label)
    except (KeyError, TypeError):  # a row this version did not write
        return "(unknown)"


def _state(row: ConsoleSessionRow, now: float) -> str:
    if row.revoked_at is not None:
        return f"revoked {_clock(row.revoked_at)}"
    return "live" if row.live(now) else "expired"


def revoke_command(at: StoreAt, given: str | None, *, every: bool) -> int:
    if every == (given is not None):
        print(
            "echo-bot: console revoke takes a session id or --all (see"
            " `echo-bot console sessions`)",
            file=sys.stderr,
        )
        return 2
    if every:
        return _revoke_all(at)
    assert given is not None
    wanted = _id_prefix(given, "session", "echo-bot console sessions")
    if wanted is None:
        return 2

    def revoke(tx: Tx) -> tuple[list[str], ConsoleSessionRow | None, bool]:
        now = time.time()
        matches = tx.console.ids_beginning(wanted)
        if len(matches) != 1:
            return matches, None, False
        row = next(r for r in tx.console.sessions(now, ended=True) if r.id == matches[0])
        ended = tx.console.revoke(row.id, now)
        if ended:
            audit_session(tx, "console.revoked", row.approver, row.id, by=_revoker())
        return matches, row, ended

    matches, row, ended = _with_store(at, revoke)
    if len(matches) > 1:
        _ambiguous(given, matches, "session")
        return 2
    if row is None:
        print(f"echo-bot: no console session {_shown(given)}", file=sys.stderr)
        return 1
    if not ended:
        print(
            f"echo-bot: session {row.id} had already ended ({_state(row, time.time())});"
            " nothing changed",
            file=sys.stderr,
        )
        return 1
    print(f"Ended session {row.id} of {_who(row)}: its browser is signed out now.")
    return 0


def _revoker() -> str:
    return f"{owner_at_server().name} (echo-bot console revoke)"


def _revoke_all(at: StoreAt) -> int:
    def revoke(tx: Tx) -> list[ConsoleSessionRow]:
        now = time.time()
        ended = [row for row in tx.console.sessions(now) if tx.console.revoke(row.id, now)]
        for row in ended:
            audit_session(tx, "console.revoked", row.approver, row.id, by=_revoker())
        return ended

    ended = _with_store(at, revoke)
    if not ended:
        print("No live console sessions; nothing changed.")
        return 0
    print(f"Ended {len(ended)} session(s): every browser is signed out now.")
    for row in ended:
        print(f"  {row.id}  {_who(row)}")
    return 0
