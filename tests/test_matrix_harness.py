"""The Matrix harness (tests/matrix_server.py): two matrix-nio clients on a real Synapse.

"alice" acts as a person in Element would: she opens a direct chat that is encrypted
from its first event (``m.room.encryption`` in the creation's initial state, as Element
does for DMs) and invites "bot"; bot joins; both write, each reads the other's text
decrypted; alice reacts to bot's message (``m.reaction``, ``m.annotation``) and bot
sees it. What E2EE took with matrix-nio 0.26 (vodozemac):

- each client has its own key store (``store_path``, a SQLite file per user and
  device) and is logged in with ``restore_login`` (the account and device the admin
  API registered), which creates the device's identity keys in that store;
- after every sync: upload keys when ``should_upload_keys``, query the other users'
  devices when ``should_query_keys``, claim one-time keys when ``should_claim_keys``,
  and send queued to-device messages (``sync_forever`` does the same; these tests
  sync step by step so that every wait is bounded);
- before writing into the room, the writer marks the other user's devices verified
  (``verify_device``): nothing else bypasses verification, short of
  ``ignore_unverified_devices=True`` on each send.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote
from uuid import uuid4

import pytest
from nio import (
    Api,
    AsyncClient,
    AsyncClientConfig,
    Event,
    InviteMemberEvent,
    MatrixRoom,
    ReactionEvent,
    RoomCreateResponse,
    RoomMessageText,
    RoomPreset,
    RoomSendError,
    RoomSendResponse,
    SyncResponse,
)

from tests.matrix_server import Synapse, start_synapse, unique
from tests.waiting import eventually

T = TypeVar("T")
MEGOLM = "m.megolm.v1.aes-sha2"


class Person:
    """A matrix-nio client with E2EE and what it has seen, synced step by step."""

    def __init__(
        self, synapse: Synapse, name: str, store: Path, *, max_limit_exceeded: int | None = None
    ) -> None:
        password = secrets.token_urlsafe(12)
        account = synapse.register(unique(name), password)
        store.mkdir(parents=True, exist_ok=True)
        self.client = AsyncClient(
            synapse.url,
            account.user_id,
            store_path=str(store),
            config=AsyncClientConfig(
                encryption_enabled=True,
                store_sync_tokens=True,
                # None (nio's default): on M_LIMIT_EXCEEDED, sleep retry_after_ms and
                # send again, for ever; a number: give up after that many and answer
                # the error.
                max_limit_exceeded=max_limit_exceeded,
            ),
        )
        self.client.restore_login(account.user_id, account.device_id, account.access_token)
        self.user_id = account.user_id
        self.seen: list[tuple[MatrixRoom, Event]] = []
        self.invites: list[str] = []
        self.client.add_event_callback(self._on_event, Event)
        self.client.add_event_callback(self._on_invite, InviteMemberEvent)

    async def _on_event(self, room: MatrixRoom, event: Event) -> None:
        self.seen.append((room, event))

    async def _on_invite(self, room: MatrixRoom, event: InviteMemberEvent) -> None:
        if event.state_key == self.user_id and event.membership == "invite":
            self.invites.append(room.room_id)

    async def step(self) -> None:
        """One sync (long-polls at most 0.5 s), then the key work it calls for."""
        client = self.client
        answer = await client.sync(timeout=500, full_state=client.next_batch is None)
        assert isinstance(answer, SyncResponse), answer
        if client.should_upload_keys:
            await client.keys_upload()
        if client.should_query_keys:
            await client.keys_query()
        if client.should_claim_keys:
            await client.keys_claim(client.get_users_for_key_claiming())
        await client.send_to_device_messages()

    async def until(self, found: Callable[[], T], what: str, timeout: float = 30) -> T:
        """Sync until ``found()`` gives something truthy; fail after ``timeout`` seconds."""

        async def look() -> T:
            answer = found()
            if answer:
                return answer
            await self.step()
            return found()

        return await eventually(look, timeout, what=lambda: f"{what}; seen: {self.seen}")

    def trust(self, other: Person) -> None:
        """Mark every device of ``other`` known to this client as verified."""
        devices = list(self.client.device_store.active_user_devices(other.user_id))
        assert devices, f"{self.user_id} knows no device of {other.user_id}"
        for device in devices:
            self.client.verify_device(device)

    def texts(self, room_id: str, sender: str) -> list[RoomMessageText]:
        return [
            event
            for room, event in self.seen
            if room.room_id == room_id
            and isinstance(event, RoomMessageText)
            and event.sender == sender
        ]


@pytest.fixture
async def people(synapse: Synapse, tmp_path: Path) -> AsyncIterator[tuple[Person, Person]]:
    alice = Person(synapse, "alice", tmp_path / "alice")
    bot = Person(synapse, "bot", tmp_path / "bot")
    try:
        for person in (alice, bot):
            await person.step()  # first sync, identity and one-time keys uploaded
            assert not person.client.should_upload_keys
        yield alice, bot
    finally:
        for person in (alice, bot):
            await person.client.close()


async def send(person: Person, room_id: str, kind: str, content: dict[str, Any]) -> str:
    answer = await person.client.room_send(room_id, kind, content)
    assert isinstance(answer, RoomSendResponse), answer
    event_id: str = answer.event_id
    return event_id


async def test_encrypted_direct_chat_between_two_clients(
    people: tuple[Person, Person],
) -> None:
    alice, bot = people
    created = await alice.client.room_create(
        is_direct=True,
        preset=RoomPreset.trusted_private_chat,
        invite=[bot.user_id],
        initial_state=[
            {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": MEGOLM}}
        ],
    )
    assert isinstance(created, RoomCreateResponse), created
    room_id = created.room_id

    await bot.until(lambda: room_id in bot.invites, "bot invited")
    joined = await bot.client.join(room_id)
    assert getattr(joined, "room_id", None) == room_id, joined
    await bot.step()
    assert bot.client.rooms[room_id].encrypted

    # alice sees bot in the room and knows its device: she trusts it and writes.
    def bot_joined() -> bool:
        room = alice.client.rooms.get(room_id)
        return room is not None and bot.user_id in room.users

    await alice.until(bot_joined, "alice sees bot joined")
    await alice.until(
        lambda: list(alice.client.device_store.active_user_devices(bot.user_id)),
        "alice knows bot's device",
    )
    alice.trust(bot)
    hello = await send(
        alice, room_id, "m.room.message", {"msgtype": "m.text", "body": "hello, bot 🔐"}
    )
    # What the homeserver holds is ciphertext only.
    stored = raw_event(alice, room_id, hello)
    assert stored["type"] == "m.room.encrypted", stored
    assert stored["content"]["algorithm"] == MEGOLM
    assert "hello" not in json.dumps(stored)

    got = await bot.until(lambda: bot.texts(room_id, alice.user_id), "bot reads alice")
    assert [event.body for event in got] == ["hello, bot 🔐"]
    assert got[0].decrypted, "the message was not end-to-end encrypted"

    # bot answers, encrypted for alice's device.
    await bot.until(
        lambda: list(bot.client.device_store.active_user_devices(alice.user_id)),
        "bot knows alice's device",
    )
    bot.trust(alice)
    reply_id = await send(bot, room_id, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    answer = await alice.until(lambda: alice.texts(room_id, bot.user_id), "alice reads bot")
    assert [event.body for event in answer] == ["hi"]
    assert answer[0].decrypted

    # alice reacts to bot's message, as to an approval prompt: once as Element does
    # (encrypted, ``m.relates_to`` copied to the clear), once as matrix-nio's room_send
    # does (it sends m.reaction in the clear even in an encrypted room).
    elements = await send_encrypted(alice, room_id, "m.reaction", annotation(reply_id, "✅"))
    nios = await send(alice, room_id, "m.reaction", annotation(reply_id, "⏱"))

    def reactions() -> list[ReactionEvent]:
        found = [
            event
            for room, event in bot.seen
            if room.room_id == room_id and isinstance(event, ReactionEvent)
        ]
        return found if len(found) == 2 else []

    seen = await bot.until(reactions, "bot sees alice's two reactions")
    assert [(r.event_id, r.sender, r.reacts_to, r.key, r.decrypted) for r in seen] == [
        (elements, alice.user_id, reply_id, "✅", True),
        (nios, alice.user_id, reply_id, "⏱", False),
    ]


def raw_event(person: Person, room_id: str, event_id: str) -> dict[str, Any]:
    """The event as the homeserver serves it (no client-side decryption)."""
    path = f"/_matrix/client/v3/rooms/{quote(room_id)}/event/{quote(event_id)}"
    request = urllib.request.Request(
        person.client.homeserver + path,
        headers={"Authorization": f"Bearer {person.client.access_token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        event: dict[str, Any] = json.load(response)
    return event


def annotation(event_id: str, key: str) -> dict[str, Any]:
    return {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}}


async def send_encrypted(person: Person, room_id: str, kind: str, content: dict[str, Any]) -> str:
    """Send an event of any type Megolm-encrypted, as Element does (room_send would
    send an m.reaction in the clear). The room's group session is shared already."""
    client = person.client
    assert client.access_token
    encrypted_type, encrypted = client.encrypt(room_id, kind, content)
    method, path, data = Api.room_send(
        client.access_token, room_id, encrypted_type, encrypted, uuid4()
    )
    response = await client.send(method, path, data)
    body = await response.json()
    assert response.status == 200, body
    event_id: str = body["event_id"]
    return event_id


@pytest.fixture(scope="module")
def strict_synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    """A second homeserver whose rc_message allows a burst of 3, then one message
    every 1000 s."""
    limits = {"rc_message": {"per_second": 0.001, "burst_count": 3}}
    with start_synapse(tmp_path_factory.mktemp("strict"), rate_limits=limits) as server:
        yield server


async def test_a_strict_rc_message_answers_m_limit_exceeded(
    strict_synapse: Synapse, tmp_path: Path
) -> None:
    person = Person(strict_synapse, "burst", tmp_path / "burst", max_limit_exceeded=0)
    try:
        created = await person.client.room_create()
        assert isinstance(created, RoomCreateResponse), created
        await person.until(lambda: created.room_id in person.client.rooms, "the room synced")
        answers = []
        for n in range(6):
            answer = await person.client.room_send(
                created.room_id, "m.room.message", {"msgtype": "m.text", "body": f"{n}"}
            )
            answers.append(answer)
            if isinstance(answer, RoomSendError):
                break
    finally:
        await person.client.close()
    refused = answers[-1]
    assert isinstance(refused, RoomSendError), answers
    assert refused.status_code == "M_LIMIT_EXCEEDED", refused
    assert refused.retry_after_ms and refused.retry_after_ms > 0, refused
    assert all(isinstance(answer, RoomSendResponse) for answer in answers[:-1]), answers
