"""Sending: how Discord posts, edits and deletes one message, for the core's
``ChatSends`` (replies in parts within 2,000 characters through the core's pipeline
with Discord's renderer, each part once; a reply shown while it is written, edited at
most every EDIT_INTERVAL from spare budget only), and what is Discord's own: approval
prompts with buttons (message components), outcome edits that take the buttons away,
and files.

Every post carries a nonce made from its part's key, with ``enforce_nonce``: a post
tried again (discord.py's own retry of a 5xx, the delivery worker's) is answered with
the message the first made, never a second one. No mention is allowed in anything
sent (``AllowedMentions.none()``) and link previews are suppressed.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import discord

from echo_bot.background import Tasks
from echo_bot.bus import ChannelEdge, ChannelHost, ChannelLink
from echo_bot.chat_sends import ChatSends
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundMessage, Receipt, TextFormat
from echo_bot.pacing import Pacer
from echo_bot.preview_ledger import PreviewLedger
from echo_bot.richtext import parts as richtext

from .client import called
from .common import log
from .formatting import MAX_TEXT, TEXT

EDIT_INTERVAL = 2.0  # seconds between two texts of one preview
# Discord's buckets: about 5 messages (and 5 edits) per 5 s in one channel.
RATE = (1.0, 5.0)
NONE = discord.AllowedMentions.none()
STYLES = {"approve_once": discord.ButtonStyle.success, "deny": discord.ButtonStyle.danger}
LABEL_MAX = 80
EXTENSIONS = {"python": "py", "javascript": "js", "typescript": "ts", "shell": "sh",
              "bash": "sh", "rust": "rs", "markdown": "md", "": "txt"}  # fmt: skip
LONG_FENCE = re.compile(
    r"^(?P<fence>```|~~~)[ \t]*(?P<language>[\w+#.-]*)[^\n]*\n(?P<code>.*?)\n(?P=fence)[ \t]*$",
    re.M | re.S,
)


def long_code(text: str) -> tuple[str, list[tuple[str, str]]]:
    """A reply's code blocks longer than one message, taken out to go as files (a block
    split over several messages cannot be copied whole), sent before the text: the text
    with a line in each one's place, and the files (name, code)."""
    files: list[tuple[str, str]] = []

    def taken(match: re.Match[str]) -> str:
        language, code = match["language"].lower(), match["code"]
        if len(code) <= MAX_TEXT:
            return match[0]
        extension = EXTENSIONS.get(language, language)
        extension = extension if re.fullmatch("[a-z0-9]{1,8}", extension) else "txt"
        name = f"code-{len(files) + 1}.{extension}"
        files.append((name, code + "\n"))
        return f"(the code, {code.count(chr(10)) + 1} lines, is attached: {name})"

    return LONG_FENCE.sub(taken, text), files


def nonce_of(key: str) -> str:
    """Discord's nonce holds 25 characters: the key's digest."""
    return hashlib.sha256(key.encode()).hexdigest()[:25]


class Outbound:
    renderer = TEXT  # for ChatSends

    def __init__(
        self, host: ChannelHost, edge: ChannelEdge, tasks: Tasks, link: ChannelLink
    ) -> None:
        self.client: discord.Client | None = None  # once signed in
        self.edge, self.link = edge, link
        self.masker = host.masker
        self.pacer = Pacer(RATE)
        self.sends = ChatSends(self, self.masker, tasks, interval=EDIT_INTERVAL,
                               file_carries_text=True,
                               ledger=PreviewLedger(host, "discord", tasks))  # fmt: skip
        self.previews = self.sends.previews

    async def send(self, message: OutboundMessage) -> Receipt:
        return await self.sends.send(
            message, edit=lambda message_id: self._edit(message.to, message_id, message),
            prompt=lambda: self._prompt(message.to, message),
            upload=lambda first: self._upload(message, first), reply=self._reply,
        )  # fmt: skip

    async def _first(self, message: OutboundMessage, key: str, part: str, **extra: Any) -> str:
        """A message posted ahead of the rest of ``message``'s: once (``ChatSends.ahead``)."""
        return await self.sends.ahead(
            message, key, lambda: self.post(message.to, part, key, **extra)
        )

    async def _reply(self, message: OutboundMessage) -> Receipt:
        """A reply in parts, its long code blocks as files first."""
        markdown = message.format == TextFormat.MARKDOWN
        text, files = long_code(message.text) if markdown else (message.text, [])
        for index, (name, code) in enumerate(files):  # each with its nonce: once
            data = io.BytesIO(self.masker.mask(code).encode())
            file = discord.File(data, filename=name)
            await self._first(message, f"{message.id}.code{index}", "", file=file)
        return await self.sends.reply(
            message.model_copy(update={"text": text}) if files else message
        )

    def _chat(self, to: Address) -> discord.PartialMessageable:
        if self.client is None:
            raise ChannelError("not signed in to Discord yet")
        return self.client.get_partial_messageable(int(to.chat_id))

    async def _call(self, what: str, key: str, request: Callable[[], Awaitable[Any]],
                    paced: bool = True) -> Any:  # fmt: skip
        wait = self.pacer.reserve(key) if paced else 0.0
        if wait > 0:
            await asyncio.sleep(wait)
        return await called(what, request, self.link)

    # -- one message, for ChatSends -------------------------------------------------------
    async def post(
        self, to: Address, part: str, key: str, *, quote: str | None = None,
        notice: bool = False, spare: bool = False, **extra: Any,
    ) -> str:  # fmt: skip
        """A spare one was counted by ``has_spare`` already: not paced again."""
        if quote and quote.isdigit():  # a reply to the message it answers
            extra["reference"] = discord.MessageReference(
                message_id=int(quote), channel_id=int(to.chat_id), fail_if_not_exists=False
            )
        chat, nonce = self._chat(to), nonce_of(key)
        sent = await self._call(
            "post", f"post:{to.chat_id}",
            lambda: chat.send(part or None, nonce=nonce, allowed_mentions=NONE,
                              suppress_embeds=True, **extra),
            paced=not spare,
        )  # fmt: skip
        return str(sent.id)

    async def edit(
        self, to: Address, message_id: str, part: str, key: str, *, spare: bool = False,
        **extra: Any,
    ) -> None:  # fmt: skip
        message = self._chat(to).get_partial_message(int(message_id))
        await self._call(
            "edit", f"edit:{to.chat_id}",
            lambda: message.edit(content=part, allowed_mentions=NONE, **extra), paced=not spare,
        )  # fmt: skip

    async def remove(self, to: Address, message_id: str) -> None:
        message = self._chat(to).get_partial_message(int(message_id))
        await self._call("delete", f"edit:{to.chat_id}", message.delete)

    def has_spare(self, to: Address, editing: bool) -> bool:
        return self.pacer.spare(f"{'edit' if editing else 'post'}:{to.chat_id}") == 0.0

    # -- what is Discord's own ------------------------------------------------------------
    def _buttons(self, message: OutboundMessage) -> discord.ui.View:
        """The prompt's buttons; the view is stopped before it is sent, so discord.py
        keeps no callback of its own for it: presses come to ``Inbound.pressed``."""
        view = discord.ui.View(timeout=None)
        for row, buttons in enumerate(message.buttons[:5]):
            for item in buttons[:5]:
                label = self.masker.mask(item.label)
                label = label if len(label) <= LABEL_MAX else label[: LABEL_MAX - 1] + "…"
                style = STYLES.get(item.action.split(":", 1)[0], discord.ButtonStyle.secondary)
                view.add_item(discord.ui.Button(label=label, custom_id=item.action[:100],
                                                style=style, row=row))  # fmt: skip
        view.stop()
        return view

    async def _prompt(self, to: Address, message: OutboundMessage) -> Receipt:
        """The gate's rendering (its first parts as messages of their own when long),
        its last part with the buttons; the message's id → its actions kept in the store
        before the receipt is returned."""
        parts = await richtext.rendered_parts(message.text, False, self.masker, TEXT)
        for index, part in enumerate(parts[:-1]):
            await self._first(message, f"{message.id}.{index}", part)
        key = f"{message.id}.{len(parts) - 1}"
        message_id = await self.post(to, parts[-1], key, view=self._buttons(message))
        await self.edge.keep_prompt(f"{to.chat_id}:{message_id}", message)
        return Receipt(channel_message_id=message_id)

    async def _edit(self, to: Address, message_id: str, message: OutboundMessage) -> Receipt:
        """An earlier message edited (an approval prompt showing its outcome: its
        buttons gone). A prompt in several messages keeps its call shown above: the
        one with the buttons says who decided and which request."""
        parts = await self.sends.parts(message)
        if len(parts) > 1 and message.approval is not None:
            view = message.approval
            outcome = f"{view.outcome}\n(the call as shown above)\nRequest {view.request_id}"
            parts = await richtext.rendered_parts(outcome, False, self.masker, TEXT)
        text = parts[0]
        try:
            await self.edit(to, message_id, text, message.id, view=None)
        except ChannelError as exc:
            if exc.retryable:
                raise
            # Gone (deleted): the outcome is posted instead, never lost.
            log.info("discord: the edit of %s in %s was refused (%s); posting it", message_id,
                     to, exc)  # fmt: skip
            return Receipt(channel_message_id=await self.post(to, text, message.id))
        return Receipt(channel_message_id=message_id)

    async def _upload(self, message: OutboundMessage, comment: str | None) -> str:
        """A file (``send_file``) posted into the conversation, the text's first part
        with it; its message's id."""
        assert message.file is not None
        file = message.file
        try:  # read off the loop
            data = await asyncio.to_thread(Path(file.path).read_bytes)
        except OSError as exc:
            raise ChannelError(
                f"cannot read {file.name}: {exc.strerror}", retryable=False
            ) from None
        upload = discord.File(io.BytesIO(data), filename=self.masker.mask(file.name))
        return await self.post(message.to, comment or "", f"{message.id}.file", file=upload)
