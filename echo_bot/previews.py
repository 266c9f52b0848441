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
import time

from .bus import PreviewSink
from .events import Address
from .secrets import Masker
from .typing_shown import TypingShown

log = logging.getLogger(__name__)

MAX_LIVE = 1000  # previews at once, at most (one per turn asking its brain)
CLOSE_WAIT = 10.0  # seconds a preview being shown may take to finish once closed
STOP_KEPT = 3600.0  # a stop between steps counts this long (the turn's tools may be slow)


class LivePreview:
    def __init__(
        self, sink: PreviewSink, to: Address, key: str, masker: Masker, typing: TypingShown
    ) -> None:
        self.sink, self.to, self.key, self.masker = sink, to, key, masker
        self.typing = typing
        self._text = ""
        self._shown = ""
        self._changed = asyncio.Event()
        self._stopped = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def update(self, text: str) -> None:
        self._text = text
        self._changed.set()
        if self._task is None and not self._closing:
            self._task = asyncio.create_task(self._pump(), name=f"preview-{self.key}")

    async def stopped(self) -> None:
        await self._stopped.wait()

    def stop(self) -> None:
        self._stopped.set()

    @property
    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    async def _pump(self) -> None:
        while not self._closing:
            await self._changed.wait()
            self._changed.clear()
            if self._closing:
                return
            text = self.masker.mask_growing(self._text)  # a secret never shows, even in part
            if text == self._shown:
                continue
            self.typing.stop(self.key)  # the reply shows now: no longer "typing"
            try:
                await self.sink.show_preview(self.to, self.key, text)
            except Exception as exc:  # a preview is never worth a failed turn
                log.debug("preview of %s in %s failed: %s", self.key, self.to, exc)
            self._shown = text

    async def close(self) -> None:
        """No more texts; the one being shown is let finish (cut off at CLOSE_WAIT), so
        the channel knows what it made (a group's preview message) before it ends."""
        self._closing = True
        self._changed.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT)
        except TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        except Exception as exc:
            log.debug("preview of %s ended badly: %s", self.key, exc)
        try:
            await self.sink.end_preview(self.to, self.key)
        except Exception as exc:
            log.debug("ending the preview of %s failed: %s", self.key, exc)


class Previews:
    """The channels that show previews, and the previews live now (by key: the inbound
    id of the turn). A stop for a turn between its brain steps (its preview closed, its
    tools running) is kept and ends the turn before its next step."""

    def __init__(self, masker: Masker) -> None:
        self.masker = masker
        self.typing = TypingShown()  # what shows before a preview, or with none
        self._sinks: dict[str, PreviewSink] = {}
        self._live: dict[str, LivePreview] = {}
        self._stopped: dict[str, float] = {}  # key -> when: asked to stop between steps

    def add_sink(self, sink: PreviewSink) -> None:
        self._sinks[sink.name] = sink

    def open(self, to: Address, key: str) -> LivePreview | None:
        sink = self._sinks.get(to.channel)
        if sink is None or len(self._live) >= MAX_LIVE:
            return None
        preview = self._live[key] = LivePreview(sink, to, key, self.masker, self.typing)
        return preview

    async def close(self, preview: LivePreview) -> None:
        if self._live.get(preview.key) is preview:
            del self._live[preview.key]
        await preview.close()

    def stop(self, key: str) -> bool:
        """Stop the reply being written for ``key`` (its turn, if between steps, ends
        before the next); the channel asks only for keys it showed previews of."""
        preview = self._live.get(key)
        if preview is not None:
            preview.stop()
            return True
        now = time.monotonic()
        if len(self._stopped) >= MAX_LIVE:
            self._stopped = {k: t for k, t in self._stopped.items() if now - t < STOP_KEPT}
        if len(self._stopped) < MAX_LIVE:
            self._stopped[key] = now
        return True

    def take_stop(self, key: str) -> bool:
        """Whether the turn of ``key`` was asked to stop between its steps (once)."""
        when = self._stopped.pop(key, None)
        return when is not None and time.monotonic() - when < STOP_KEPT
