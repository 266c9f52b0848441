"""The sync loop, durable like Telegram's poller: commit, then move the token.

``client.sync(since=token)`` is called here, not ``sync_forever``: nio's loop moves its
token as soon as a response is read. Here every room event of a response is handed to
``inbound`` in order — each message becomes one committed inbound — and only then is
the response's ``next_batch`` kept in the store (``host.remember_note``), where the next
start (or another daemon on a shared store) recalls it. A kill in between repeats the
batch at the next start; the inbox drops the repeats by event ID. A publish the store
did not take (``CommitFailed``) ends the batch: the token stays, the batch comes again.

After each sync the end-to-end encryption work it calls for: upload the device's keys,
query the devices of the rooms' members, claim one-time keys, send queued to-device
messages (room keys). The devices of allowed users are trusted on first use (see
``trust``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nio import AsyncClient, SyncResponse

from echo_bot.bus import ChannelHost
from echo_bot.config import MatrixConfig

from .common import CommitFailed, Health, log
from .inbound import Inbound

MAX_DELAY = 60.0


class Syncer:
    def __init__(
        self,
        config: MatrixConfig,
        options: Mapping[str, Any],
        host: ChannelHost,
        client: AsyncClient,
        inbound: Inbound,
        health: Health,
    ) -> None:
        self.config = config
        self.host = host
        self.client = client
        self.inbound = inbound
        self.health = health
        self.timeout_ms = int(float(options.get("sync_timeout", 30)) * 1000)
        self.token: str | None = None
        self.first = True  # the first sync of this run asks for the rooms' full state
        self.synced = asyncio.Event()  # set once the first sync is handled
        self._delay = 1.0

    @property
    def _token_name(self) -> str:
        return f"matrix-sync:{self.config.user_id}"

    async def run(self) -> None:
        kept = await self.host.recall_note(self._token_name)
        self.token = kept[0] if kept else None
        while True:
            await self.once()

    async def once(self) -> None:
        # nio syncs from its own next_batch when ``since`` is None: make it ours, so a
        # batch not taken (CommitFailed) before any token was stored comes again.
        self.client.next_batch = self.token
        self.client.loaded_sync_token = self.token
        answer = await self.client.sync(
            timeout=0 if self.first else self.timeout_ms,
            since=self.token,
            full_state=self.first or None,
        )
        if not isinstance(answer, SyncResponse):
            await self._failed(f"sync failed: {answer}")
            return
        self.first = False
        if self.health.status != "ok":
            log.info("matrix: syncing")
        self.health.status, self.health.last_error, self._delay = "ok", None, 1.0
        await self.encryption()
        try:
            await self.feed(answer)
        except CommitFailed as exc:
            log.error("matrix: an event was not stored (%s); syncing from the last token", exc)
            await asyncio.sleep(1)
            return
        if answer.next_batch and answer.next_batch != self.token:
            await self.host.remember_note(self._token_name, answer.next_batch)
            self.token = answer.next_batch
        self.synced.set()

    async def feed(self, answer: SyncResponse) -> None:
        for room_id, info in answer.rooms.invite.items():
            try:
                await self.inbound.on_invite(room_id, list(info.invite_state))
            except CommitFailed:
                raise
            except Exception:  # a bad invite must not stall the others
                log.exception("matrix: the invite to %s could not be handled", room_id)
        for room_id, info in answer.rooms.join.items():
            for event in info.timeline.events:
                try:
                    await self.inbound.on_event(room_id, event)
                except CommitFailed:
                    raise
                except Exception:  # a bad event must not stall the queue forever
                    log.exception(
                        "matrix: event %s in %s could not be handled",
                        getattr(event, "event_id", "?"), room_id,
                    )  # fmt: skip

    async def encryption(self) -> None:
        client = self.client
        if not self.config.encryption or client.olm is None:
            return
        try:
            if client.should_upload_keys:
                await client.keys_upload()
            if client.should_query_keys:
                await client.keys_query()
            if client.should_claim_keys:
                await client.keys_claim(client.get_users_for_key_claiming())
            await client.send_to_device_messages()
            self.trust()
        except Exception as exc:  # keys come again after the next sync
            log.warning("matrix: key exchange failed: %s", exc)

    def trust(self) -> None:
        """Trust on first use: every device of an allowed user the bot has seen is
        marked verified, so its messages are read and keys shared with it without an
        interactive verification (which a bot cannot do). Someone who takes over an
        allowed user's account can add a device the bot will trust: the account is the
        boundary, as it is for who may chat. Sends also ignore unverified devices
        (outbound.py), so a new device never makes a reply fail."""
        for user_id in self.config.allowed_users:
            for device in self.client.device_store.active_user_devices(user_id):
                if not device.verified:
                    self.client.verify_device(device)

    async def _failed(self, error: str) -> None:
        self.health.degrade(error)
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, MAX_DELAY)
