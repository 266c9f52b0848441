"""What Slack delivers, as inbounds: direct messages and mentions become
``MessageInbound`` (external_id: the event's ``event_id``, so a redelivered envelope
or an HTTP retry is the same inbound), a button press on a prompt a ``DecisionInbound``.
``take`` returns once the inbound is committed; only then does the transport
acknowledge (the envelope ack, or the HTTP 200).

Taken: ``message`` events in direct messages (``channel_type == "im"``) and
``app_mention`` events in channels (the allowlist ``[slack] channels`` when set); a
mention's reply goes to the thread it was made in (a thread is a conversation of its
own). Left alone: the bot's own and other bots' messages, edits and deletions, channel
messages that do not mention the bot (Slack sends those as ``app_mention`` too when
they do). A stranger is answered once per REFUSAL_INTERVAL with their user ID and how
to get in; ``pair CODE`` pairs them.

Commands: Slack keeps ``/word`` for its own slash commands, so echo-bot's are typed
with ``!`` (``!help``, ``!tools``): a message starting ``!`` and a known command name
is that command.
"""

from __future__ import annotations

import re
from typing import Any

from channels.parts import clean
from echo_bot.bus import ChannelEdge, ChannelHost
from echo_bot.events import (
    DIRECT,
    Address,
    MessageInbound,
    Sender,
)

from .common import Tasks, address_of
from .formatting import unescaped
from .media import read_files
from .settings import SlackConfig

NAMES_MAX = 10_000  # users' display names remembered
MAX_TEXT = 40_000  # characters of a message's text taken (Slack's own limit)
_MARKUP = re.compile(r"<([^<>]*)>")  # a link, a mention: what a person typed is &lt; &gt;
_TS = re.compile(r"^[0-9]{1,12}\.[0-9]{1,9}$")
_ID = re.compile(r"^[A-Z0-9]{2,32}$")
# The message subtypes that are something a person wrote (edits, joins… are not).
TAKEN_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Inbound:
    def __init__(
        self,
        config: SlackConfig,
        host: ChannelHost,
        edge: ChannelEdge,
        tasks: Tasks,
        bot_user_id: str,
    ) -> None:
        self.config = config
        self.host = host
        self.tasks = tasks
        self.bot_user_id = bot_user_id
        self.names: dict[str, str] = {}  # user ID → display name (as the press said)
        self.edge = edge

    async def take(self, kind: str, payload: Any) -> None:
        """One delivery: an ``events_api`` event_callback or an ``interactive`` payload.
        Raises ``CommitFailed`` when the store could not be asked or could not take it
        (an allowlist read, a prompt's actions, the inbound itself): then it is not
        acknowledged."""
        if not isinstance(payload, dict):
            return
        if kind == "events_api" and payload.get("type") == "event_callback":
            await self._event(payload)
        elif kind == "interactive" and payload.get("type") == "block_actions":
            await self._press(payload)

    # -- messages -------------------------------------------------------------------------
    async def _event(self, payload: dict[str, Any]) -> None:
        event, event_id = payload.get("event"), _str(payload.get("event_id"))
        if not isinstance(event, dict) or not event_id:
            return
        wanted = self._answered(event)
        if wanted is None:
            return
        channel, user, ts = wanted
        direct = channel.startswith("D")
        thread = _str(event.get("thread_ts"))
        chat = address_of(channel, thread if thread and _TS.match(thread) else None)
        text = self._text(event)
        attachments, notes = read_files(event, self.config)
        body = "\n".join(part for part in [text, *notes] if part) or None
        await self.edge.take(
            MessageInbound(
                address=chat,
                sender=Sender(id=user, name=self.names.get(user, "")),
                text=body,
                attachments=attachments,
                external_id=event_id,
                message_id=ts,
                metadata={DIRECT: True} if direct else {},
            )
        )

    def _answered(self, event: dict[str, Any]) -> tuple[str, str, str] | None:
        """(conversation, user, ts) of an event the bot answers; None for the rest: ids
        malformed, its own and other bots' messages, in a channel anything but a mention,
        edits and joins, a conversation outside ``[slack] channels``."""
        channel, user, ts = (_str(event.get(key)) for key in ("channel", "user", "ts"))
        if not channel or not user or not ts or not _ID.match(channel) or not _TS.match(ts):
            return None
        if event.get("bot_id") or user == self.bot_user_id:
            return None  # the bot's own messages, and other bots'
        direct = channel.startswith("D")
        if event.get("type") == "message":
            taken = event.get("channel_type") == "im" and event.get("subtype") in TAKEN_SUBTYPES
        else:
            taken = event.get("type") == "app_mention" and not direct
        listed = direct or self.config.channels is None or channel in self.config.channels
        return (channel, user, ts) if taken and listed else None

    def _text(self, event: dict[str, Any]) -> str:
        """The text as the person typed it: Slack's markup read (``<url|label>`` as
        "label (url)", ``<@U1>`` as "@U1", ``<#C1|general>`` as "#general", ``<!here>``
        as "@here"), the bot's own mention left out, ``&lt;`` ``&gt;`` ``&amp;`` undone
        (else ``a > b && c`` reached the agent as ``a &gt; b &amp;&amp; c``), clean.
        A ``!command`` is the core's ``/command``: the edge knows the prefix."""
        raw = _str(event.get("text")) or ""
        return clean(unescaped(_MARKUP.sub(self._read_markup, raw[:MAX_TEXT]))).strip()

    def _read_markup(self, found: re.Match[str]) -> str:
        target, _, label = found.group(1).partition("|")
        if target.startswith("@"):
            return "" if target[1:] == self.bot_user_id else f"@{target[1:]}"
        if target.startswith("#"):
            return f"#{label or target[1:]}"
        if target.startswith("!"):  # @here, @channel, a user group, a date's fallback
            return label or f"@{target[1:].split('^', 1)[0]}"
        if target.startswith("mailto:"):
            return label or target.removeprefix("mailto:")
        return f"{label} ({target})" if label and label != target else target

    # -- button presses -------------------------------------------------------------------
    async def _press(self, payload: dict[str, Any]) -> None:
        user, container = _dict(payload.get("user")), _dict(payload.get("container"))
        actions = payload.get("actions") if isinstance(payload.get("actions"), list) else []
        presser = _str(user.get("id"))
        channel = _str(container.get("channel_id"))
        message_ts = _str(container.get("message_ts"))
        action = actions[0] if actions and isinstance(actions[0], dict) else {}
        action_id = _str(action.get("action_id")) or ""
        if not presser or not channel or not message_ts or not _ID.match(channel):
            return
        sender = Sender(id=presser, name=self._named(presser, user))
        when = _str(action.get("action_ts")) or message_ts
        await self.edge.decide(
            f"{channel}:{message_ts}",
            sender,
            f"press:{channel}:{message_ts}:{presser}:{when}",
            action=action_id,
            at=self._pressed_in(channel, message_ts, payload),
        )  # taken, or refused and said there: the gate then checks who decides

    def _named(self, presser: str, user: dict[str, Any]) -> str:
        """The presser's display name as the press says it (remembered for their messages)."""
        name = clean(_str(user.get("username")) or _str(user.get("name")) or "")[:100]
        if name and len(self.names) < NAMES_MAX:
            self.names[presser] = name
        return name

    @staticmethod
    def _pressed_in(channel: str, message_ts: str, payload: dict[str, Any]) -> Address:
        """Where a press on a message that is no kept prompt happened (a parent message
        gets a thread_ts of its own once someone replies under it: that is not a thread
        the message is in)."""
        thread = _str(_dict(payload.get("message")).get("thread_ts"))
        inside = thread if thread and _TS.match(thread) and thread != message_ts else None
        return address_of(channel, inside)
