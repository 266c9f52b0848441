"""Sending: replies as mrkdwn (long ones in parts), in the thread they came from;
approval prompts as Block Kit; edits (``chat.update``); files (``files_upload_v2``:
``files.getUploadURLExternal``, the upload, ``files.completeUploadExternal``); a reply
shown while it is written (``channels/previewing.py``): posted with the first text,
updated at most every EDIT_INTERVAL from spare budget only, then updated into the reply.

Every text is rendered, masked and split by the core's pipeline
(``echo_bot.richtext.parts``) with Slack's renderer (``formatting.SlackText``). Parts
already sent of a long reply are not sent again when a later part fails and the
delivery worker tries the message again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from channels.parts import Tasks
from channels.previewing import EditedPreviews
from echo_bot.bus import ChannelEdge, ChannelHost
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundKind, OutboundMessage, Receipt, TextFormat
from echo_bot.richtext import parts as richtext

from .blocks import blocks_of
from .common import log
from .formatting import TEXT
from .web import RETRIES, Web

EDIT_INTERVAL = 2.0  # seconds between two texts of one preview (chat.update is Tier 3)
PREVIEW_MARK = " ✍️"  # ends the preview message while the reply is written
PREVIEW_KEEP = 30.0  # seconds a preview no reply took the place of is kept, then deleted


class Outbound:
    def __init__(self, host: ChannelHost, web: Web, edge: ChannelEdge, tasks: Tasks) -> None:
        self.web = web
        self.edge = edge
        self.masker = host.masker
        self._parts_sent: dict[str, list[str]] = {}  # outbound id → ts of the parts sent
        self.previews = EditedPreviews(
            self._show_preview, self._delete, tasks,
            interval=EDIT_INTERVAL, mark=PREVIEW_MARK, keep=PREVIEW_KEEP,
        )  # fmt: skip

    async def mrkdwn(self, message: OutboundMessage) -> list[str]:
        """The message's text as the mrkdwn of each part it is sent as."""
        markdown = message.format == TextFormat.MARKDOWN
        return await richtext.rendered_parts(message.text, markdown, self.masker, TEXT)

    async def send(self, message: OutboundMessage) -> Receipt:
        channel, thread = message.to.chat_id, message.to.thread_id
        if message.edit_of is not None and message.edit_message_id:
            return await self._edit(channel, message.edit_message_id, message)
        if message.kind == OutboundKind.APPROVAL and message.buttons:
            return await self._prompt(channel, thread, message)
        if message.file is not None:
            return await self._send_file(channel, thread, message)
        sent = self._parts_sent.setdefault(message.id, [])
        parts = await self.mrkdwn(message)
        preview = self.previews.message_of(message) if not sent else None
        if preview is not None:  # the reply takes the place of its preview message
            await self._into_preview(channel, preview, message, parts[0], sent)
        for index in range(len(sent), len(parts)):
            sent.append(await self.post(channel, thread, text=parts[index]))
        self._parts_sent.pop(message.id, None)
        return Receipt(channel_message_id=sent[-1])

    async def _into_preview(
        self, channel: str, ts: str, message: OutboundMessage, first: str, sent: list[str]
    ) -> None:
        """The reply's first part as an update of its preview; if Slack refuses it, the
        preview is deleted and the part posted anew."""
        try:
            await self.update(channel, ts, first)
            sent.append(ts)
        except ChannelError as exc:
            if exc.retryable:
                raise
            log.info("slack: the preview in %s was not updated (%s); posting anew", channel, exc)
            await self._delete(message.to, ts)
        self.previews.replaced(message)

    async def _show_preview(
        self, chat: Address, key: str, ts: str | None, text: str, shown: int
    ) -> str | None:
        """One text of a preview, only from spare budget (None: not now), tried once."""
        method = "chat.postMessage" if ts is None else "chat.update"
        if not self.web.pacer.spare(method, chat.chat_id):
            return None
        part = await richtext.rendered_preview(text, self.masker, TEXT)
        if part is None:
            return None
        if ts is None:  # counted by spare() already: not paced again
            return await self.post(chat.chat_id, chat.thread_id, retries=0, paced=False, text=part)
        await self.update(chat.chat_id, ts, part, retries=0, paced=False)
        return ts

    async def update(
        self,
        channel: str,
        ts: str,
        text: str,
        *,
        blocks: Any = None,
        retries: int = RETRIES,
        paced: bool = True,
    ) -> None:
        await self.web.call(
            "chat.update",
            lambda: self.web.client.chat_update(
                channel=channel, ts=ts, text=text, blocks=blocks or []
            ),
            retries=retries, paced=paced,
        )  # fmt: skip

    async def _delete(self, chat: Address, ts: str) -> None:
        try:
            await self.web.call(
                "chat.delete", lambda: self.web.client.chat_delete(channel=chat.chat_id, ts=ts)
            )
        except ChannelError as exc:  # what is left is a stale preview, never a lost reply
            log.info("slack: %s in %s was not deleted: %s", ts, chat, exc)

    async def post(
        self,
        channel: str,
        thread: str | None,
        *,
        retries: int = RETRIES,
        paced: bool = True,
        **fields: Any,
    ) -> str:
        """One ``chat.postMessage``; its ``ts``."""
        answer = await self.web.call(
            "chat.postMessage",
            lambda: self.web.client.chat_postMessage(
                channel=channel, thread_ts=thread, mrkdwn=True,
                unfurl_links=False, unfurl_media=False, **fields,
            ),
            channel=channel, retries=retries, paced=paced,
        )  # fmt: skip
        ts = answer.get("ts")
        if not isinstance(ts, str):
            raise ChannelError("chat.postMessage answered no ts", retryable=False)
        return ts

    async def _prompt(self, channel: str, thread: str | None, message: OutboundMessage) -> Receipt:
        """The gate's rendering as blocks with its buttons; the message's ts → its actions
        kept in the store before the receipt is returned."""
        fallback = richtext.message_parts(message.text.split("\n", 1)[0], False, self.masker, TEXT)[
            0
        ]
        blocks = blocks_of(message, self.masker)
        ts = await self.post(channel, thread, text=fallback, blocks=blocks)
        await self.edge.keep_prompt(f"{channel}:{ts}", message)
        return Receipt(channel_message_id=ts)

    async def _edit(self, channel: str, ts: str, message: OutboundMessage) -> Receipt:
        """An earlier message edited (an approval prompt showing its outcome: no buttons)."""
        text = (await self.mrkdwn(message))[0]
        blocks = blocks_of(message, self.masker) if message.approval is not None else None
        try:
            await self.update(channel, ts, text, blocks=blocks)
        except ChannelError as exc:
            if exc.retryable:
                raise
            # Gone (deleted, too old to edit): the outcome is posted instead, never lost.
            log.info("slack: the edit of %s in %s was refused (%s); posting it", ts, channel, exc)
            posted = await self.post(channel, message.to.thread_id, text=text)
            return Receipt(channel_message_id=posted)
        return Receipt(channel_message_id=ts)

    async def _send_file(
        self, channel: str, thread: str | None, message: OutboundMessage
    ) -> Receipt:
        """A file (``send_file``) uploaded into the conversation, its text the comment."""
        assert message.file is not None
        file = message.file
        parts = await self.mrkdwn(message) if message.text.strip() else []
        name = self.masker.mask(file.name)
        try:  # read off the loop: the SDK would read the path in it
            data = await asyncio.to_thread(Path(file.path).read_bytes)
        except OSError as exc:
            raise ChannelError(
                f"cannot read {file.name}: {exc.strerror}", retryable=False
            ) from None
        sent = self._parts_sent.setdefault(message.id, [])
        if not sent:  # not uploaded again when only the text after it failed
            answer = await self.web.call(
                "files.completeUploadExternal",
                lambda: self.web.client.files_upload_v2(
                    channel=channel, file=data, filename=name, title=name,
                    initial_comment=parts[0] if parts else None, thread_ts=thread,
                ),
            )  # fmt: skip
            sent.append(_file_id(answer))
        for index in range(len(sent), len(parts)):  # a long text goes on after the file
            sent.append(await self.post(channel, thread, text=parts[index]))
        self._parts_sent.pop(message.id, None)
        return Receipt(channel_message_id=sent[0] or None)


def _file_id(answer: Any) -> str:
    files = answer.get("files") or [answer.get("file") or {}]
    first = files[0] if isinstance(files, list) and files and isinstance(files[0], dict) else {}
    return str(first.get("id") or "")
