"""The handlers of the updates aiogram's Dispatcher feeds: messages (commands, access,
pairing, media) and button presses (approval decisions). Each authorises, builds an
InboundMessage and publishes it; a publish the store did not take raises CommitFailed,
which reaches the poller or the webhook through ``Dispatcher.feed_update`` so the update
is not acknowledged.

Commands are parsed here, not with aiogram's ``Command`` filter: in a group the bot's
``@username`` is taken out anywhere in the text before the command is read ("@bot /pair
CODE"), any ``/cmd@otherbot`` counts as ``/cmd``, and the filter would ask ``getMe``
again through ``Bot.me()``; the filter does none of that the same way.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from aiogram import Bot, Router
from aiogram.exceptions import TelegramAPIError
from aiogram.types import CallbackQuery, Message, Update

from echo_bot.bus import ChannelHost
from echo_bot.edge import NOT_APPROVER
from echo_bot.events import (
    Address,
    ApprovalDecision,
    DecisionInbound,
    InboundStatus,
    MessageInbound,
    Sender,
    parse_approval_action,
)

from .common import Me, Tasks, log
from .media import read_media
from .previews import Previews
from .settings import TelegramConfig
from .text import clean

# Commands answered before the sender's access is checked.
_OPEN_COMMANDS = ("/whoami", "/pair")
ANSWERED_KEPT = 1_000  # update ids of notices answered without an inbox row, remembered


# A command as Telegram reads one: /word, at most 32 letters, digits or _, maybe @bot.
_COMMAND = re.compile(r"^/[A-Za-z0-9_]{1,32}(?:@(?P<bot>[A-Za-z0-9_]{1,64}))?(?:\s|$)")


def command_of(text: str | None) -> str:
    """The command a message's text begins with, lower case and without ``@bot``; ""."""
    return (text or "").split(maxsplit=1)[0].split("@", 1)[0].lower() if text else ""


def address_of(message: Message) -> Address:
    thread = message.message_thread_id if message.is_topic_message else None
    return Address(
        channel="telegram",
        chat_id=str(message.chat.id),
        thread_id=str(thread) if thread else None,
    )


class Handlers:
    """Telegram updates in, InboundMessages out."""

    def __init__(
        self,
        config: TelegramConfig,
        host: ChannelHost,
        bot: Bot,
        me: Me,
        tasks: Tasks,
    ) -> None:
        self.config = config
        self.bot = bot
        self.me = me
        self.tasks = tasks
        self.access = host.access
        self._answered: OrderedDict[int, None] = OrderedDict()  # updates answered, newest last
        self.bus = host.bus
        self.edge = host.edge("telegram", pair_as="as /pair CODE")

    def router(self, previews: Previews) -> Router:
        router = Router(name="echo-bot")
        router.message.register(self._on_message)
        router.edited_message.register(self._on_edited)
        router.callback_query.register(self._on_callback)
        router.stopped_message_generation.register(previews.on_stop)
        return router

    async def _notice(self, chat: Address, text: str, reply_to: int | None = None) -> None:
        await self.edge.notice(chat, text, quote=str(reply_to) if reply_to else None)

    # -- messages ---------------------------------------------------------------------------
    async def _on_message(self, message: Message, event_update: Update) -> None:
        user = message.from_user
        if user is None or user.is_bot:
            return
        if message.chat.type != "private" and not self._addressed_to_me(message):
            return
        chat = address_of(message)
        text = self._text(message)
        command = command_of(text)
        if command in _OPEN_COMMANDS:
            if self._answered_before(event_update.update_id):
                return
            await self._open_command(command, message, chat, text or "")
            return
        if command == "/start" and await self.access.is_allowed("telegram", str(user.id)):
            if not self._answered_before(event_update.update_id):
                await self._notice(
                    chat, "Hello! Ask me anything, or send /help to see what I can do."
                )
            return
        await self._take(message, event_update, chat, text)  # a stranger is answered there

    def _answered_before(self, update_id: int) -> bool:
        """Whether this update was answered already: what is answered without an inbox
        row (/whoami, /pair, /start) is not answered again when Telegram delivers the
        update again (a webhook retry; "Paired", then "You are already allowed")."""
        if update_id in self._answered:
            return True
        self._answered[update_id] = None
        while len(self._answered) > ANSWERED_KEPT:
            self._answered.popitem(last=False)
        return False

    def _text(self, message: Message) -> str | None:
        """The text (or caption) as the agent reads it: clean, and in a group without
        the bot's own ``@username``."""
        given = message.text if message.text is not None else message.caption
        text = clean(given) if given is not None else None
        if text is not None and message.chat.type != "private" and self.me.username:
            mention = re.escape(f"@{self.me.username}")
            text = re.sub(mention, "", text, flags=re.IGNORECASE).strip()  # as it matched
        return text

    async def _open_command(self, command: str, message: Message, chat: Address, text: str) -> None:
        """/whoami and /pair: for anyone, allowed or not."""
        assert message.from_user is not None
        if command == "/whoami":
            user_id = message.from_user.id
            await self._notice(chat, f"Your Telegram user id is {user_id}.", message.message_id)
        else:
            await self._pair(message, chat, text)

    async def _take(
        self, message: Message, event_update: Update, chat: Address, text: str | None
    ) -> None:
        """A message, with its files and notes, into the inbox (the edge answers a
        stranger instead)."""
        user = message.from_user
        assert user is not None
        attachments, notes = read_media(message, self.config)
        if not attachments and not notes and text is None:
            kind = str(getattr(message.content_type, "value", message.content_type))
            kind = kind.replace("_", " ")
            notes = [f"[a message of a kind I cannot read: {kind}]"]
        text = "\n".join(part for part in [text, *notes] if part) or None
        inbound = MessageInbound(
            address=chat,
            sender=Sender(id=str(user.id), name=clean(user.username or user.full_name)),
            text=text,
            attachments=attachments,
            external_id=str(event_update.update_id),
            message_id=str(message.message_id),
        )
        await self.edge.take(inbound)

    def _addressed_to_me(self, message: Message) -> bool:
        text = message.text or message.caption or ""
        command = _COMMAND.match(text)
        if command is not None:  # "/help", "/help@us"; not "/etc/hosts", "/start@another_bot"
            target = command.group("bot")
            return target is None or target.lower() == (self.me.username or "").lower()
        if self.me.username and f"@{self.me.username}".lower() in text.lower():
            return True
        replied = message.reply_to_message
        return bool(replied and replied.from_user and replied.from_user.id == self.me.bot_id)

    async def _on_edited(self, edited_message: Message) -> None:
        return None  # edits of earlier messages are not re-run

    async def _pair(self, message: Message, chat: Address, text: str) -> None:
        assert message.from_user is not None
        parts = text.split(maxsplit=1)
        if len(parts) < 2 or len(parts[1]) > 32:
            await self._notice(chat, "Send /pair followed by the code from `echo-bot pair`.")
            return
        answer = await self.edge.pair(str(message.from_user.id), parts[1])
        await self._notice(chat, answer, message.message_id)

    # -- button presses ---------------------------------------------------------------------
    async def _on_callback(self, callback_query: CallbackQuery, event_update: Update) -> None:
        query = callback_query
        parsed = parse_approval_action(query.data or "")
        message = query.message
        if parsed is None:
            self.tasks.spawn(self._answer(query.id, "Unknown or expired request."))
            return
        if message is None:
            self.tasks.spawn(
                self._answer(query.id, "This button is no longer attached to a message.")
            )
            return
        if not self.edge.approves(str(query.from_user.id)):  # nothing stored: a popup, theirs
            self.tasks.spawn(self._answer(query.id, NOT_APPROVER))
            return
        verb, request_id, seconds = parsed
        chat = Address(channel="telegram", chat_id=str(message.chat.id))
        # An InaccessibleMessage (too old for Telegram to show) has neither.
        thread = getattr(message, "message_thread_id", None)
        if thread and getattr(message, "is_topic_message", False):
            chat = Address(channel="telegram", chat_id=chat.chat_id, thread_id=str(thread))
        presser = query.from_user
        decision = ApprovalDecision(
            request_id=request_id,
            verb=verb,
            decided_by=chat,
            sender_id=str(presser.id),
            via="telegram",
            allow_for_seconds=seconds,
            answered=True,  # the button's popup says the outcome (_answer_outcome)
        )
        inbound_id = await self.edge.take(
            DecisionInbound(
                address=chat,
                sender=Sender(
                    id=str(presser.id), name=clean(presser.username or presser.full_name)
                ),
                decision=decision,
                external_id=str(event_update.update_id),
                metadata={"callback_query_id": query.id},
            )
        )
        self.tasks.spawn(self._answer_outcome(query.id, inbound_id))

    async def _answer_outcome(self, query_id: str, inbound_id: str | None) -> None:
        state = await self.bus.at_rest(inbound_id, timeout=2.5) if inbound_id else None
        if state is None or not state[0].terminal:
            text = "Received."
        elif state[0] == InboundStatus.DONE:
            text = "Done."
        else:
            text = f"⚠️ {state[1] or 'Refused.'}"
        await self._answer(query_id, text)

    async def _answer(self, query_id: str, text: str) -> None:
        try:
            await self.bot.answer_callback_query(query_id, text=text[:200])
        except (TelegramAPIError, OSError, TimeoutError) as exc:
            log.info("telegram: could not answer a button press: %s", exc)
