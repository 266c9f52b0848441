"""Sending: how Matrix posts, edits (``m.replace``) and redacts one event, for the
core's ``ChatSends`` (replies in parts through the core's pipeline with Matrix's
renderer, each part once; a reply shown while it is written, then taking its place), and
what is Matrix's own: approval prompts, files (uploaded by media.py), per-room pacing
and ``M_LIMIT_EXCEEDED``.

In an encrypted room nio encrypts what ``room_send`` sends; it is sent with
``ignore_unverified_devices=True``: the bot trusts allowed users' devices on first use
(sync.py) and would otherwise refuse to send to a device it has not seen verified yet
(a member's new phone), failing the reply; the keys are still shared only with the
room's members' devices.

The client gives up at the first ``M_LIMIT_EXCEEDED`` (``max_limit_exceeded=0``):
a short wait (``retry_after_ms`` up to RETRY_WAIT_MAX) is waited out here and the send
tried again, up to RETRIES times; a longer one is raised as ``ChannelError(retry_after=…)``
for the delivery worker to pace.

A homeserver counts an edit as a message (Synapse's ``rc_message``), so a preview's text
goes only from spare budget (``has_spare``: none while the room's or the account's sends
wait, a send in progress or a recent ``M_LIMIT_EXCEEDED``), tried once; nothing is
shown before the first sync (rooms unknown) or on a daemon that does not sync.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nio import AsyncClient, RoomSendError, RoomSendResponse

from echo_bot.bus import ChannelEdge, ChannelHost, ChannelLink
from echo_bot.chat_sends import ChatSends
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundMessage, Receipt
from echo_bot.pacing import Pacer
from echo_bot.preview_ledger import PreviewLedger
from echo_bot.prompt_answers import prompt_text
from echo_bot.rate_limits import RateLimited, within_limits
from echo_bot.richtext import parts as richtext

from .common import Tasks, log
from .formatting import TEXT, MatrixText, replacement
from .media import upload

EDIT_INTERVAL = 3.0  # seconds between two texts of one preview
FIRST_SYNC_WAIT = 30.0  # seconds a send waits for the first sync (the rooms' state)

RETRIES = 3
RETRY_WAIT_MAX = 10.0  # seconds; a longer wait goes back to the delivery worker
RETRY_MARGIN = 0.1  # seconds after retry_after_ms
ROOM_INTERVAL = 0.1  # seconds between two sends to one room


def matrix_pacer() -> Pacer:
    """Per room: one send per ROOM_INTERVAL, none before the room's limit ends. Per
    account (a homeserver counts a user's messages in every room together, as Synapse's
    ``rc_message`` does, at a rate it does not publish): learned from its refusals."""
    return Pacer((1 / ROOM_INTERVAL, 1.0), learns=RETRY_WAIT_MAX, keep=0.0)


PROMPT = MatrixText(limit=30_000)  # a prompt (or its outcome) is one event, never cut


class Outbound:
    renderer = TEXT  # for ChatSends

    def __init__(
        self,
        host: ChannelHost,
        client: AsyncClient,
        edge: ChannelEdge,
        link: ChannelLink,
        synced: asyncio.Event,
        tasks: Tasks,
    ) -> None:
        self.synced = synced
        self.client = client
        self.edge = edge
        self.link = link
        self.masker = host.masker
        self.pacer = matrix_pacer()
        self._locks: dict[str, asyncio.Lock] = {}  # per room: one send at a time
        self.sends = ChatSends(self, self.masker, tasks, interval=EDIT_INTERVAL,
                               ready=synced.is_set,
                               ledger=PreviewLedger(host, "matrix", tasks))  # fmt: skip
        self.previews = self.sends.previews

    async def send(self, message: OutboundMessage) -> Receipt:
        room_id = message.to.chat_id
        if not self.synced.is_set():  # nio knows no room (nor its members' keys) before
            try:
                async with asyncio.timeout(FIRST_SYNC_WAIT):
                    await self.synced.wait()
            except TimeoutError:
                raise ChannelError("not synced with the homeserver yet") from None
        async with self._lock(room_id):
            return await self.sends.send(
                message, edit=lambda event_id: self._edit(room_id, event_id, message),
                prompt=lambda: self._prompt(room_id, message),
                upload=lambda _: self._upload(message),
            )  # fmt: skip

    # -- one event, for ChatSends ---------------------------------------------------------
    async def post(
        self, to: Address, part: dict[str, Any], key: str, *, quote: str | None = None,
        notice: bool = False, spare: bool = False,
    ) -> str:  # fmt: skip
        content = {**part, "msgtype": "m.notice"} if notice else dict(part)
        if quote and quote.startswith("$"):
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": quote}}
        return await self._send_event(to.chat_id, content, key, spare)

    async def edit(
        self, to: Address, message_id: str, part: dict[str, Any], key: str, *, spare: bool = False
    ) -> None:
        await self._send_event(to.chat_id, replacement(message_id, part), key, spare)

    async def remove(self, to: Address, message_id: str) -> None:
        await self.client.room_redact(to.chat_id, message_id, reason="a preview of a reply")

    def has_spare(self, to: Address, editing: bool) -> bool:
        """Nothing waits for the room (no send of its own in progress) and the pacer
        has budget to spare (none after a recent ``M_LIMIT_EXCEEDED``)."""
        return not self._lock(to.chat_id).locked() and self.pacer.spare(to.chat_id) == 0.0

    def _lock(self, room_id: str) -> asyncio.Lock:
        return self._locks.setdefault(room_id, asyncio.Lock())

    async def _send_event(
        self, room_id: str, content: dict[str, Any], key: str, spare: bool
    ) -> str:
        """A send within ``send`` (the room's lock held), or a preview's: from spare
        budget (counted by ``has_spare``), taking the lock, tried once (a refusal is
        raised at once)."""
        if not spare:
            return await self._room_send(room_id, content, key)
        async with self._lock(room_id):
            return await self._room_send(room_id, content, key, retries=0, paced=False)

    # -- what is Matrix's own -------------------------------------------------------------
    async def _upload(self, message: OutboundMessage) -> str:
        """A file (``send_file``) uploaded, then sent as ``m.image`` or ``m.file``; its
        text follows in messages of its own (clients show a file's caption poorly)."""
        assert message.file is not None
        room = self.client.rooms.get(message.to.chat_id)
        body = self.masker.mask(message.file.name)
        content = await upload(self.client, message.file, body=body,
                               encrypt=bool(room is not None and room.encrypted))  # fmt: skip
        return await self._room_send(message.to.chat_id, content, f"{message.id}.file")

    async def _prompt(self, room_id: str, message: OutboundMessage) -> Receipt:
        """The gate's rendering as it is (escaped in the HTML), and how to answer; its
        event ID → actions kept in the store before the receipt is returned."""
        content = richtext.message_parts(prompt_text(message), False, self.masker, PROMPT)[0]
        event_id = await self._room_send(room_id, content, message.id)
        await self.edge.keep_prompt(event_id, message)
        return Receipt(channel_message_id=event_id)

    async def _edit(self, room_id: str, event_id: str, message: OutboundMessage) -> Receipt:
        """An ``m.replace`` of an earlier event (an approval prompt showing its outcome)."""
        new = richtext.message_parts(message.text, False, self.masker, PROMPT)[0]
        try:
            await self._room_send(room_id, replacement(event_id, new), message.id)
        except ChannelError as exc:
            if exc.retryable:
                raise
            log.info("matrix: edit of %s in %s refused: %s", event_id, room_id, exc)
        return Receipt(channel_message_id=event_id)

    async def _room_send(
        self, room_id: str, content: dict[str, Any], tx_id: str, *, retries: int = RETRIES,
        paced: bool = True,
    ) -> str:  # fmt: skip
        """Send one event; ``tx_id`` (the outbound's id) is the same for every try, also
        the delivery worker's: the homeserver answers a repeat with the event it made
        the first time (for this device's token), so a send in flight at a kill is not
        repeated either."""

        # Mentions no one: else clients fall back to matching the body, and "@room" or a
        # member's name the model wrote would notify them.
        content = {**content, "m.mentions": {}}
        if "m.new_content" in content:
            content["m.new_content"] = {**content["m.new_content"], "m.mentions": {}}

        async def once(tried: int) -> str:
            if paced or tried:
                await self.pacer.wait(room_id)
            try:
                answer = await self.client.room_send(
                    room_id, "m.room.message", content, tx_id=tx_id,
                    ignore_unverified_devices=True,
                )  # fmt: skip
            except (OSError, TimeoutError) as exc:
                raise ChannelError(f"network error: {exc}") from None
            except Exception as exc:  # nio's LocalProtocolError & co: the room is not ready
                raise ChannelError(f"cannot send to {room_id}: {exc}") from None
            if isinstance(answer, RoomSendResponse):
                self.pacer.sent()
                event_id: str = answer.event_id
                return event_id
            assert isinstance(answer, RoomSendError)
            if answer.status_code == "M_LIMIT_EXCEEDED":
                # Synapse rounds retry_after_ms down: a little later, or it is refused again.
                raise RateLimited((answer.retry_after_ms or 1000) / 1000 + RETRY_MARGIN)
            retryable = answer.status_code in (None, "M_UNKNOWN") or str(
                answer.transport_response.status if answer.transport_response else ""
            ).startswith("5")
            raise ChannelError(f"send refused: {answer.status_code} {answer.message}",
                               retryable=retryable)  # fmt: skip

        return await within_limits(
            once, link=self.link, what=f"matrix: sending in {room_id}", retries=retries,
            wait_max=RETRY_WAIT_MAX, held=lambda wait: self.pacer.hold(room_id, wait),
        )  # fmt: skip
