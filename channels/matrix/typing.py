"""Typing notifications while a turn runs: from the message's commit until its reply
is sent (the outbound names its inbound in ``metadata["inbound_id"]``), renewed every
RENEW seconds, for at most TYPING_MAX. One indicator per room, however many turns wait.
A typing notification is never worth a failure: errors end the indicator quietly."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nio import AsyncClient

from echo_bot.events import OutboundMessage

from .common import Tasks, log

RENEW = 20.0  # seconds; each notification lasts TIMEOUT_MS
TIMEOUT_MS = 30_000
TYPING_MAX = 300.0  # a turn waiting for approval does not type for hours
ROOMS_MAX = 1000


class Typing:
    def __init__(self, client: AsyncClient, tasks: Tasks) -> None:
        self.client = client
        self.tasks = tasks
        self._turns: dict[str, set[str]] = {}  # room → inbound ids waiting for a reply
        self._rooms: dict[str, str] = {}  # inbound id → room

    def start(self, inbound_id: str, room_id: str) -> None:
        turns = self._turns.get(room_id)
        if turns is None:
            if len(self._turns) >= ROOMS_MAX:
                return
            turns = self._turns[room_id] = set()
            self.tasks.spawn(self._keep_typing(room_id, turns))
        turns.add(inbound_id)
        self._rooms[inbound_id] = room_id

    def stop_for(self, message: OutboundMessage) -> None:
        self.stop(str(message.metadata.get("inbound_id", "")))

    def stop(self, inbound_id: str) -> None:
        """The turn of ``inbound_id`` shows something now (its reply, or a preview)."""
        room_id = self._rooms.pop(inbound_id, None)
        if room_id is not None:
            self._turns.get(room_id, set()).discard(inbound_id)

    async def _keep_typing(self, room_id: str, turns: set[str]) -> None:
        until = time.monotonic() + TYPING_MAX
        try:
            while turns and time.monotonic() < until:
                await self.client.room_typing(room_id, True, timeout=TIMEOUT_MS)
                for _ in range(int(RENEW * 10)):
                    if not turns:
                        break
                    await asyncio.sleep(0.1)
        except Exception as exc:
            log.debug("matrix: typing in %s failed: %s", room_id, exc)
        finally:
            if self._turns.get(room_id) is turns:
                del self._turns[room_id]
            for inbound_id in turns:
                self._rooms.pop(inbound_id, None)
            with contextlib.suppress(Exception):
                await self.client.room_typing(room_id, False)
