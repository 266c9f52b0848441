"""Files both ways: a message's attachments read into ``Attachment``s (the CDN's signed
URL committed with the message, the file fetched during the turn), and ``fetch_media``
streaming one within ``[discord] max_download``, through ``[discord] proxy`` as every
other request. Only Discord's CDN hosts are fetched from (the URL came in a message;
no token is sent with it), and redirects are not followed."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from channels.parts import clean, tls_context
from echo_bot.downloads import DOWNLOAD_TIMEOUT, GONE, DownloadLimit, save_whole, stream_to
from echo_bot.errors import ChannelError, MediaUnavailable
from echo_bot.events import Attachment, MediaKind

from .settings import DiscordConfig

FILES_MAX = 10  # Discord's own limit of attachments in a message
CDN_HOSTS = frozenset({"cdn.discordapp.com", "media.discordapp.net"})
KINDS = {"image": MediaKind.PHOTO, "audio": MediaKind.AUDIO, "video": MediaKind.VIDEO}


def on_cdn(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "https" and parts.hostname in CDN_HOSTS


def read_files(files: Sequence[Any], config: DiscordConfig) -> tuple[list[Attachment], list[str]]:
    """The attachments of a message, and notes for those not taken (and why)."""
    attachments: list[Attachment] = []
    notes: list[str] = []
    for item in files[: FILES_MAX + 1]:
        name = clean(str(item.filename or "a file"))[:200]
        url = str(item.url or "")
        if not config.media:
            notes.append(f"[a file, {name}: not downloaded, [discord] media is off]")
        elif len(url) > 512 or not on_cdn(url):  # an Attachment's reference holds 512
            notes.append(f"[a file, {name}: Discord gave no download address I may use]")
        elif len(attachments) >= FILES_MAX:
            notes.append(f"[a file, {name}: more than {FILES_MAX} files in one message]")
        else:
            mime = clean(str(item.content_type or ""))[:128]
            size = item.size if isinstance(item.size, int) and item.size >= 0 else None
            kind = KINDS.get(mime.split("/", 1)[0], MediaKind.DOCUMENT)
            attachments.append(Attachment(kind=kind, file_ref=url, name=name,
                                          mime_type=mime or None, size=size))  # fmt: skip
    return attachments, notes


class Downloads:
    def __init__(self, config: DiscordConfig) -> None:
        self.config = config
        self._tls: ssl.SSLContext | None = None  # made at the first download, kept

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        too_big = DownloadLimit(self.config.max_download, limit, "[discord] max_download")
        if attachment.size is not None and attachment.size > too_big.cap:
            raise too_big(attachment.size)
        if not on_cdn(attachment.file_ref):
            raise MediaUnavailable("its address is not Discord's CDN")
        url = attachment.file_ref
        return await save_whole(destination, lambda partial: self._download(url, partial, too_big))

    async def _download(self, url: str, partial: Path, too_big: DownloadLimit) -> int:
        if self._tls is None:  # reads the CA files: off the loop, once
            self._tls = await asyncio.to_thread(tls_context, self.config.ca_file)
        connector = aiohttp.TCPConnector(ssl=self._tls)
        timeout = aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get(url, proxy=self.config.proxy, allow_redirects=False) as response,
            ):
                if response.status == 200:
                    return await stream_to(partial, response, too_big)
                status = response.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ChannelError(f"the download failed ({type(exc).__name__})") from None
        if status in GONE:  # the link expired (24 h) or the file was deleted
            raise MediaUnavailable(f"Discord has no such file (HTTP {status})")
        raise ChannelError(f"the download failed (HTTP {status})")
