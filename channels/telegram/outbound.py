"""Sending: replies (in parts, formatted, paced), edits, files, and the Bot API's errors
mapped onto the delivery worker's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiogram import Bot
from aiogram.exceptions import (
    AiogramError,
    TelegramBadRequest,
    TelegramForbiddenError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
    TelegramUnauthorizedError,
)
from aiogram.types import (
    FSInputFile,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    ReplyParameters,
)

from echo_bot.bus import ChannelHost
from echo_bot.chat_sends import kept
from echo_bot.errors import ChannelError
from echo_bot.events import MediaKind, OutboundMessage, Receipt, TextFormat
from echo_bot.pacing import Pacer
from echo_bot.richtext.model import Formatted

from .common import Tasks, log
from .previews import Previews
from .render import keyboard_rows
from .text import entities, message_parts, rendered

T = TypeVar("T")

MAX_CAPTION = 1024  # UTF-16 units of a photo's or document's caption
PARTS_KEPT = 1_000  # messages whose parts sent before a failure are remembered


class Outbound:
    """What the delivery worker hands the channel, sent (``Channel.send``)."""

    def __init__(
        self,
        host: ChannelHost,
        bot: Bot,
        pacer: Pacer,
        previews: Previews,
        tasks: Tasks,
    ) -> None:
        self.bot = bot
        self.pacer = pacer
        self.previews = previews
        self.tasks = tasks
        self.masker = host.masker  # what the renderer made is masked again before it leaves
        self._parts_sent: dict[str, list[int]] = {}

    def _sent_of(self, message_id: str) -> list[int]:
        """The parts of ``message_id`` a failed try already sent (not sent again)."""
        return kept(self._parts_sent, message_id, list, PARTS_KEPT)

    async def send(self, message: OutboundMessage) -> Receipt:
        try:
            chat_id = int(message.to.chat_id)
        except ValueError:
            raise ChannelError(
                f"bad Telegram chat id {message.to.chat_id!r}", retryable=False
            ) from None
        try:
            return await self._send(chat_id, message)
        except ChannelError as exc:
            if exc.retry_after is not None:  # a flood wait: previews and typing wait too
                self.pacer.hold(str(chat_id), exc.retry_after)
            raise

    async def _send(self, chat_id: int, message: OutboundMessage) -> Receipt:
        thread = int(message.to.thread_id) if message.to.thread_id else None
        markup = _markup(message)
        if message.edit_of is not None and message.edit_message_id:
            return await self._edit(chat_id, int(message.edit_message_id), message.text, markup)
        if message.file is not None:
            return await self._send_file(chat_id, thread, message, markup)
        parts = await rendered(message.text, message.format == TextFormat.MARKDOWN, self.masker)
        sent = self._sent_of(message.id)
        preview = self.previews.message_of(message) if not sent else None
        if preview is not None:  # the reply takes the place of its preview message
            await self._into_preview(chat_id, preview, message, parts, markup, sent)
        reply_to = message.quote
        for index in range(len(sent), len(parts)):
            await self.pacer.wait(str(chat_id))
            last = index == len(parts) - 1
            part = parts[index]
            fields: dict[str, Any] = {
                "chat_id": chat_id,
                "text": part.text,
                "message_thread_id": thread,
                "reply_markup": markup if last else None,
                "reply_parameters": (
                    ReplyParameters(message_id=int(reply_to), allow_sending_without_reply=True)
                    if reply_to and reply_to.isdigit() and index == 0
                    else None
                ),
            }

            def request(entities_: bool, f: dict[str, Any] = fields, p: Formatted = part) -> Any:
                return self.bot.send_message(**f, entities=entities(p) if entities_ else None)

            result = await self._formatted_call(request, bool(part.spans))
            sent.append(result.message_id)
        self._parts_sent.pop(message.id, None)
        return Receipt(channel_message_id=str(sent[-1]))

    async def _into_preview(
        self,
        chat_id: int,
        preview: int,
        message: OutboundMessage,
        parts: list[Formatted],
        markup: InlineKeyboardMarkup | None,
        sent: list[int],
    ) -> None:
        """The reply's first part as an edit of the group preview message it replaces;
        if Telegram refuses the edit, the preview message goes and the part is sent anew."""
        await self.pacer.wait(str(chat_id))
        first = parts[0]
        await self.previews.unnote(message)
        try:
            await self._formatted_call(
                lambda entities_: self.bot.edit_message_text(
                    text=first.text, chat_id=chat_id, message_id=preview,
                    entities=entities(first) if entities_ else None,
                    reply_markup=markup if len(parts) == 1 else None,
                ),
                bool(first.spans),
            )  # fmt: skip
            sent.append(preview)
            self.previews.replaced(message)
        except ChannelError as exc:
            if exc.retryable:
                raise
            self.previews.replaced(message)
            self.tasks.spawn(self.previews.delete(chat_id, preview))
            log.info("telegram: the preview message was not edited (%s); sending anew", exc)

    async def _send_file(
        self,
        chat_id: int,
        thread: int | None,
        message: OutboundMessage,
        markup: InlineKeyboardMarkup | None,
    ) -> Receipt:
        """A document or photo (``send_file``), its text as the caption: what does not
        fit one (1,024 UTF-16 units: emoji count twice) follows as messages, and a caption
        whose formatting Telegram refuses goes plain, as a text does."""
        assert message.file is not None
        path = Path(message.file.path)
        if not await asyncio.to_thread(path.is_file):
            raise ChannelError(f"the file to send is gone ({message.file.name})", retryable=False)
        parts: list[Formatted] = []
        if message.text.strip():
            markdown = message.format == TextFormat.MARKDOWN
            parts = message_parts(message.text, markdown, self.masker, limit=MAX_CAPTION)
        sent = self._sent_of(message.id)  # the file's id, then the rest's
        if not sent:
            sent.append(await self._upload(chat_id, thread, message, parts[:1],
                                           markup if len(parts) <= 1 else None))  # fmt: skip
        for index in range(len(sent), len(parts)):
            await self.pacer.wait(str(chat_id))
            part, last = parts[index], index == len(parts) - 1

            def request(entities_: bool, p: Formatted = part, last: bool = last) -> Any:
                return self.bot.send_message(
                    chat_id=chat_id, text=p.text, message_thread_id=thread,
                    reply_markup=markup if last else None,
                    entities=entities(p) if entities_ else None,
                )  # fmt: skip

            sent.append((await self._formatted_call(request, bool(part.spans))).message_id)
        self._parts_sent.pop(message.id, None)
        return Receipt(channel_message_id=str(sent[0]))

    async def _upload(
        self,
        chat_id: int,
        thread: int | None,
        message: OutboundMessage,
        caption: list[Formatted],
        markup: InlineKeyboardMarkup | None,
    ) -> int:
        """The file with its caption (a photo refused as one goes as a document)."""
        assert message.file is not None
        first = caption[0] if caption else None
        name = self.masker.mask(message.file.name)  # a name is text the chat shows too
        upload = FSInputFile(Path(message.file.path), filename=name)
        kinds = ["photo", "document"] if message.file.kind == MediaKind.PHOTO else ["document"]
        await self.pacer.wait(str(chat_id))
        for kind in kinds:

            def request(entities_: bool, kind: str = kind) -> Any:
                fields: dict[str, Any] = {
                    "chat_id": chat_id, "message_thread_id": thread, "reply_markup": markup,
                    "caption": first.text if first else None,
                    "caption_entities": entities(first) if first and entities_ else None,
                }  # fmt: skip
                if kind == "photo":
                    return self.bot.send_photo(photo=upload, **fields)
                return self.bot.send_document(document=upload, **fields)

            try:
                result = await self._formatted_call(request, bool(first and first.spans))
                return int(result.message_id)
            except ChannelError as exc:
                if exc.retryable or kind == kinds[-1]:
                    raise
                log.info("telegram: the photo was refused (%s); sending it as a document", exc)
        raise AssertionError("unreachable: the last kind raises")

    async def _edit(
        self, chat_id: int, message_id: int, text: str, markup: InlineKeyboardMarkup | None
    ) -> Receipt:
        await self.pacer.wait(str(chat_id))
        try:
            await call(
                self.bot.edit_message_text(
                    text=message_parts(text, False, self.masker)[0].text,
                    chat_id=chat_id,
                    message_id=message_id,
                    reply_markup=markup,
                )
            )
        except ChannelError as exc:
            if exc.retryable:
                raise
            # Too old, not modified, deleted: the decision stands; the edit is cosmetic.
            log.info("telegram: edit of message %s in %s refused: %s", message_id, chat_id, exc)
        return Receipt(channel_message_id=str(message_id))

    async def _formatted_call(self, request: Callable[[bool], Awaitable[T]], formatted: bool) -> T:
        """Send with entities; if Telegram refuses them, the same text plain (the
        fallback for anything the renderer got wrong: a reply is never lost to it)."""
        try:
            return await call(request(formatted))
        except ChannelError as exc:
            if not formatted or exc.retryable or "entit" not in str(exc).lower():
                raise
            log.warning("telegram: formatting refused (%s); sending plain text", exc)
        return await call(request(False))


def _markup(message: OutboundMessage) -> InlineKeyboardMarkup | None:
    rows = keyboard_rows(message.buttons)
    if not rows:
        return None
    return InlineKeyboardMarkup(
        inline_keyboard=[
            [InlineKeyboardButton(text=label, callback_data=data) for label, data in row]
            for row in rows
        ]
    )


async def call(request: Awaitable[T]) -> T:
    """Await a Bot API call, mapping its errors onto the delivery worker's."""
    try:
        return await request
    except TelegramRetryAfter as exc:
        raise ChannelError("rate limited (429)", retry_after=float(exc.retry_after)) from None
    except TelegramForbiddenError as exc:
        raise ChannelError(f"forbidden: {exc.message}", retryable=False) from None
    except TelegramBadRequest as exc:
        raise ChannelError(f"bad request: {exc.message}", retryable=False) from None
    except (TelegramServerError, TelegramNetworkError, TimeoutError, OSError) as exc:
        raise ChannelError(f"network or server error: {exc}") from None
    except TelegramUnauthorizedError:
        raise ChannelError("the Bot API rejected the token (401)") from None
    except AiogramError as exc:  # e.g. an unreadable answer (ClientDecodeError)
        raise ChannelError(f"Bot API error: {exc}") from None
