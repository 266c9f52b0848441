"""Sending: replies as mrkdwn (long ones in parts), in the thread they came from;
approval prompts as Block Kit; edits (``chat.update``); files (``files_upload_v2``:
``files.getUploadURLExternal``, the upload, ``files.completeUploadExternal``).

What the renderer made is masked (``host.masker``) right before it leaves. Parts
already sent of a long reply are not sent again when a later part fails and the
delivery worker tries the message again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from echo_bot.bus import ChannelHost
from echo_bot.errors import ChannelError
from echo_bot.events import OutboundKind, OutboundMessage, Receipt, TextFormat

from .blocks import Prompts, actions_of, blocks_of
from .common import log
from .formatting import escape, split_text, to_mrkdwn
from .web import Web


class Outbound:
    def __init__(self, host: ChannelHost, web: Web, prompts: Prompts) -> None:
        self.web = web
        self.prompts = prompts
        self.masker = host.masker
        self._parts_sent: dict[str, list[str]] = {}  # outbound id → ts of the parts sent

    def mrkdwn(self, message: OutboundMessage) -> str:
        markdown = message.format == TextFormat.MARKDOWN
        return self.masker.mask(to_mrkdwn(message.text) if markdown else escape(message.text))

    async def send(self, message: OutboundMessage) -> Receipt:
        channel, thread = message.to.chat_id, message.to.thread_id
        if message.edit_of is not None and message.edit_message_id:
            return await self._edit(channel, message.edit_message_id, message)
        if message.kind == OutboundKind.APPROVAL and message.buttons:
            return await self._prompt(channel, thread, message)
        if message.file is not None:
            return await self._send_file(channel, thread, message)
        sent = self._parts_sent.setdefault(message.id, [])
        parts = split_text(self.mrkdwn(message))
        for index in range(len(sent), len(parts)):
            sent.append(await self.post(channel, thread, text=parts[index]))
        self._parts_sent.pop(message.id, None)
        return Receipt(channel_message_id=sent[-1])

    async def post(self, channel: str, thread: str | None, **fields: Any) -> str:
        """One ``chat.postMessage``; its ``ts``."""
        answer = await self.web.call(
            "chat.postMessage",
            lambda: self.web.client.chat_postMessage(
                channel=channel, thread_ts=thread, mrkdwn=True,
                unfurl_links=False, unfurl_media=False, **fields,
            ),
            channel=channel,
        )  # fmt: skip
        ts = answer.get("ts")
        if not isinstance(ts, str):
            raise ChannelError("chat.postMessage answered no ts", retryable=False)
        return ts

    async def _prompt(self, channel: str, thread: str | None, message: OutboundMessage) -> Receipt:
        """The gate's rendering as blocks with its buttons; the message's ts → its actions
        kept in the store before the receipt is returned."""
        fallback = self.masker.mask(escape(message.text.split("\n", 1)[0]))
        blocks = _masked(blocks_of(message), self.masker.mask)
        ts = await self.post(channel, thread, text=fallback, blocks=blocks)
        await self.prompts.keep(channel, ts, actions_of(message.buttons))
        return Receipt(channel_message_id=ts)

    async def _edit(self, channel: str, ts: str, message: OutboundMessage) -> Receipt:
        """An earlier message edited (an approval prompt showing its outcome: no buttons)."""
        text = self.mrkdwn(message)
        blocks = (
            _masked(blocks_of(message), self.masker.mask) if message.approval is not None else None
        )
        try:
            await self.web.call(
                "chat.update",
                lambda: self.web.client.chat_update(
                    channel=channel, ts=ts, text=split_text(text)[0], blocks=blocks or []
                ),
            )
        except ChannelError as exc:
            if exc.retryable:
                raise
            log.info("slack: the edit of %s in %s was refused: %s", ts, channel, exc)
        return Receipt(channel_message_id=ts)

    async def _send_file(
        self, channel: str, thread: str | None, message: OutboundMessage
    ) -> Receipt:
        """A file (``send_file``) uploaded into the conversation, its text the comment."""
        assert message.file is not None
        file = message.file
        comment = self.mrkdwn(message) if message.text.strip() else None
        name = self.masker.mask(file.name)
        try:  # read off the loop: the SDK would read the path in it
            data = await asyncio.to_thread(Path(file.path).read_bytes)
        except OSError as exc:
            raise ChannelError(
                f"cannot read {file.name}: {exc.strerror}", retryable=False
            ) from None
        answer = await self.web.call(
            "files.completeUploadExternal",
            lambda: self.web.client.files_upload_v2(
                channel=channel, file=data, filename=name, title=name,
                initial_comment=split_text(comment)[0] if comment else None, thread_ts=thread,
            ),
        )  # fmt: skip
        files = answer.get("files") or [answer.get("file") or {}]
        first = files[0] if isinstance(files, list) and files else {}
        return Receipt(channel_message_id=str(first.get("id") or "") or None)


def _masked(value: Any, mask: Any) -> Any:
    """Every string in a Block Kit structure masked (labels, texts, never the actions,
    which the gate made and hold no secret)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, list):
        return [_masked(item, mask) for item in value]
    if isinstance(value, dict):
        return {
            k: (v if k in ("action_id", "value", "type", "style", "block_id") else _masked(v, mask))
            for k, v in value.items()
        }
    return value
