"""What every channel's parts share: send, previews and downloads handed to its parts,
the limit of one download, and text from the network made safe to store. (Its health
and the waits between tries at its peer are the host's, ``echo_bot.link``; its
background tasks are ``echo_bot.background.Tasks``, named here too.)"""

from __future__ import annotations

import asyncio
import glob
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from echo_bot.background import Tasks
from echo_bot.errors import MediaTooLarge, MediaUnavailable
from echo_bot.events import Address, Attachment, OutboundMessage, Receipt
from echo_bot.sizes import format_size


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
    ``downloads`` (the methods ``bus.PreviewSink`` and ``bus.MediaSource`` promise)."""

    outbound: _Sends
    previews: _ShowsPreviews
    downloads: _FetchesMedia

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


class TokenBucket:
    """A rate with a burst: ``rate`` tokens a second, at most ``burst`` saved up (the
    pacers of the networks' message limits)."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.clock = clock
        self.updated = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def delay(self) -> float:
        """Take one token; return how long to wait before using it."""
        self._refill()
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def wait_for_spare(self, reserve: float) -> float:
        """Seconds until one token is spare above ``reserve`` (0.0: now); takes none."""
        self._refill()
        if self.tokens - 1 >= reserve:
            return 0.0
        return (reserve + 1 - self.tokens) / self.rate

    def take(self) -> None:
        self._refill()
        self.tokens -= 1

    def spare(self, reserve: float) -> float:
        """Take one token only if at least ``reserve`` remain after it (then 0.0); else
        take none and return the seconds until one is spare."""
        self._refill()
        if self.tokens - 1 >= reserve:
            self.tokens -= 1
            return 0.0
        return (reserve + 1 - self.tokens) / self.rate


DOWNLOAD_CHUNK = 256 * 1024


class DownloadLimit:
    """The most one download may take, and the error that says a file is over it: the
    channel's own limit (``key`` names its config key, "[telegram] max_download"), or
    less when ``limit`` (what the core's media budgets leave) is smaller."""

    def __init__(self, own: int, limit: int | None, key: str) -> None:
        self.own = own
        self.key = key
        self.budget = limit is not None and limit < own
        self.cap = min(own, limit) if limit is not None else own

    def __call__(self, size: int | None) -> MediaUnavailable:
        over = f"over the {format_size(self.own)} download limit ({self.key})"
        shown = f"it is {format_size(size)}" if size is not None else "it is larger"
        if self.budget:
            return MediaTooLarge(f"{shown}, over the {format_size(self.cap)} its budget leaves")
        return MediaUnavailable(f"{shown}, {over}" if size is not None else f"it is {over}")


async def save_whole(destination: Path, write: Callable[[Path], Awaitable[int]]) -> int:
    """``write(partial)`` fills a file beside ``destination`` (a name of its own: two
    tries at once, a turn taken over, never share one) and says its size; it becomes
    ``destination`` only whole, and earlier tries' partial files go."""
    partial = destination.with_name(f".{destination.name}.{secrets.token_hex(4)}.part")
    try:
        size = await write(partial)
        await asyncio.to_thread(partial.replace, destination)
        await asyncio.to_thread(drop_partials, destination)
    finally:
        await asyncio.to_thread(partial.unlink, missing_ok=True)
    return size


async def stream_to(partial: Path, response: Any, too_big: DownloadLimit) -> int:
    """An HTTP response's body (aiohttp's) written to ``partial`` off the loop, within
    ``too_big.cap``: an announced length over it is refused before any byte is read,
    a body that outgrows it as soon as it does. Its size."""
    if response.content_length is not None and response.content_length > too_big.cap:
        raise too_big(response.content_length)
    size = 0
    handle = await asyncio.to_thread(partial.open, "wb")
    try:
        async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK):
            size += len(chunk)
            if size > too_big.cap:
                raise too_big(None)
            await asyncio.to_thread(handle.write, chunk)
    finally:
        await asyncio.to_thread(handle.close)
    return size


def drop_partials(saved: Path) -> None:
    """``saved`` is whole: partial downloads of it (``.<name>.<random>.part``, a try a
    kill cut short) can go."""
    for stale in saved.parent.glob(f".{glob.escape(saved.name)}.*.part"):
        stale.unlink(missing_ok=True)


__all__ = ["DownloadLimit", "Tasks", "ThroughParts", "TokenBucket", "clean", "save_whole",
           "stream_to"]  # fmt: skip
