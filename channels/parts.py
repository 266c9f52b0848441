"""What every channel's parts share: send, previews and downloads handed to its parts,
the limit of one download, and text from the network made safe to store. (Its health
and the waits between tries at its peer are the host's, ``echo_bot.link``; its
background tasks are ``echo_bot.background.Tasks``, named here too.)"""

from __future__ import annotations

import functools
import ssl
from pathlib import Path
from typing import Protocol

from echo_bot.background import Tasks
from echo_bot.bus import ChannelLink
from echo_bot.events import Address, Attachment, OutboundMessage, Receipt


class _Sends(Protocol):
    async def send(self, message: OutboundMessage) -> Receipt: ...


class _ShowsPreviews(Protocol):
    async def show_preview(self, to: Address, key: str, text: str) -> None: ...
    async def end_preview(self, to: Address, key: str) -> None: ...


class _FetchesMedia(Protocol):
    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int: ...


class ThroughParts:
    """What a chat channel hands to its parts, written once: ``send`` to its
    ``outbound``, a reply being written to its ``previews``, a file to its
    ``downloads`` (the methods ``bus.PreviewSink`` and ``bus.MediaSource`` promise), its
    health to its ``link``."""

    outbound: _Sends
    previews: _ShowsPreviews
    downloads: _FetchesMedia
    link: ChannelLink

    def health(self) -> dict[str, object]:
        return self.link.state()

    async def send(self, message: OutboundMessage) -> Receipt:
        return await self.outbound.send(message)

    async def show_preview(self, to: Address, key: str, text: str) -> None:
        await self.previews.show_preview(to, key, text)

    async def end_preview(self, to: Address, key: str) -> None:
        await self.previews.end_preview(to, key)

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        return await self.downloads.fetch_media(attachment, destination, limit=limit)


def clean(text: str) -> str:
    """Control characters out (but newlines and tabs), and valid Unicode only: JSON may
    carry a lone surrogate ("\\ud800"), which no store can encode, so such a message
    would fail to commit on every try."""
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return "".join(c for c in text if c in "\n\t" or (c >= " " and c != "\x7f"))


@functools.cache
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The system's CAs, and ``ca_file``'s (a server's or a proxy's own), loaded once
    per file: not read again on the loop for each connection."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(Path(ca_file).expanduser())
    return context


__all__ = ["Tasks", "ThroughParts", "clean", "tls_context"]
