"""A file a person sent, fetched from their network during the turn, for every channel
alike: within the channel's limit or what the media budgets leave (``DownloadLimit``),
streamed off the event loop (``stream_to``), through a name of its own that becomes the
file only whole (``save_whole``), over plain HTTP (``fetch_to``: the answer's status
read as "no such file", "refused" or "try again", the URL's secrets never in an error).
"""

from __future__ import annotations

import asyncio
import glob
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import ChannelError, MediaTooLarge, MediaUnavailable
from .sizes import format_size

DOWNLOAD_TIMEOUT = 110.0  # one file, whole (the core gives a try 120 s)
MAX_ERROR_BODY = 64 * 1024
GONE = frozenset({400, 403, 404, 410})  # the file is not there (any more) for this bot


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


async def fetch_to(
    partial: Path, url: str, too_big: DownloadLimit, *, peer: str,
    headers: Mapping[str, str] | None = None, html_means: str | None = None,
    explain: Callable[[Any], str] = lambda body: "",
) -> int:  # fmt: skip
    """GET ``url`` into ``partial`` within ``too_big`` and DOWNLOAD_TIMEOUT, redirects
    not followed (a token in ``headers`` goes nowhere else); its size. An answer other
    than 200 is ``MediaUnavailable`` when ``peer`` says the file is gone or refuses it,
    ``ChannelError`` (tried again) for 429 and its own failures, with what ``explain``
    reads in the answer's JSON; ``html_means``: a page instead of the file is refused
    with this text (a sign-in page). No error quotes the URL, which may hold a token."""
    from aiohttp import ClientError, ClientSession, ClientTimeout

    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=DOWNLOAD_TIMEOUT)) as session,
            session.get(url, headers=dict(headers or {}), allow_redirects=False) as response,
        ):
            status = response.status
            if status == 200 and html_means and response.content_type == "text/html":
                raise MediaUnavailable(html_means)
            if status == 200:
                return await stream_to(partial, response, too_big)
            try:
                body = json.loads(await response.content.read(MAX_ERROR_BODY))
            except (ValueError, ClientError):
                body = None
    except (ClientError, TimeoutError) as exc:
        what = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
        raise ChannelError(f"the download {what}") from None
    said = " ".join(part for part in (f"HTTP {status}", explain(body)) if part)
    if status in GONE:
        raise MediaUnavailable(f"{peer} has no such file ({said})")
    if status == 429 or status >= 500:
        raise ChannelError(f"the download failed ({said})")
    raise MediaUnavailable(f"{peer} refused it ({said})")
