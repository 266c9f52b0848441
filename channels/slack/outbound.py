"""Sending: how Slack posts (``chat.postMessage``, in the thread a message came from),
updates (``chat.update``) and deletes one message, for the core's ``ChatSends`` (replies
as mrkdwn in parts through the core's pipeline with Slack's renderer, each part once; a
reply shown while it is written, updated at most every EDIT_INTERVAL from spare budget
only, then updated into the reply), and what is Slack's own: approval prompts as Block
Kit, outcome edits, files (``files_upload_v2``: ``files.getUploadURLExternal``, the
upload, ``files.completeUploadExternal``, the text's first part its comment).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from echo_bot.background import Tasks
from echo_bot.bus import ChannelEdge, ChannelHost
from echo_bot.chat_sends import ChatSends
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundMessage, Receipt
from echo_bot.preview_ledger import PreviewLedger
from echo_bot.richtext import parts as richtext

from .blocks import blocks_of
from .common import log
from .formatting import TEXT
from .web import RETRIES, Web, paced_as

EDIT_INTERVAL = 2.0  # seconds between two texts of one preview (chat.update is Tier 3)


class Outbound:
    renderer = TEXT  # for ChatSends

    def __init__(self, host: ChannelHost, web: Web, edge: ChannelEdge, tasks: Tasks) -> None:
        self.web = web
        self.edge = edge
        self.masker = host.masker
        self.sends = ChatSends(self, self.masker, tasks, interval=EDIT_INTERVAL,
                               file_carries_text=True,
                               ledger=PreviewLedger(host, "slack", tasks))  # fmt: skip
        self.previews = self.sends.previews

    async def send(self, message: OutboundMessage) -> Receipt:
        return await self.sends.send(
            message, edit=lambda ts: self._edit(message.to, ts, message),
            prompt=lambda: self._prompt(message.to, message),
            upload=lambda first: self._upload(message, first),
        )  # fmt: skip

    # -- one message, for ChatSends -------------------------------------------------------
    async def post(
        self, to: Address, part: str, key: str, *, quote: str | None = None,
        notice: bool = False, spare: bool = False,
    ) -> str:  # fmt: skip
        """A spare one was counted by ``has_spare`` already: not paced again."""
        return await self._post(to, retries=0 if spare else RETRIES, paced=not spare, text=part)

    async def edit(
        self, to: Address, message_id: str, part: str, key: str, *, spare: bool = False
    ) -> None:
        await self._update(to, message_id, part, retries=0 if spare else RETRIES, paced=not spare)

    async def remove(self, to: Address, message_id: str) -> None:
        await self.web.call(
            "chat.delete", lambda: self.web.client.chat_delete(channel=to.chat_id, ts=message_id)
        )

    def has_spare(self, to: Address, editing: bool) -> bool:
        key = paced_as("chat.update" if editing else "chat.postMessage", to.chat_id)
        return self.web.pacer.spare(key) == 0.0

    async def _update(
        self, to: Address, ts: str, text: str, *, blocks: Any = None, retries: int = RETRIES,
        paced: bool = True,
    ) -> None:  # fmt: skip
        await self.web.call(
            "chat.update",
            lambda: self.web.client.chat_update(
                channel=to.chat_id, ts=ts, text=text, blocks=blocks or []
            ),
            retries=retries, paced=paced,
        )  # fmt: skip

    async def _post(
        self, to: Address, *, retries: int = RETRIES, paced: bool = True, **fields: Any
    ) -> str:
        """One ``chat.postMessage``; its ``ts``."""
        answer = await self.web.call(
            "chat.postMessage",
            lambda: self.web.client.chat_postMessage(
                channel=to.chat_id, thread_ts=to.thread_id, mrkdwn=True,
                unfurl_links=False, unfurl_media=False, **fields,
            ),
            channel=to.chat_id, retries=retries, paced=paced,
        )  # fmt: skip
        ts = answer.get("ts")
        if not isinstance(ts, str):
            raise ChannelError("chat.postMessage answered no ts", retryable=False)
        return ts

    # -- what is Slack's own --------------------------------------------------------------
    async def _prompt(self, to: Address, message: OutboundMessage) -> Receipt:
        """The gate's rendering as blocks with its buttons; the message's ts → its actions
        kept in the store before the receipt is returned."""
        headline = message.text.split("\n", 1)[0]
        fallback = richtext.message_parts(headline, False, self.masker, TEXT)[0]
        ts = await self._post(to, text=fallback, blocks=blocks_of(message, self.masker))
        try:
            await self.edge.keep_prompt(f"{to.chat_id}:{ts}", message)
        except Exception as exc:
            # Not kept, its buttons would be refused as offered by no prompt, and the
            # send tried again posts another (Slack takes no idempotency key): taken
            # back first, so the chat shows one prompt that works.
            with contextlib.suppress(Exception):
                await self.remove(to, ts)
            raise ChannelError(f"the prompt was not kept ({exc}); sent again") from exc
        return Receipt(channel_message_id=ts)

    async def _edit(self, to: Address, ts: str, message: OutboundMessage) -> Receipt:
        """An earlier message edited (an approval prompt showing its outcome: no buttons)."""
        text = (await self.sends.parts(message))[0]
        blocks = blocks_of(message, self.masker) if message.approval is not None else None
        try:
            await self._update(to, ts, text, blocks=blocks)
        except ChannelError as exc:
            if exc.retryable:
                raise
            # Gone (deleted, too old to edit): the outcome is posted instead, never lost.
            log.info("slack: the edit of %s in %s was refused (%s); posting it", ts, to, exc)
            return Receipt(channel_message_id=await self._post(to, text=text))
        return Receipt(channel_message_id=ts)

    async def _upload(self, message: OutboundMessage, comment: str | None) -> str:
        """A file (``send_file``) uploaded into the conversation; its id."""
        assert message.file is not None
        file, to = message.file, message.to
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
                channel=to.chat_id, file=data, filename=name, title=name,
                initial_comment=comment, thread_ts=to.thread_id,
            ),
        )  # fmt: skip
        return _file_id(answer)


def _file_id(answer: Any) -> str:
    files = answer.get("files") or [answer.get("file") or {}]
    first = files[0] if isinstance(files, list) and files and isinstance(files[0], dict) else {}
    return str(first.get("id") or "")
