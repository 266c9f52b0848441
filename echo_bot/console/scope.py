"""Which chats a person signed in to the console may read about (the audit log, usage,
reminders): the owner every one; an approver the chats of their own channel — their own
chat with the bot and the groups — but never another person's own chat with the bot.

On Telegram a person's own chat with the bot has that person's id, a positive number; a
group's id is negative. So a chat of the channel whose id does not begin with ``-`` and
is not theirs is another person's. A Matrix room's or Slack conversation's id says
neither whose it is nor whether it is direct: there an approver sees the chats they
wrote in (with their threads). A direct chat holds one person and the bot, so one they
wrote in is their own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..plugins import ids_tell_direct
from ..store import Tx
from ..store.audit import AuditFilter
from .auth import ConsoleUser


@dataclass(frozen=True, slots=True)
class Scope:
    """The session keys ``user`` may see: ``exact`` ones, and those beginning with one of
    ``prefixes``; everything when ``exact`` is None (the owner)."""

    exact: tuple[str, ...] | None
    prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, user: ConsoleUser, written_in: Sequence[str] = ()) -> Scope:
        """``written_in``: the session keys ``user`` wrote in (``tx.inbox.chats_of``),
        which are what they see on a channel whose ids do not tell."""
        if user.owner:
            return cls(None)
        if not ids_tell_direct(user.channel):
            chats = tuple(written_in)
            return cls(chats, tuple(f"{chat}:" for chat in chats))
        own = f"{user.channel}:{user.id}"
        return cls((own,), (f"{own}:", f"{user.channel}:-"))

    @classmethod
    def read(cls, tx: Tx, user: ConsoleUser) -> Scope:
        if user.owner or ids_tell_direct(user.channel):
            return cls.of(user)
        return cls.of(user, tx.inbox.chats_of(user.channel, user.id))

    def sees(self, session_key: str | None) -> bool:
        if self.exact is None:
            return True
        if session_key is None:
            return False
        return session_key in self.exact or session_key.startswith(self.prefixes)

    def narrow(self, wanted: AuditFilter) -> AuditFilter:
        """``wanted``, limited to these chats (for the store's query)."""
        if self.exact is None:
            return wanted
        return replace(wanted, exact=self.exact, prefixes=self.prefixes)
