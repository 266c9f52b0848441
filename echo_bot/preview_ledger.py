"""The preview messages a channel has up in its chats (sent while a reply is written,
not yet taken by the reply nor removed), kept as a store note: a daemon killed
mid-stream leaves them ending in the writing mark, and the next start removes them
(``left_over``), since the turn, run again, answers in a message of its own.

Only where one daemon uses the store: where several do, another may be writing in a
preview this one would take for left over.
"""

from __future__ import annotations

import json
import logging

from .background import Tasks
from .bus import ChannelHost
from .errors import ChannelError
from .events import Address

log = logging.getLogger(__name__)

KEPT_MAX = 1_000  # previews remembered at once, at most (the oldest forgotten)


class PreviewLedger:
    def __init__(self, host: ChannelHost, channel: str, tasks: Tasks) -> None:
        self.host, self.tasks, self.channel = host, tasks, channel
        self.note = f"{channel}.previews"
        self.on = not host.shared
        self._up: dict[str, list[str]] = {}  # key → [chat, thread or "", message id]
        self._saving = False
        self._dirty = False

    def up(self, key: str, to: Address, message_id: str) -> None:
        """A preview message was sent for ``key`` (the turn's inbound id)."""
        if not self.on:
            return
        self._up[key] = [to.chat_id, to.thread_id or "", message_id]
        while len(self._up) > KEPT_MAX:
            self._up.pop(next(iter(self._up)))
        self._save()

    def down(self, key: str) -> None:
        """Its reply took its place, or it was removed."""
        if self.on and self._up.pop(key, None) is not None:
            self._save()

    async def down_now(self, key: str) -> None:
        """``down``, written before it returns, and before its reply goes into the
        preview's message: a reply is never noted as a preview left over (the next
        start would remove it); at worst a preview is left. Raises ``ChannelError``
        (retryable: the reply waits) when the store does not take it."""
        if not self.on or key not in self._up:
            return
        entry = self._up.pop(key)  # gone at once: a background write meanwhile leaves it out
        try:
            await self.host.remember_note(self.note, json.dumps(self._up))
        except Exception as exc:
            self._up.setdefault(key, entry)  # still noted: at worst a preview is left
            raise ChannelError(f"the preview {key} could not be forgotten: {exc}") from None

    async def left_over(self) -> list[tuple[Address, str]]:
        """What the last run left up, (where, message id) each, forgotten as it is read:
        one that cannot be removed now is not tried again."""
        if not self.on:
            return []
        try:
            note = await self.host.recall_note(self.note)
            if note is None:
                return []
            await self.host.remember_note(self.note, json.dumps(self._up))
            kept = json.loads(note[0])
        except Exception as exc:  # the store away, a note left malformed
            log.info("the previews left by the last run were not read: %s", exc)
            return []
        left = kept.values() if isinstance(kept, dict) else []
        return [
            (
                Address(channel=self.channel, chat_id=str(v[0]), thread_id=str(v[1]) or None),
                str(v[2]),
            )
            for v in left
            if isinstance(v, list) and len(v) == 3
        ]

    def _save(self) -> None:
        """Written in the background, one write at a time, the newest state last."""
        self._dirty = True
        if not self._saving:
            self._saving = True
            self.tasks.spawn(self._write())

    async def _write(self) -> None:
        try:
            while self._dirty:
                self._dirty = False
                try:
                    await self.host.remember_note(self.note, json.dumps(self._up))
                except Exception as exc:  # a preview is never worth a failure
                    log.info("the previews up were not noted: %s", exc)
        finally:
            self._saving = False
