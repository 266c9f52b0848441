"""The sync loop, durable like Telegram's poller: commit, then move the token.

``client.sync(since=token)`` is called here, not ``sync_forever``: nio's loop moves its
token as soon as a response is read. Here every room event of a response is handed to
``inbound`` in order — each message becomes one committed inbound — and only then is
the response's ``next_batch`` kept in the store (``host.remember_note``), where the next
start (or another daemon on a shared store) recalls it. A kill in between repeats the
batch at the next start; the inbox drops the repeats by event ID. A publish the store
did not take (``CommitFailed``) ends the batch: the token stays, the batch comes again.
A room's timeline that a sync answer cut short ("limited": more came while the daemon
was away than one answer carries) is completed from ``/messages`` back to the stored
token before it is handed on, so a long absence loses nothing either.

After each sync the end-to-end encryption work it calls for: upload the device's keys,
query the devices of the rooms' members, claim one-time keys, send queued to-device
messages (room keys). The devices of allowed users are trusted on first use (see
``trust``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nio import AsyncClient, MessageDirection, RoomMessagesResponse, SyncResponse

from echo_bot.bus import ChannelHost, ChannelLink, delivery_lease
from echo_bot.errors import StoreError
from echo_bot.link import STANDBY_CHECK

from .common import NETWORK_ERRORS, CommitFailed, log
from .inbound import Inbound
from .settings import MatrixConfig

# Events per room one sync answer carries (Synapse's default is 10): a longer gap since
# the last sync is "limited" and fetched back page by page (``gap``).
TIMELINE_LIMIT = 50
SYNC_FILTER = {"room": {"timeline": {"limit": TIMELINE_LIMIT}}}
GAP_PAGE = 100
NO_ROOMS: dict[str, Any] = {
    "room": {"rooms": []},
    "presence": {"types": []},
    "account_data": {"types": []},
}
DRAIN_MAX = 50  # syncs of to-device messages at a takeover (100 a sync)
GAP_MAX = 2000  # events of one room fetched back after a long absence, at most
GAP_WAIT_MAX = 60.0  # seconds a rate-limited fetch of them waits, at most


class Syncer:
    def __init__(
        self,
        config: MatrixConfig,
        options: Mapping[str, Any],
        host: ChannelHost,
        client: AsyncClient,
        inbound: Inbound,
        link: ChannelLink,
    ) -> None:
        self.config = config
        self.host = host
        self.client = client
        self.inbound = inbound
        self.link = link
        self.timeout_ms = int(float(options.get("sync_timeout", 30)) * 1000)
        self.token: str | None = None
        self.first = True  # the first sync of this run asks for the rooms' full state
        self.synced = asyncio.Event()  # set once the first sync is handled
        # Whose devices are trusted on first use: [matrix] allowed_users, as the last
        # reload left them (MatrixChannel.reload).
        self.trusted: tuple[str, ...] = tuple(config.allowed_users)

    @property
    def _token_name(self) -> str:
        return f"matrix-sync:{self.config.user_id}"

    async def run(self) -> None:
        """The sync loop (``Link.receive``) for as long as the channel runs."""
        if self.host.shared:
            # This device's keys on the server now, even while another daemon syncs:
            # people's clients then share room keys with it before it takes over.
            await self.encryption()
        turn = self._may_sync if self.host.shared else None
        await self.link.receive(self.once, resume=self._resume, turn=turn, away=NETWORK_ERRORS,
                                peer=self.config.homeserver)  # fmt: skip

    async def _resume(self) -> None:
        """From the token the last syncer stored (this daemon before, or another),
        the rooms' state afresh; first this device's keys sent meanwhile."""
        if self.host.shared:
            await self.drain_to_device()
        kept = await self.host.recall_note(self._token_name)
        self.token = kept[0] if kept else None
        self.first = True

    async def drain_to_device(self) -> None:
        """Before syncing from the token another daemon stored: this device's own
        to-device messages (the room keys people's clients sent it while it stood by),
        read with a filter that leaves every room out. Needed because a sync from a
        token deletes, unread, this device's to-device messages older than that token,
        and that token is the other daemon's: without this the keys sent to this device
        before the takeover would be lost and the messages they open unreadable."""
        since: str | None = None
        for _ in range(DRAIN_MAX):
            self.client.next_batch = self.client.loaded_sync_token = since  # see ``once``
            answer = await self.client.sync(timeout=0, sync_filter=NO_ROOMS, since=since)
            if not isinstance(answer, SyncResponse):
                log.warning("matrix: this device's keys could not be fetched: %s", answer)
                return
            await self.encryption()
            if not answer.to_device_events or answer.next_batch == since:
                return
            since = answer.next_batch

    async def _may_sync(self) -> bool:
        """With several daemons on one store, one syncs this account at a time; the
        others stand by and take over once its lease lapses (what it had not stored the
        token past comes again, and the inbox drops the repeats by event ID).

        The lease is the channel's delivery lease (echo_bot/delivery.py): the daemon
        that sends Matrix's outbox is the one that syncs, since only a synced client
        knows the rooms' members and their devices' keys to encrypt for."""
        # Its holder counts as gone after lease - STANDBY_CHECK unseen: with the link's
        # look every STANDBY_CHECK, the sync is taken over within [matrix] lease.
        within = self.config.lease.total_seconds() - STANDBY_CHECK
        hold = self.host.hold(delivery_lease("matrix"), within)
        return await self.link.takes_turn(hold, "sync", "syncing now", "another daemon syncs")

    async def once(self) -> None:
        # nio syncs from its own next_batch when ``since`` is None: make it ours, so a
        # batch not taken (CommitFailed) before any token was stored comes again.
        self.client.next_batch = self.token
        self.client.loaded_sync_token = self.token
        answer = await self.client.sync(
            timeout=0 if self.first else self.timeout_ms,
            sync_filter=SYNC_FILTER,
            since=self.token,
            full_state=self.first or None,
        )
        if not isinstance(answer, SyncResponse):
            self.link.reconnecting(f"sync failed: {answer}")
            await self.link.pause()
            return
        self.first = False
        self.link.connected()
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
            except StoreError as exc:  # who may invite was not read: it comes again
                raise CommitFailed(str(exc)) from exc
            except Exception:  # a bad invite must not stall the others
                log.exception("matrix: the invite to %s could not be handled", room_id)
        for room_id, info in answer.rooms.join.items():
            events = list(info.timeline.events)
            if info.timeline.limited and self.token is not None:
                events = await self.gap(room_id, info.timeline.prev_batch) + events
            for event in events:
                try:
                    await self.inbound.on_event(room_id, event)
                except CommitFailed:
                    raise
                except StoreError as exc:  # the allowlist or a notice not read or kept
                    raise CommitFailed(str(exc)) from exc
                except Exception:  # a bad event must not stall the queue forever
                    log.exception(
                        "matrix: event %s in %s could not be handled",
                        getattr(event, "event_id", "?"), room_id,
                    )  # fmt: skip

    async def gap(self, room_id: str, prev_batch: str | None) -> list[Any]:
        """The room's events between the stored token and the start of a "limited"
        timeline (more came while the daemon was away than a sync answer carries), oldest
        first: without them those messages would never be seen. A failure raises
        ``CommitFailed``: the token stays, and the whole batch comes again."""
        assert self.token is not None
        if not prev_batch:
            return []
        pages: list[list[Any]] = []
        start, fetched = prev_batch, 0
        while fetched < GAP_MAX:
            answer = await self.client.room_messages(
                room_id, start=start, end=self.token, direction=MessageDirection.back,
                limit=GAP_PAGE,
            )  # fmt: skip
            if not isinstance(answer, RoomMessagesResponse):
                # Rate limited: waited out (the whole batch comes again after it), not
                # asked again at once.
                limited = getattr(answer, "retry_after_ms", None)
                if isinstance(limited, int | float) and limited > 0:
                    await asyncio.sleep(min(limited / 1000, GAP_WAIT_MAX))
                raise CommitFailed(f"the events missed in {room_id} could not be fetched: {answer}")
            pages.append(list(answer.chunk))
            fetched += len(answer.chunk)
            if not answer.chunk or not answer.end or answer.end == start:
                break
            start = answer.end
        else:
            log.warning(
                "matrix: over %d events came in %s while the bot was away; the oldest are "
                "not read", GAP_MAX, room_id,
            )  # fmt: skip
            await self.host.audit("matrix.gap_truncated", room=room_id, read=fetched)
        log.info("matrix: %d events fetched back in %s (a gap since the last sync)", fetched,
                 room_id)  # fmt: skip
        return [event for page in reversed(pages) for event in reversed(page)]

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
        for user_id in self.trusted:
            for device in self.client.device_store.active_user_devices(user_id):
                if not device.verified:
                    self.client.verify_device(device)
