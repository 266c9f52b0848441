"""Files in Matrix messages: what a media event carries (read when it arrives, nothing
fetched then), its download from the media repository during the turn (bounded, and
decrypted when it was sent to an encrypted room), and the upload of a file the bot sends.

A plain file's reference (``Attachment.file_ref``) is its ``mxc://`` URL. An encrypted
file also needs its key, IV and hash, more than a reference holds: they are kept in the
store under ``matrix-file:<event ID>`` before the message is published, and the
reference is ``enc:<event ID>``.

A download streams the body (the authenticated media endpoint, through nio's HTTP
session) into a temporary ``.part`` name and stops as soon as it outgrows the limit; an
announced size (the event's ``info.size``, then Content-Length) over it is refused
before a byte is read. An encrypted file is decrypted (and its hash checked) off the
event loop once whole, then renamed into place: there is a whole file or none.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import ClientError
from nio import AsyncClient, UploadError, UploadResponse
from nio.crypto.attachments import decrypt_attachment, encrypted_attachment_generator

from echo_bot.bus import ChannelHost
from echo_bot.downloads import DownloadLimit, fetch_to, save_whole
from echo_bot.errors import ChannelError, MediaUnavailable
from echo_bot.events import Attachment, MediaKind, OutboundFile

from .settings import MatrixConfig

KINDS = {
    "m.image": MediaKind.PHOTO,
    "m.audio": MediaKind.AUDIO,
    "m.video": MediaKind.VIDEO,
    "m.file": MediaKind.DOCUMENT,
}
_WHAT = {MediaKind.PHOTO: "photo", MediaKind.AUDIO: "audio", MediaKind.VIDEO: "video",
         MediaKind.DOCUMENT: "document"}  # fmt: skip
# mxc://<server name>/<media ID>: a host (or [IPv6]) with an optional port, and the
# media ID's characters as the spec allows them.
_MXC = re.compile(r"mxc://([A-Za-z0-9.\-]{1,255}|\[[0-9A-Fa-f:.]{2,45}\])(:[0-9]{1,5})?/"
                  r"([A-Za-z0-9_\-]{1,255})")  # fmt: skip
ENCRYPTED = "enc:"
KEPT = "matrix-file:"
MAX_KEY_FIELD = 256  # characters of a key, IV or hash (base64 of 32 bytes is 43)
UPLOAD_TIMEOUT = 300.0
UPLOAD_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Received:
    """A media event as the inbound takes it: its file (or a note saying why there is
    none), its caption, and the decryption info to keep before it is published."""

    attachment: Attachment | None
    caption: str | None
    note: str | None
    kept: str | None  # JSON: the encrypted file's URL, key, IV and hash


def is_media(content: Any) -> bool:
    return isinstance(content, dict) and content.get("msgtype") in KINDS


def label(value: Any, limit: int = 256) -> str:
    """A name as one clean line: valid Unicode, no control characters, at most ``limit``."""
    if not isinstance(value, str):
        return ""
    text = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return " ".join("".join(c if c >= " " and c != "\x7f" else " " for c in text).split())[:limit]


def valid_mxc(value: Any) -> str | None:
    return value if isinstance(value, str) and _MXC.fullmatch(value) else None


def read_media(event_id: str, content: dict[str, Any], config: MatrixConfig) -> Received:
    """What an ``m.image`` / ``m.file`` / ``m.audio`` / ``m.video`` event carries, from
    its content as sent (nio's own parse refuses some valid ones, e.g. a plain ``url``
    in an encrypted room). ``filename`` other than ``body`` makes ``body`` a caption."""
    kind = KINDS[content["msgtype"]]
    what = _WHAT[kind]
    body, filename = content.get("body"), content.get("filename")
    name = label(filename if isinstance(filename, str) and filename else body)
    caption = None
    if isinstance(filename, str) and filename and isinstance(body, str) and body != filename:
        caption = body
    if not config.media:
        return Received(None, caption, f"[{what} not downloaded: [matrix] media is off]", None)
    given = content.get("info")
    info: dict[str, Any] = given if isinstance(given, dict) else {}
    encrypted = content.get("file")
    kept = None
    if isinstance(encrypted, dict):
        keys = _keys(encrypted)
        if keys is None:
            return Received(None, caption, _bad(what, name, "its decryption info is malformed"),
                            None)  # fmt: skip
        ref, kept = f"{ENCRYPTED}{event_id}", json.dumps(keys)
        mime = info.get("mimetype") or encrypted.get("mimetype")
    else:
        url = valid_mxc(content.get("url"))
        if url is None:
            why = "it names no file on a homeserver (no valid mxc:// URL)"
            return Received(None, caption, _bad(what, name, why), None)
        ref, mime = url, info.get("mimetype")
    if len(ref) > 512:
        return Received(None, caption, _bad(what, name, "its reference is too long"), None)
    duration = _count(info.get("duration"))
    attachment = Attachment(
        kind=kind,
        file_ref=ref,
        name=name or None,
        mime_type=label(mime, 128) or None,
        size=_count(info.get("size")),
        duration=duration // 1000 if duration is not None else None,  # ms in Matrix
    )
    return Received(attachment, caption, None, kept)


def _count(value: Any) -> int | None:
    """A size or duration as announced, if it is one."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53
    return value if ok else None


def _keys(encrypted: dict[str, Any]) -> dict[str, str] | None:
    key, hashes = encrypted.get("key"), encrypted.get("hashes")
    found = {
        "url": valid_mxc(encrypted.get("url")),
        "k": key.get("k") if isinstance(key, dict) else None,
        "iv": encrypted.get("iv"),
        "sha256": hashes.get("sha256") if isinstance(hashes, dict) else None,
    }
    if not all(isinstance(v, str) and 0 < len(v) <= MAX_KEY_FIELD for v in found.values()):
        return None
    return {k: str(v) for k, v in found.items()}


def _bad(what: str, name: str, why: str) -> str:
    shown = f"{name[:80]!r} — " if name else ""
    return f"[{what} not downloaded: {shown}{why}]"


def _decrypt(partial: Path, keys: dict[str, str]) -> int:
    """The downloaded ciphertext in ``partial`` replaced by its plaintext (the hash is
    checked first); the plaintext's size."""
    data = partial.read_bytes()
    try:
        plain: bytes = decrypt_attachment(data, keys["k"], keys["sha256"], keys["iv"])
    except Exception as exc:  # EncryptionError, or a key or IV that is not base64
        raise MediaUnavailable(f"it could not be decrypted ({exc})") from None
    partial.write_bytes(plain)
    return len(plain)


class Downloads:
    """Fetches a message's files from the media repository, within ``[matrix]
    max_download``."""

    def __init__(self, client: AsyncClient, config: MatrixConfig, host: ChannelHost) -> None:
        self.client = client
        self.config = config
        self.host = host

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        too_big = DownloadLimit(self.config.max_download, limit, "[matrix] max_download")
        if attachment.size is not None and attachment.size > too_big.cap:
            raise too_big(attachment.size)
        url, keys = await self._source(attachment.file_ref)

        async def write(partial: Path) -> int:
            size = await self._download(url, partial, too_big)
            if keys is not None:
                size = await asyncio.to_thread(_decrypt, partial, keys)
            return size

        return await save_whole(destination, write)

    async def _source(self, ref: str) -> tuple[str, dict[str, str] | None]:
        if ref.startswith(ENCRYPTED):
            kept = await self.host.recall_note(KEPT + ref.removeprefix(ENCRYPTED))
            keys = json.loads(kept[0]) if kept is not None else None
            if not isinstance(keys, dict) or not valid_mxc(keys.get("url")):
                raise MediaUnavailable("its decryption info is not kept")
            return str(keys["url"]), {str(k): str(v) for k, v in keys.items()}
        url = valid_mxc(ref)
        if url is None:
            raise MediaUnavailable("it names no file on a homeserver")
        return url, None

    async def _download(self, url: str, partial: Path, too_big: DownloadLimit) -> int:
        match = _MXC.fullmatch(url)
        assert match is not None  # valid_mxc said so
        server = match.group(1) + (match.group(2) or "")
        path = (f"/_matrix/client/v1/media/download/{quote(server, safe='')}/"
                f"{quote(match.group(3), safe='')}")  # fmt: skip
        headers = {"Authorization": f"Bearer {self.client.access_token}"}
        return await fetch_to(partial, self.config.homeserver.rstrip("/") + path, too_big,
                              peer="the homeserver", headers=headers, explain=_errcode)  # fmt: skip


def _errcode(answer: Any) -> str:
    """The Matrix error code of a refusal's JSON answer."""
    return str(answer.get("errcode", ""))[:64] if isinstance(answer, dict) else ""


async def upload(
    client: AsyncClient, file: OutboundFile, *, encrypt: bool, body: str
) -> dict[str, Any]:
    """``file`` uploaded to the media repository (encrypted for an encrypted room): the
    ``m.room.message`` content that shows it.

    An encrypted file is encrypted here, in a thread, into a ciphertext file beside it,
    which is then uploaded as it is. nio's own ``upload(encrypt=True)`` hands back the
    decryption info its generator fills in after the last chunk, which a homeserver's
    quick answer can outrun: the event then went out without ``key``, ``iv`` and
    ``hashes``, and no client could open the file (seen once in CI)."""
    path = Path(file.path)
    if not await asyncio.to_thread(path.is_file):
        raise ChannelError(f"the file to send is gone ({file.name})", retryable=False)
    mime = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    sealed = path.with_name(f".{path.name}.sealed")
    try:
        keys = await asyncio.to_thread(_encrypt_to, path, sealed) if encrypt else None
        source = sealed if keys is not None else path
        async with asyncio.timeout(UPLOAD_TIMEOUT):
            answer, _ = await client.upload(
                lambda _limited, _timeouts: source,
                content_type="application/octet-stream" if keys is not None else mime,
                # What the media repository keeps and serves: in an encrypted room not
                # even the name (the event holds it, encrypted); else the shown name.
                filename="file" if keys is not None else body,
                filesize=await asyncio.to_thread(_size, source),
            )  # fmt: skip
    except FileNotFoundError:
        raise ChannelError(f"the file to send is gone ({file.name})", retryable=False) from None
    except (ClientError, OSError, TimeoutError) as exc:
        raise ChannelError(f"the upload failed ({type(exc).__name__})") from None
    finally:
        await asyncio.to_thread(sealed.unlink, missing_ok=True)
    if not isinstance(answer, UploadResponse):
        raise _upload_refused(answer)
    photo = file.kind == MediaKind.PHOTO
    content: dict[str, Any] = {
        "msgtype": "m.image" if photo else "m.file",
        "body": body,
        "filename": body,
        "info": {"mimetype": mime, "size": file.size},
    }
    if keys is not None:
        content["file"] = {**keys, "url": answer.content_uri, "mimetype": mime}
    else:
        content["url"] = answer.content_uri
    return content


def _size(path: Path) -> int:
    return path.stat().st_size


def _encrypt_to(path: Path, sealed: Path) -> dict[str, Any]:
    """``path`` encrypted (AES-CTR, as Matrix attachments are) into ``sealed``, chunk by
    chunk; the decryption info, its hash over the whole ciphertext."""
    keys: dict[str, Any] = {}
    with path.open("rb") as source, sealed.open("wb") as target:
        chunks = iter(lambda: source.read(UPLOAD_CHUNK), b"")
        for value in encrypted_attachment_generator(chunks):
            if isinstance(value, dict):
                keys = value
            else:
                target.write(value)
    if not {"key", "iv", "hashes"} <= keys.keys():
        raise OSError("the encryption gave no decryption info")
    return keys


def _upload_refused(answer: UploadError) -> ChannelError:
    code = answer.status_code
    if code == "M_TOO_LARGE":
        return ChannelError("the homeserver refuses a file this large (M_TOO_LARGE)",
                            retryable=False)  # fmt: skip
    if code == "M_LIMIT_EXCEEDED":
        wait = (answer.retry_after_ms or 1000) / 1000
        return ChannelError("the upload was rate limited (M_LIMIT_EXCEEDED)", retry_after=wait)
    status = answer.transport_response.status if answer.transport_response else None
    retryable = code in (None, "M_UNKNOWN") or status is None or status >= 500
    return ChannelError(f"the upload was refused: {code} {answer.message}", retryable=retryable)
