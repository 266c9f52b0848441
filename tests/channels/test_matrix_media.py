"""Files and images both ways in the Matrix channel, against a real Synapse, in an
encrypted room as Element makes one (the ``Chat`` of test_matrix.py).

The person is a matrix-nio client: it uploads files as Element does (encrypted, then an
``m.image`` / ``m.file`` with ``file``), and downloads and decrypts what the bot sends.
The bot's brain answers a message with files as an offline brain does (where each file
is saved, or why it is not) and otherwise as the contract's brain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from nio import (
    DownloadError,
    RoomCreateResponse,
    RoomEncryptedMedia,
    RoomMessageFile,
    RoomMessageMedia,
    RoomSendResponse,
    UploadResponse,
)
from nio.crypto.attachments import decrypt_attachment

from channels.matrix.media import read_media
from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.brains.rules import files_reply
from echo_bot.config import channel_section, parse_config
from echo_bot.conversation import ChatMessage
from echo_bot.errors import ChannelError
from echo_bot.events import Address, MediaKind, OutboundFile, OutboundMessage
from echo_bot.tools.base import Tool
from tests.channels.contract.drivers import SAY, TOOLS, ContractBrain
from tests.channels.test_matrix import Chat, send_raw
from tests.conftest import Bot, running_bot
from tests.matrix_people import Person
from tests.matrix_server import Synapse, start_synapse
from tests.test_matrix_harness import raw_event
from tests.waiting import eventually

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 20  # ~5 KB that starts like a PNG
REPORT = b"quarterly numbers: 42\n" * 10


class FilesBrain(ContractBrain):
    """A message with files: where each is (as the offline brain says it); a message
    without, whose text asks nothing of the contract's brain: ``heard: TEXT``."""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "user" and last.files:
            return BrainReply(text=files_reply(last.files), route_reason="test: files")
        if last.role == "user" and not SAY.search(last.content or ""):
            return BrainReply(text=f"heard: {last.content}", route_reason="test: heard")
        return await super().step(conversation, tools, context)


class MediaChat(Chat):
    """The encrypted chat, with ``[matrix]`` keys of the test's own (``matrix``)."""

    def __init__(self, state_dir: Path, synapse: Synapse) -> None:
        super().__init__(state_dir, synapse)
        self.brain = FilesBrain()
        self.matrix = ""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        owner, friend = self.people
        config = f"""
[matrix]
enabled = true
homeserver = "{self.server.url}"
user_id = "{self.account.user_id}"
allowed_users = ["{owner.user_id}", "{friend.user_id}"]
approvers = ["{owner.user_id}"]
{self.matrix}
{TOOLS}"""
        async with running_bot(
            self.state_dir,
            config,
            environ={"MATRIX_ACCESS_TOKEN": self.account.access_token},
            channels=["matrix"],
            channel_options={"matrix": {"sync_timeout": 1}},
            brain=self.brain,
        ) as bot:
            self.bot = bot
            yield bot

    async def send_file(self, content: dict[str, Any]) -> str:
        """An ``m.room.message`` as the owner's client sends it (encrypted)."""
        await self._ready()
        answer = await self.owner.client.room_send(
            self.room_id, "m.room.message", content, ignore_unverified_devices=True
        )
        assert isinstance(answer, RoomSendResponse), answer
        return str(answer.event_id)

    def saved(self) -> list[Path]:
        inbox = self.state_dir / "workspace" / "inbox"
        return sorted(p for p in inbox.rglob("*") if p.is_file()) if inbox.exists() else []


@pytest.fixture
async def chat(synapse: Synapse, state_dir: Path) -> AsyncIterator[MediaChat]:
    made = MediaChat(state_dir, synapse)
    async with made.peer():
        yield made


async def upload(person: Person, data: bytes, *, encrypt: bool) -> tuple[str, dict[str, Any]]:
    """``data`` in the media repository as the person's client puts it: its mxc:// URL
    and, encrypted, the decryption info an event's ``file`` carries."""
    answer, keys = await person.client.upload(
        lambda _limited, _timeouts: data, content_type="application/octet-stream",
        filename="upload", encrypt=encrypt, filesize=len(data),
    )  # fmt: skip
    assert isinstance(answer, UploadResponse), answer
    return answer.content_uri, dict(keys or {})


async def encrypted_file(person: Person, data: bytes) -> dict[str, Any]:
    url, keys = await upload(person, data, encrypt=True)
    return {**keys, "url": url}


def image(file: dict[str, Any], name: str = "cat.png", size: int | None = None) -> dict[str, Any]:
    info = {"mimetype": "image/png", "size": len(PNG) if size is None else size}
    return {"msgtype": "m.image", "body": name, "file": file, "info": info}


# -- in --------------------------------------------------------------------------------------
async def test_an_encrypted_image_is_saved_decrypted_in_the_senders_inbox(
    chat: MediaChat,
) -> None:
    async with chat.running():
        file = await encrypted_file(chat.owner, PNG)
        await chat.send_file(image(file))
        got = await chat.wait_received("Your photo is saved in the workspace as inbox/matrix-")
        [saved] = chat.saved()
        assert saved.read_bytes() == PNG
        relative = saved.relative_to(chat.state_dir / "workspace").as_posix()
        assert any(relative in text and "image/png" in text for text in got), got
        folder = saved.relative_to(chat.state_dir / "workspace" / "inbox").parts[0]
        assert folder.startswith("matrix-") and "localhost" in folder
        # The homeserver held ciphertext only.
        download = await chat.owner.client.download(mxc=file["url"])
        assert not isinstance(download, DownloadError) and download.body != PNG
        await chat.say("say:after")
        await chat.wait_received("echo: after")


async def test_a_clear_file_with_a_caption_arrives_with_its_caption_as_the_text(
    chat: MediaChat,
) -> None:
    async with chat.running():
        url, _ = await upload(chat.owner, REPORT, encrypt=False)
        await chat._ready()
        content = {"msgtype": "m.file", "body": "keep this for me", "filename": "report.txt",
                   "url": url, "info": {"mimetype": "text/plain", "size": len(REPORT)}}  # fmt: skip
        # In the clear (as a client that does not encrypt sends it, nio parses it as a
        # RoomMessageFile) in the encrypted room.
        await asyncio.to_thread(send_raw, chat.owner, chat.room_id, "m.room.message", content)
        await chat.wait_received("Your document is saved in the workspace as inbox/")
        [saved] = chat.saved()
        assert saved.name.endswith("-1-report.txt") and saved.read_bytes() == REPORT
        assert "keep this for me" in await chat.inbound_texts()


async def test_a_file_announced_over_max_download_is_refused_before_its_download(
    chat: MediaChat,
) -> None:
    chat.matrix = 'max_download = "2KB"'
    async with chat.running():
        # Small bytes, announced large: refused by the announcement alone.
        file = await encrypted_file(chat.owner, b"tiny")
        await chat.send_file(image(file, "big.png", size=5000))
        got = await chat.wait_received("I could not download your photo")
        told = next(t for t in got if "could not download" in t)
        assert "'big.png'" in told
        assert "it is 5.0 KB, over the 2.0 KB download limit ([matrix] max_download)" in told
        assert chat.saved() == []


async def test_a_file_larger_than_announced_is_refused_and_leaves_no_partial_file(
    chat: MediaChat,
) -> None:
    chat.matrix = 'max_download = "2KB"'
    async with chat.running():
        file = await encrypted_file(chat.owner, PNG)
        await chat.send_file(image(file, "small.png", size=100))  # announced small: a lie
        got = await chat.wait_received("I could not download your photo")
        told = next(t for t in got if "could not download" in t)
        assert "over the 2.0 KB download limit ([matrix] max_download)" in told
        assert chat.saved() == []  # no .part either: every file of the inbox is listed


async def test_an_encrypted_file_whose_hash_does_not_match_is_refused(chat: MediaChat) -> None:
    async with chat.running():
        file = await encrypted_file(chat.owner, PNG)
        other = await encrypted_file(chat.owner, b"something else entirely")
        file["hashes"] = other["hashes"]  # a valid hash, of other bytes
        await chat.send_file(image(file, "tampered.png"))
        got = await chat.wait_received("I could not download your photo")
        told = next(t for t in got if "could not download" in t)
        assert "could not be decrypted" in told and "'tampered.png'" in told
        assert chat.saved() == []


async def test_hostile_media_events_get_a_clear_answer_and_the_chat_goes_on(
    chat: MediaChat,
) -> None:
    async with chat.running():
        url, _ = await upload(chat.owner, REPORT, encrypt=False)
        good = await encrypted_file(chat.owner, REPORT)
        weird_name = "\x00\x01\x1b[31m" + "n" * 10_000 + "\u202e.txt"
        cases: list[tuple[dict[str, Any], str]] = [
            ({"msgtype": "m.image", "body": "no-url.png"},
             "[photo not downloaded: 'no-url.png' — it names no file on a homeserver"),
            ({"msgtype": "m.file", "body": "web.txt", "url": "http://evil.example/x"},
             "[document not downloaded: 'web.txt' — it names no file on a homeserver"),
            ({"msgtype": "m.file", "body": "num.txt", "url": 42},
             "[document not downloaded: 'num.txt' — it names no file on a homeserver"),
            ({"msgtype": "m.file", "body": "path.txt", "url": "mxc://localhost/../../etc"},
             "[document not downloaded: 'path.txt' — it names no file on a homeserver"),
            ({"msgtype": "m.video", "body": "keyless.mp4",
              "file": {"url": good["url"], "iv": good["iv"]}},
             "[video not downloaded: 'keyless.mp4' — its decryption info is malformed]"),
        ]  # fmt: skip
        for content, note in cases:
            await chat.send_file(content)
            await chat.wait_received(f"heard: {note}")
        # A file that is not there; a name of control characters, 10 000 long.
        await chat.send_file({"msgtype": "m.file", "body": "gone.txt",
                              "url": "mxc://localhost/nosuchmediaid"})  # fmt: skip
        got = await chat.wait_received("I could not download your document")
        assert any("no such file" in t and "'gone.txt'" in t for t in got), got
        info = {"size": -5, "mimetype": "text/\x00plain" + "x" * 500}
        await chat.send_file({"msgtype": "m.file", "body": weird_name, "url": url, "info": info})
        await chat.wait_received("Your document is saved in the workspace as inbox/")
        [saved] = chat.saved()
        assert saved.read_bytes() == REPORT
        inbox = (chat.state_dir / "workspace" / "inbox").resolve()
        assert saved.resolve().is_relative_to(inbox) and len(saved.name) <= 100
        await chat.say("say:after")
        await chat.wait_received("echo: after")
        assert chat.bot is not None
        health = next(c for c in chat.bot.daemon.channels if c.name == "matrix").health()
        assert health["status"] == "ok", health


async def test_with_media_off_a_file_is_a_note_and_nothing_is_fetched(chat: MediaChat) -> None:
    chat.matrix = "media = false"
    async with chat.running():
        file = await encrypted_file(chat.owner, PNG)
        await chat.send_file({**image(file), "filename": "cat.png", "body": "look"})
        await chat.wait_received("heard: look\n[photo not downloaded: [matrix] media is off]")
        assert chat.saved() == []


# -- out -------------------------------------------------------------------------------------
def files_from(person: Person, room_id: str, sender: str) -> list[RoomEncryptedMedia]:
    return [e for room, e in person.seen
            if room.room_id == room_id and isinstance(e, RoomEncryptedMedia)
            and e.sender == sender]  # fmt: skip


async def received_bytes(person: Person, event: RoomEncryptedMedia) -> bytes:
    download = await person.client.download(mxc=event.url)
    assert not isinstance(download, DownloadError), download
    assert isinstance(download.body, bytes)
    plain: bytes = decrypt_attachment(download.body, event.key["k"], event.hashes["sha256"],
                                      event.iv)  # fmt: skip
    return plain


async def test_a_file_the_bot_sends_arrives_encrypted_and_whole(chat: MediaChat) -> None:
    workspace = chat.state_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "report.txt").write_bytes(REPORT)
    (workspace / "chart.png").write_bytes(PNG)
    async with chat.running():
        args = {"path": "report.txt", "caption": "the report"}
        await chat.say(f"/tool send_file {json.dumps(args)}")
        # The room holds the friend too, so it is no direct chat to the gate: a workspace
        # file sent there asks, and the owner approves.
        await chat.decide(await chat.prompt(), approve=True)
        await chat.wait_received("the report", "Sent report.txt")
        await chat.say('/tool send_file {"path": "chart.png"}')
        await chat.decide(await chat.prompt(), approve=True)
        await chat.wait_received("Sent chart.png")

        def two() -> list[RoomEncryptedMedia] | None:
            found = files_from(chat.owner, chat.room_id, chat.bot_id)
            return found if len(found) >= 2 else None

        found = await eventually(two, timeout=15, what="two files from the bot")
        assert found is not None
        report, chart = found[:2]
        assert report.source["content"]["msgtype"] == "m.file" and report.body == "report.txt"
        assert report.source["content"]["info"] == {"mimetype": "text/plain", "size": len(REPORT)}
        assert await received_bytes(chat.owner, report) == REPORT
        assert chart.source["content"]["msgtype"] == "m.image" and chart.body == "chart.png"
        assert await received_bytes(chat.owner, chart) == PNG
        # The homeserver held ciphertext only: the event and the file.
        stored = await asyncio.to_thread(raw_event, chat.owner, chat.room_id, report.event_id)
        assert stored["type"] == "m.room.encrypted"
        download = await chat.owner.client.download(mxc=report.url)
        assert not isinstance(download, DownloadError) and download.body != REPORT
        assert download.filename in (None, "file")  # nor its name, which the event holds
        # The caption came after the file.
        texts = chat.owner.received_events(chat.room_id, chat.bot_id)
        caption = next(e for e, body in texts if body == "the report")
        order = [e.event_id for _room, e in chat.owner.seen]
        assert order.index(report.event_id) < order.index(caption)
    assert list((chat.state_dir / "outgoing").iterdir()) == []  # the copies are gone


async def test_files_both_ways_in_a_room_without_encryption(chat: MediaChat) -> None:
    owner = chat.owner
    (chat.state_dir / "workspace").mkdir(parents=True, exist_ok=True)
    (chat.state_dir / "workspace" / "chart.png").write_bytes(PNG)
    async with chat.running():
        created = await owner.client.room_create(invite=[chat.bot_id])  # no encryption
        assert isinstance(created, RoomCreateResponse), created
        room_id = created.room_id

        def joined() -> bool:
            room = owner.client.rooms.get(room_id)
            return bool(room and chat.bot_id in room.users and not room.encrypted)

        await eventually(joined, timeout=30, what="the bot in the room without encryption")
        url, _ = await upload(owner, REPORT, encrypt=False)
        content = {"msgtype": "m.file", "body": "report.txt", "url": url,
                   "info": {"mimetype": "text/plain", "size": len(REPORT)}}  # fmt: skip
        answer = await owner.client.room_send(room_id, "m.room.message", content)
        assert isinstance(answer, RoomSendResponse), answer

        def said(text: str) -> bool:
            return any(text in t for t in owner.received(room_id, chat.bot_id))

        await eventually(lambda: said("Your document is saved"), timeout=15, what="file taken")
        [saved] = chat.saved()
        assert saved.read_bytes() == REPORT

        # The room holds the owner and the bot alone (invite only): the owner's direct
        # chat, where a workspace file is sent unasked (test_matrix_direct.py).
        await owner.say(room_id, '/tool send_file {"path": "chart.png"}')

        def sent() -> RoomMessageFile | None:
            return next((e for room, e in owner.seen if room.room_id == room_id
                         and e.sender == chat.bot_id and isinstance(e, RoomMessageMedia)),
                        None)  # fmt: skip

        event: Any = await eventually(sent, timeout=15, what="the image in the clear")
        assert event.source["content"]["url"].startswith("mxc://")
        assert "file" not in event.source["content"]
        download = await owner.client.download(mxc=event.source["content"]["url"])
        assert not isinstance(download, DownloadError) and download.body == PNG


@pytest.fixture(scope="module")
def small_uploads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    """A homeserver that takes uploads of at most 1 KB."""
    limits = {"max_upload_size": "1K"}  # merged into homeserver.yaml like the limits
    with start_synapse(tmp_path_factory.mktemp("small"), rate_limits=limits) as server:
        yield server


async def test_an_upload_the_homeserver_finds_too_large_is_not_tried_again(
    small_uploads: Synapse, state_dir: Path
) -> None:
    chat = MediaChat(state_dir, small_uploads)
    big = state_dir / "big.bin"
    big.write_bytes(b"b" * 5000)
    async with chat.peer(), chat.running() as bot:
        await chat.say("say:ready")
        await chat.wait_received("echo: ready")
        channel: Any = next(c for c in bot.daemon.channels if c.name == "matrix")
        file = OutboundFile(path=str(big), name="big.bin", size=5000)
        message = OutboundMessage(to=Address(channel="matrix", chat_id=chat.room_id), text="",
                                  file=file)  # fmt: skip
        with pytest.raises(ChannelError, match="M_TOO_LARGE") as raised:
            await channel.send(message)
        assert raised.value.retryable is False


async def test_a_file_gone_before_its_delivery_is_not_tried_again(chat: MediaChat) -> None:
    async with chat.running() as bot:
        await chat.say("say:ready")
        await chat.wait_received("echo: ready")
        channel: Any = next(c for c in bot.daemon.channels if c.name == "matrix")
        gone = OutboundFile(path=str(chat.state_dir / "nowhere.txt"), name="nowhere.txt", size=3)
        message = OutboundMessage(to=Address(channel="matrix", chat_id=chat.room_id), text="",
                                  file=gone)  # fmt: skip
        with pytest.raises(ChannelError, match="gone") as raised:
            await channel.send(message)
        assert raised.value.retryable is False


# -- what an event carries, without a homeserver ------------------------------------------------
def test_media_content_is_read_defensively() -> None:
    config = channel_section(parse_config({"matrix": {"user_id": "@bot:example.org"}}), "matrix")
    info = {"size": True, "duration": 2500, "mimetype": 7}
    audio = {"msgtype": "m.audio", "body": "a\ud800b.ogg", "info": info,
             "url": "mxc://example.org:8448/abc_DEF-1"}  # fmt: skip
    read = read_media("$e", audio, config)
    assert read.attachment is not None and read.caption is None and read.kept is None
    assert read.attachment.kind == MediaKind.AUDIO and read.attachment.duration == 2
    assert read.attachment.size is None and read.attachment.mime_type is None
    assert read.attachment.name == "a\ufffdb.ogg"
    for url in ("mxc://example.org/a/b", "mxc://exa mple.org/x", "mxc:///x",
                "mxc://example.org/" + "x" * 600, "MXC://example.org/x"):  # fmt: skip
        read = read_media("$e", {"msgtype": "m.file", "body": "f", "url": url}, config)
        assert read.attachment is None and read.note and "no valid mxc://" in read.note, url
    long_id = "$" + "e" * 600
    file = {"url": "mxc://example.org/x", "key": {"k": "k"}, "iv": "i", "hashes": {"sha256": "h"}}
    read = read_media(long_id, {"msgtype": "m.file", "body": "f", "file": file}, config)
    assert read.attachment is None and read.note and "too long" in read.note
