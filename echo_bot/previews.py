"""Replies shown while the model writes them: previews, never the record.

A brain that streams updates a ``LivePreview`` with the whole text so far; one task per
preview hands the newest text to its channel (``PreviewSink.show_preview``) whenever the
channel is ready for the next, so a channel that paces itself simply skips the texts in
between. Nothing here is stored: the final reply goes through the outbox like any other,
and a crash mid-stream leaves only a preview the channel lets fade (a Telegram draft
lasts 30 s). A person may stop a reply being written (Telegram's stop button): the
channel calls ``stop(key)`` and the brain ends the generation with what it has.
"""

from __future__ import annotations

import asyncio
import logging

from .bus import PreviewSink
from .events import Address
from .secrets import Masker

log = logging.getLogger(__name__)

MAX_LIVE = 1000  # previews at once, at most (one per turn asking its brain)


class LivePreview:
    def __init__(self, sink: PreviewSink, to: Address, key: str, masker: Masker) -> None:
        self.sink, self.to, self.key, self.masker = sink, to, key, masker
        self._text = ""
        self._shown = ""
        self._changed = asyncio.Event()
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def update(self, text: str) -> None:
        self._text = text
        self._changed.set()
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name=f"preview-{self.key}")

    async def stopped(self) -> None:
        await self._stopped.wait()

    def stop(self) -> None:
        self._stopped.set()

    async def _pump(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            text = self.masker.mask_growing(self._text)  # a secret never shows, even in part
            if text == self._shown:
                continue
            try:
                await self.sink.show_preview(self.to, self.key, text)
            except Exception as exc:  # a preview is never worth a failed turn
                log.debug("preview of %s in %s failed: %s", self.key, self.to, exc)
            self._shown = text

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            try:
                await self.sink.end_preview(self.to, self.key)
            except Exception as exc:
                log.debug("ending the preview of %s failed: %s", self.key, exc)


class Previews:
    """The channels that show previews, and the previews live now (by key: the inbound
    id of the turn)."""

    def __init__(self, masker: Masker) -> None:
        self.masker = masker
        self._sinks: dict[str, PreviewSink] = {}
        self._live: dict[str, LivePreview] = {}

    def add_sink(self, sink: PreviewSink) -> None:
        self._sinks[sink.name] = sink

    def open(self, to: Address, key: str) -> LivePreview | None:
        sink = self._sinks.get(to.channel)
        if sink is None or len(self._live) >= MAX_LIVE:
            return None
        preview = self._live[key] = LivePreview(sink, to, key, self.masker)
        return preview

    async def close(self, preview: LivePreview) -> None:
        if self._live.get(preview.key) is preview:
            del self._live[preview.key]
        await preview.close()

    def stop(self, key: str) -> bool:
        """Stop the reply being written for ``key``; False if none is being written."""
        preview = self._live.get(key)
        if preview is None:
            return False
        preview.stop()
        return True
