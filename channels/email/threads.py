"""What a reply needs of its thread — the subject and the ids it answers — kept in the
store, a note per thread: a reply after a restart is still threaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from echo_bot.bus import ChannelHost
from echo_bot.events import Address

from .reading import MAX_REFERENCES, Mail


@dataclass
class Thread:
    subject: str = ""
    references: list[str] = field(default_factory=list)


class Threads:
    def __init__(self, host: ChannelHost) -> None:
        self.host = host

    @staticmethod
    def _name(address: Address) -> str:
        return f"email-thread:{address}"

    async def of(self, address: Address) -> Thread:
        kept = await self.host.recall_note(self._name(address))
        if kept is None:
            return Thread()
        try:
            loaded = json.loads(kept[0])
            return Thread(str(loaded["subject"]), [str(r) for r in loaded["references"]])
        except (ValueError, KeyError, TypeError):
            return Thread()

    async def _keep(self, address: Address, thread: Thread) -> None:
        thread.references = thread.references[-MAX_REFERENCES:]
        note = {"subject": thread.subject, "references": thread.references}
        await self.host.remember_note(self._name(address), json.dumps(note))

    async def heard(self, address: Address, mail: Mail) -> None:
        """``mail`` came in ``address``'s thread: a reply answers it."""
        ids = mail.references + ([mail.message_id] if mail.message_id else [])
        await self._keep(address, Thread(mail.subject, ids))

    async def said(self, address: Address, thread: Thread, message_id: str) -> None:
        thread.references.append(message_id)
        await self._keep(address, thread)
