"""People on a Matrix homeserver for the channel's tests: matrix-nio clients with E2EE
acting as a person in Element does (tests/test_matrix_harness.py shows what E2EE took),
synced in the background while a test runs, plus raw Client-Server API calls the tests
check the channel with."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode
from uuid import uuid4

from nio import RoomCreateResponse, RoomMessageNotice, RoomMessageText, RoomPreset, RoomSendResponse

from tests.matrix_server import Registered, Synapse
from tests.test_matrix_harness import MEGOLM, annotation, send_encrypted
from tests.test_matrix_harness import Person as HarnessPerson


class Person(HarnessPerson):
    """A person in Element: says things, reacts, reads what the bot sent."""

    def __init__(self, synapse: Synapse, name: str, store: Any) -> None:
        super().__init__(synapse, name, store)

    @contextlib.asynccontextmanager
    async def syncing(self) -> AsyncIterator[None]:
        """Sync in the background (one long poll of at most 0.5 s after another)."""

        async def loop() -> None:
            while True:
                try:
                    await self.step()
                except AssertionError:  # a failed sync: the next one tries again
                    await asyncio.sleep(0.2)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def say(self, room_id: str, text: str, **extra: Any) -> str:
        content = {"msgtype": "m.text", "body": text, **extra}
        answer = await self.client.room_send(
            room_id, "m.room.message", content, ignore_unverified_devices=True
        )
        assert isinstance(answer, RoomSendResponse), answer
        event_id: str = answer.event_id
        return event_id

    async def react(self, room_id: str, event_id: str, key: str, *, encrypted: bool) -> str:
        """As Element does (encrypted), or as nio's room_send does (in the clear)."""
        if encrypted:
            return await send_encrypted(self, room_id, "m.reaction", annotation(event_id, key))
        answer = await self.client.room_send(
            room_id, "m.reaction", annotation(event_id, key), ignore_unverified_devices=True
        )
        assert isinstance(answer, RoomSendResponse), answer
        sent: str = answer.event_id
        return sent

    def received_events(self, room_id: str, sender: str) -> list[tuple[str, str]]:
        """(event ID, body) of the messages and notices ``sender`` sent, edits left out."""
        return [(event.event_id, event.body) for event in self._messages(room_id, sender)]

    def received_contents(self, room_id: str, sender: str) -> list[dict[str, Any]]:
        """The contents of the messages and notices ``sender`` sent, edits left out."""
        return [dict(event.source.get("content", {})) for event in self._messages(room_id, sender)]

    def _messages(self, room_id: str, sender: str) -> list[Any]:
        found = []
        for room, event in self.seen:
            if room.room_id != room_id or getattr(event, "sender", None) != sender:
                continue
            if not isinstance(event, RoomMessageText | RoomMessageNotice):
                continue
            relation = event.source.get("content", {}).get("m.relates_to") or {}
            if relation.get("rel_type") == "m.replace":
                continue
            found.append(event)
        return found

    def received(self, room_id: str, sender: str) -> list[str]:
        return [body for _, body in self.received_events(room_id, sender)]


async def open_room(owner: Person, invite: list[str]) -> str:
    """An encrypted room as Element makes a direct chat, ``invite`` invited."""
    created = await owner.client.room_create(
        is_direct=True,
        preset=RoomPreset.trusted_private_chat,
        invite=invite,
        initial_state=[
            {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": MEGOLM}}
        ],
    )
    assert isinstance(created, RoomCreateResponse), created
    room_id: str = created.room_id
    return room_id


def _call(method: str, url: str, token: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def sync_returns(base: str, token: str, since: str, event_id: str) -> bool:
    """Whether a /sync from ``since`` (as ``token``'s device) returns ``event_id``."""
    query = urlencode({"since": since, "timeout": 0})
    answer = _call("GET", f"{base}/_matrix/client/v3/sync?{query}", token)
    for room in answer.get("rooms", {}).get("join", {}).values():
        for event in room.get("timeline", {}).get("events", []):
            if event.get("event_id") == event_id:
                return True
    return False


def send_as(base: str, token: str, room_id: str, text: str) -> None:
    path = f"/_matrix/client/v3/rooms/{quote(room_id)}/send/m.room.message/{uuid4().hex}"
    _call("PUT", base + path, token, {"msgtype": "m.notice", "body": text})


def use_up_messages(base: str, account: Registered, most: int = 100) -> int:
    """Send messages as ``account`` (into a room of its own: rc_message counts per
    user) until the homeserver refuses one (M_LIMIT_EXCEEDED): its burst is used up, so
    its next message is refused too, until one more is allowed ``1 /
    rc_message.per_second`` later. How many were sent."""
    room_id = _call("POST", f"{base}/_matrix/client/v3/createRoom", account.access_token, {})[
        "room_id"
    ]
    for sent in range(most):
        try:
            send_as(base, account.access_token, room_id, "(filler)")
        except urllib.error.HTTPError as exc:
            assert exc.code == 429, exc
            return sent
    raise AssertionError(f"{most} messages sent and none refused: is rc_message strict?")
