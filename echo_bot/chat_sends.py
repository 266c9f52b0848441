"""Sending to a network whose messages can be edited (Matrix, Slack): what every such
channel's outbound does alike, written once. The channel says how its network posts,
edits and removes one message (``EditableChat``); this sends a message's text in parts
through the core's pipeline (``richtext.parts``: rendered, masked against what a person
will see, split within the channel's limit), each part once, and shows a reply while it
is written (``EditedPreviews``).

- **Each part once.** The parts already sent of a long reply are remembered until it is
  whole: when a later part fails and the delivery worker tries the message again, the
  send goes on after them. Each part's key (``<outbound id>.<index>``) is the same at
  every try, for a network that answers a repeated key with the message it made.
- **The reply takes its preview's place.** A reply whose turn left a preview is edited
  into it (its first part); refused for good, the preview is removed and the part sent
  anew.
- **Previews only from spare budget** (``EditableChat.has_spare``), tried once.
- **A file** is uploaded once; the text after it goes on in parts as a reply's does.
  What a channel posts ahead of a message's parts (Discord: long code's files, a long
  prompt's first parts) goes through ``ahead``: once as well.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from .background import Tasks
from .bus import Masking
from .edited_previews import EditedPreviews
from .errors import ChannelError
from .events import Address, OutboundKind, OutboundMessage, Receipt, TextFormat
from .preview_ledger import PreviewLedger
from .richtext import parts as richtext

log = logging.getLogger(__name__)

Part = TypeVar("Part")
PREVIEW_MARK = " ✍️"  # ends the preview message while the reply is written
PREVIEW_KEEP = 30.0  # seconds a preview no reply took the place of is kept, then removed
# Sends whose parts (or posts ahead) are remembered until they are whole; past it the
# oldest are forgotten: a send that failed for good is never tried again, and its entry
# would otherwise stay for the daemon's life.
MAX_KEPT = 10_000
Kept = TypeVar("Kept")


class EditableChat(Protocol[Part]):
    """How a network posts, edits and removes one message (the channel's)."""

    @property
    def renderer(self) -> richtext.Renderer[Part]: ...

    async def post(
        self, to: Address, part: Part, key: str, *, quote: str | None = None,
        notice: bool = False, spare: bool = False,
    ) -> str:  # fmt: skip
        """One message in ``to``; its id. ``key`` is the same at every try of it;
        ``quote``: the message it answers; ``notice``: the bot's own notice, not a
        reply; ``spare``: a preview's, counted by ``has_spare`` already, tried once."""
        ...

    async def edit(
        self, to: Address, message_id: str, part: Part, key: str, *, spare: bool = False
    ) -> None:
        """Message ``message_id`` shows ``part`` from now on."""
        ...

    async def remove(self, to: Address, message_id: str) -> None:
        """Message ``message_id`` goes (a preview no reply took the place of)."""
        ...

    def has_spare(self, to: Address, editing: bool) -> bool:
        """Whether a post (or an edit) in ``to`` now waits for nothing: counted when so."""
        ...


class ChatSends(Generic[Part]):
    def __init__(
        self,
        chat: EditableChat[Part],
        masker: Masking,
        tasks: Tasks,
        *,
        interval: float,
        ready: Callable[[], bool] = lambda: True,
        file_carries_text: bool = False,
        ledger: PreviewLedger | None = None,
    ) -> None:
        self.chat = chat
        self.masker = masker
        # Whether an upload carries the text's first part (Slack's comment), or the
        # text follows the file as messages of its own (Matrix: a caption shows poorly).
        self.file_carries_text = file_carries_text
        self.previews = EditedPreviews(
            self._show, self._remove, tasks, interval=interval, mark=PREVIEW_MARK,
            keep=PREVIEW_KEEP, ready=ready, ledger=ledger,
        )  # fmt: skip
        self._sent: dict[str, list[str]] = {}  # outbound id → the parts' message ids
        self._ahead: dict[str, dict[str, str]] = {}  # outbound id → key → message id
        self._left_over: list[tuple[Address, str]] = []  # previews the last run left up

    async def send(
        self, message: OutboundMessage, *, edit: Callable[[str], Awaitable[Receipt]],
        prompt: Callable[[], Awaitable[Receipt]], upload: Callable[[Part | None], Awaitable[str]],
        reply: Callable[[OutboundMessage], Awaitable[Receipt]] | None = None,
    ) -> Receipt:  # fmt: skip
        """``message`` as its kind asks, the network's part of each given: an earlier
        message edited (``edit(its id)``: a prompt's outcome), an approval prompt
        (``prompt()``), a file (``upload``) and its text, or a reply (``reply``, else in
        parts)."""
        if message.edit_of is not None and message.edit_message_id:
            receipt = await edit(message.edit_message_id)
        elif message.kind == OutboundKind.APPROVAL and message.buttons:
            receipt = await prompt()
        elif message.file is not None:
            receipt = await self.with_file(message, upload)
        else:
            receipt = await (reply or self.reply)(message)
        self._ahead.pop(message.id, None)
        return receipt

    async def ahead(
        self, message: OutboundMessage, key: str, post: Callable[[], Awaitable[str]]
    ) -> str:
        """``post()`` of a message sent ahead of ``message``'s parts, once: not again
        when a later part failed and the send is tried again (after the network forgot
        ``key``'s idempotency, as Discord does a nonce within minutes)."""
        posted = kept(self._ahead, message.id, dict)
        if key not in posted:
            posted[key] = await post()
        return posted[key]

    async def parts(self, message: OutboundMessage) -> list[Part]:
        markdown = message.format == TextFormat.MARKDOWN
        return await richtext.rendered_parts(message.text, markdown, self.masker,
                                             self.chat.renderer)  # fmt: skip

    async def reply(self, message: OutboundMessage) -> Receipt:
        """A reply or notice, its text in parts (see the module's docstring)."""
        parts = await self.parts(message)
        sent = kept(self._sent, message.id, list)
        preview = self.previews.message_of(message) if not sent else None
        if preview is not None:
            await self._into_preview(message, preview, parts[0], sent)
        await self._rest(message, parts, sent, len(sent))
        return Receipt(channel_message_id=sent[-1])

    async def with_file(
        self, message: OutboundMessage, upload: Callable[[Part | None], Awaitable[str]]
    ) -> Receipt:
        """``upload(first part or None)`` once (the file's message id), then the rest of
        the text after it."""
        parts = await self.parts(message) if message.text.strip() else []
        sent = kept(self._sent, message.id, list)
        carried = int(self.file_carries_text and bool(parts))
        if not sent:  # not uploaded again when only the text after it failed
            sent.append(await upload(parts[0] if carried else None))
        await self._rest(message, parts, sent, len(sent) - 1 + carried)
        return Receipt(channel_message_id=sent[0] or None)

    async def _rest(
        self, message: OutboundMessage, parts: list[Part], sent: list[str], start: int
    ) -> None:
        notice = message.kind == OutboundKind.NOTICE
        for index in range(start, len(parts)):
            quote = message.quote if index == 0 and message.file is None else None
            key = f"{message.id}.{index}"
            sent.append(await self.chat.post(message.to, parts[index], key, quote=quote,
                                             notice=notice))  # fmt: skip
        self._sent.pop(message.id, None)

    async def _into_preview(
        self, message: OutboundMessage, preview: str, first: Part, sent: list[str]
    ) -> None:
        """The reply's first part as an edit of the preview it replaces; refused for
        good, the preview is removed and the part sent anew."""
        await self.previews.unnote(message)
        try:
            await self.chat.edit(message.to, preview, first, f"{message.id}.edit")
            sent.append(preview)
        except ChannelError as exc:
            if exc.retryable:
                raise
            log.info("the preview in %s was not edited (%s); sending anew", message.to, exc)
            await self._remove(message.to, preview)
        self.previews.replaced(message)

    async def read_left_over(self) -> None:
        """At the channel's start, before any preview: what the last run left up."""
        ledger = self.previews.ledger
        self._left_over = await ledger.left_over() if ledger is not None else []

    async def remove_left_over(self) -> None:
        """Once connected: the preview messages a daemon killed mid-stream left
        (``PreviewLedger``) go; the turn, run again, answers in a message of its own."""
        left, self._left_over = self._left_over, []
        for to, message_id in left:
            await self._remove(to, message_id)

    async def _remove(self, to: Address, message_id: str) -> None:
        try:
            await self.chat.remove(to, message_id)
        except Exception as exc:  # what is left is a stale preview, never a lost reply
            log.info("%s in %s was not removed: %s", message_id, to, exc)

    async def _show(
        self, to: Address, key: str, message_id: str | None, text: str, shown: int
    ) -> str | None:
        """One text of a preview, only from spare budget (None: not now), tried once."""
        part = await richtext.rendered_preview(text, self.masker, self.chat.renderer)
        if part is None or not self.chat.has_spare(to, message_id is not None):
            return None
        if message_id is None:
            return await self.chat.post(to, part, f"{key}.preview.{shown}", spare=True)
        await self.chat.edit(to, message_id, part, f"{key}.preview.{shown}", spare=True)
        return message_id


def kept(
    table: dict[str, Kept], key: str, new: Callable[[], Kept], limit: int | None = None
) -> Kept:
    """``table[key]``, made by ``new()`` when missing; the oldest entries go past
    ``limit`` (MAX_KEPT: what a send that failed for good left is never asked for again)."""
    if key not in table:
        while len(table) >= (MAX_KEPT if limit is None else limit):
            del table[next(iter(table))]
        table[key] = new()
    return table[key]
