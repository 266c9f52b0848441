"""The messages that cross the bus. A leaf module: stdlib and pydantic only."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


def new_id() -> str:
    """An opaque, unguessable id (also safe inside Telegram callback data): 32 hex digits,
    the first 12 the time in milliseconds, the rest 80 random bits.

    Time first, as in UUIDv7, so ids made one after another sort together: a new row's
    key then lands on the same index page as the previous one's, instead of dirtying a
    random page of every id index in every commit."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_bytes(10).hex()}"


def is_new_id(value: str) -> bool:
    """Whether ``value`` has ``new_id``'s shape: made here, so no stored row has it yet
    (a model's call id never has it: ``openai_brain`` renames one that would)."""
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def id_time(value: str) -> float | None:
    """When an id made by ``new_id`` was made (seconds since the epoch); None for an id
    of another shape."""
    if len(value) != 32:
        return None
    try:
        return int(value[:12], 16) / 1000
    except ValueError:
        return None


def utcnow() -> datetime:
    return datetime.now(UTC)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_whole_chat_ids(channel: str) -> bool:
    return False


# Whether a channel's chat ids hold colons of their own (a Matrix room, !opaque:server):
# then the rest of its address is the chat id, never chat:thread. Set from the installed
# channels' specs by echo_bot.plugins (imported by the config, before any address is
# read); this leaf module names no channel.
whole_chat_id: Callable[[str], bool] = _no_whole_chat_ids


class Address(_Model):
    """Where a message comes from or goes to: ``channel:chat_id[:thread_id]``."""

    channel: str
    chat_id: str
    thread_id: str | None = None

    @classmethod
    def parse(cls, text: str) -> Address:
        channel, sep, rest = text.partition(":")
        if not sep or not channel or not rest:
            raise ValueError(f"address {text!r} is not of the form channel:chat_id")
        if whole_chat_id(channel):  # a room ID has a colon of its own (!opaque:server)
            return cls(channel=channel, chat_id=rest)
        chat_id, _, thread = rest.partition(":")
        return cls(channel=channel, chat_id=chat_id, thread_id=thread or None)

    def __str__(self) -> str:
        base = f"{self.channel}:{self.chat_id}"
        return f"{base}:{self.thread_id}" if self.thread_id else base

    @property
    def session_key(self) -> str:
        return str(self)


class Sender(_Model):
    id: str
    name: str = ""


class InboundKind(StrEnum):
    MESSAGE = "message"
    TOOL_CALL = "tool_call"
    APPROVAL_DECISION = "approval_decision"


class InboundStatus(StrEnum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    DONE = "done"
    FAILED = "failed"
    DENIED = "denied"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = {InboundStatus.DONE, InboundStatus.FAILED, InboundStatus.DENIED, InboundStatus.EXPIRED}


class DecisionVerb(StrEnum):
    APPROVE_ONCE = "approve_once"
    ALLOW_FOR = "allow_for"
    DENY = "deny"


class ApprovalDecision(_Model):
    request_id: str
    verb: DecisionVerb
    decided_by: Address
    sender_id: str
    via: str
    allow_for_seconds: int | None = None
    decided_at: datetime = Field(default_factory=utcnow)
    # The deciding channel tells the decider the outcome itself (a button's popup, the
    # admin command's output), so a refusal sends no notice to the chat.
    answered: bool = False

    @property
    def allow_for(self) -> timedelta | None:
        return timedelta(seconds=self.allow_for_seconds) if self.allow_for_seconds else None


class ToolCallRequest(_Model):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class MediaKind(StrEnum):
    PHOTO = "photo"
    VOICE = "voice"
    AUDIO = "audio"
    VIDEO = "video"
    VIDEO_NOTE = "video_note"
    ANIMATION = "animation"
    DOCUMENT = "document"


class Attachment(_Model):
    """A file sent with a message, by reference: the channel's id of it (a Telegram
    ``file_id``) is committed with the message, and the file is fetched during the turn,
    so a crash before the download loses nothing."""

    kind: MediaKind
    file_ref: str = Field(max_length=512)
    name: str | None = Field(None, max_length=256)
    mime_type: str | None = Field(None, max_length=128)
    size: int | None = Field(None, ge=0)  # bytes, as the channel announced it
    duration: int | None = Field(None, ge=0)  # seconds (voice, audio, video)


# The metadata key by which a channel says a chat is the sender's alone with the bot
# (``Inbound.direct``); only channels set metadata, never from what a peer sends.
DIRECT = "direct"


class Inbound(_Model):
    """What every inbound has, whatever it asks: where it came from, who sent it, the
    dedup key (channel, ``external_id``) and where its answer goes."""

    id: str = Field(default_factory=new_id)
    address: Address
    sender: Sender
    received_at: datetime = Field(default_factory=utcnow)
    external_id: str | None = None
    # Where the results go instead of back to ``address`` (a route's or job's
    # deliver_to).
    deliver_to: Address | None = None
    # The channel's own id of this message: what the answer quotes in the same chat.
    message_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    trace_id: str = Field(default_factory=new_id)

    @property
    def session_key(self) -> str:
        return self.address.session_key

    @property
    def direct(self) -> bool:
        """The channel that received it knows the chat is the sender's alone with the
        bot (``metadata[DIRECT]``: a Matrix room of two members, where a room's ID never
        says so). A metadata key rather than a field, so a row stored by this version
        reads on a daemon of the one before (several daemons upgraded one at a time)."""
        return self.metadata.get(DIRECT) is True

    @property
    def answer_to(self) -> Address:
        """Where this inbound's answer goes (webhook and cron may send it elsewhere)."""
        return self.deliver_to or self.address

    @property
    def quoted_by_answer(self) -> str | None:
        """The message an answer quotes: this one, when the answer goes to its chat."""
        return self.message_id if self.answer_to == self.address else None


class MessageInbound(Inbound):
    """Something someone wrote (or a route's or job's prompt): the brain answers it."""

    kind: Literal[InboundKind.MESSAGE] = InboundKind.MESSAGE
    text: str | None = None
    attachments: list[Attachment] = Field(default_factory=list, max_length=10)


class ToolCallInbound(Inbound):
    """One tool call asked for directly (a webhook route's or cron job's ``tool``)."""

    kind: Literal[InboundKind.TOOL_CALL] = InboundKind.TOOL_CALL
    tool_call: ToolCallRequest


class DecisionInbound(Inbound):
    """An approver's decision on a pending request (a button, a command, the admin)."""

    kind: Literal[InboundKind.APPROVAL_DECISION] = InboundKind.APPROVAL_DECISION
    decision: ApprovalDecision


# An inbox row's message: one of the three, told apart by ``kind``.
InboundMessage = Annotated[
    MessageInbound | ToolCallInbound | DecisionInbound, Field(discriminator="kind")
]
INBOUND = TypeAdapter[InboundMessage](InboundMessage)


class Button(_Model):
    label: str
    action: str


class OutboundKind(StrEnum):
    REPLY = "reply"
    REMINDER = "reminder"
    APPROVAL = "approval"
    NOTICE = "notice"


class TextFormat(StrEnum):
    """How a channel may show an outbound's text: as written, or rendered from Markdown
    (model replies; a channel without formatting shows the Markdown as written)."""

    PLAIN = "plain"
    MARKDOWN = "markdown"


class OutboundFile(_Model):
    """A file sent with an outbound (its text is the caption): a copy made when the
    sending was decided, sent from there and deleted once delivered or failed."""

    path: str
    name: str = Field(max_length=256)
    kind: MediaKind = MediaKind.DOCUMENT  # PHOTO or DOCUMENT
    size: int = Field(ge=0)


class ApprovalView(_Model):
    """What an approval prompt, or its edit once decided, is about: for a channel that
    renders the request itself (the terminal asks "Approve …? [y/N]")."""

    request_id: str
    risk: str | None = None
    expires_at: float | None = None
    call: str | None = None  # the call as the gate shows it, complete (None: too long)
    outcome: str | None = None  # on the edit after the decision ("✅ Approved by …")


class OutboundMessage(_Model):
    id: str = Field(default_factory=new_id)
    to: Address
    text: str
    buttons: list[list[Button]] = Field(default_factory=list)
    kind: OutboundKind = OutboundKind.REPLY
    format: TextFormat = TextFormat.PLAIN
    file: OutboundFile | None = None
    approval: ApprovalView | None = None  # on approval prompts and their edits
    quote: str | None = None  # the channel's id of the message this one quotes
    edit_of: str | None = None
    # Filled by the delivery worker from the receipt of ``edit_of``: the channel's own id
    # of the message to edit. Channels never look receipts up themselves.
    edit_message_id: str | None = None
    trace_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Receipt(_Model):
    """What a channel returns for a delivered outbound: its own id of the message."""

    channel_message_id: str | None = None


def approval_action(verb: DecisionVerb, request_id: str, seconds: int | None = None) -> str:
    """A button action for an approval: opaque id + verb, short enough for any channel."""
    return f"{verb.value}:{request_id}" + (f":{seconds}" if seconds else "")


_SECONDS = re.compile(r"[0-9]{1,7}")
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")


def parse_approval_action(action: str) -> tuple[DecisionVerb, str, int | None] | None:
    """The inverse of ``approval_action``; None for anything malformed."""
    parts = action.split(":")
    if len(parts) not in (2, 3) or len(action) > 64:
        return None
    try:
        verb = DecisionVerb(parts[0])
    except ValueError:
        return None
    request_id = parts[1]
    if not _REQUEST_ID.fullmatch(request_id):
        return None
    seconds = None
    if len(parts) == 3:
        if verb is not DecisionVerb.ALLOW_FOR or not _SECONDS.fullmatch(parts[2]):
            return None
        seconds = int(parts[2])
        if not 0 < seconds <= 7 * 86400:
            return None
    elif verb is DecisionVerb.ALLOW_FOR:
        return None
    return verb, request_id, seconds
