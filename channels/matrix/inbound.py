"""Matrix events into InboundMessages: messages, approval answers, invites.

Each room message of an allowed user (in an allowed room) becomes ONE committed
inbound, its event ID the ``external_id`` (a repeat is dropped by the inbox). A publish
the store did not take raises ``CommitFailed``, so the sync token does not move past
the event (sync.py). An image, file, audio or video message carries its file by
reference (media.py: fetched during the turn, not here), its caption as the text. A
message that cannot be decrypted (``MegolmEvent``: no key for its session) is not an
inbound: the room is told, and it is logged — never dropped silently. Events of kinds
the bot does not read are passed over; a malformed event is logged and passed over, it
never stops the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nio import (
    AsyncClient,
    BadEvent,
    InviteMemberEvent,
    JoinError,
    MegolmEvent,
    ReactionEvent,
    RoomEncryptedMedia,
    RoomMessageEmote,
    RoomMessageMedia,
    RoomMessageText,
)

from channels.parts import clean
from echo_bot.bus import ChannelHost
from echo_bot.errors import StoreError
from echo_bot.events import (
    DIRECT,
    Address,
    Attachment,
    MessageInbound,
    Sender,
)

from .common import CommitFailed, Tasks, log
from .media import KEPT, is_media, read_media
from .settings import MatrixConfig

UNDECRYPTABLE = (
    "I could not decrypt your message (I have no key for it: it may have been sent to "
    "my device before I could receive keys). Please send it again."
)
PAIR_AS = "here as `pair CODE`"  # how a stranger is told to send a pairing code
HOW_TO_ANSWER = (  # when `approve` or `deny` is typed on its own while a request waits
    "To answer a request, reply to its prompt (in Element: hover over it, then Reply) with"
    " `approve` or `deny`, or react to it with ✅ or ❌."
)
MAX_JOIN_WAIT = 30.0  # seconds a rate-limited join waits before the invite is tried again


def address_of(room_id: str) -> Address:
    return Address(channel="matrix", chat_id=room_id)


def relates_to(event: Any) -> dict[str, Any]:
    content = event.source.get("content") if isinstance(event.source, dict) else None
    relation = content.get("m.relates_to") if isinstance(content, dict) else None
    return relation if isinstance(relation, dict) else {}


def media_content(event: Any) -> dict[str, Any] | None:
    """The content of an image, file, audio or video message; nio's parse refuses some
    (a plain ``url`` in an encrypted room, a malformed one): those are read too."""
    if not isinstance(event, RoomMessageMedia | RoomEncryptedMedia | BadEvent):
        return None
    if isinstance(event, BadEvent) and event.type != "m.room.message":
        return None
    content = event.source.get("content") if isinstance(event.source, dict) else None
    return content if is_media(content) else None


def reply_target(event: Any) -> str | None:
    in_reply = relates_to(event).get("m.in_reply_to")
    target = in_reply.get("event_id") if isinstance(in_reply, dict) else None
    return target if isinstance(target, str) else None


def _direct_invite(invite_state: list[Any], bot: str) -> bool:
    """Whether the invite asks the bot into a direct chat (``is_direct``, as Element
    sets it for a new direct message)."""
    for event in invite_state:
        if isinstance(event, InviteMemberEvent) and event.state_key == bot:
            content = event.content  # nio takes it out of ``source``
            return isinstance(content, dict) and content.get("is_direct") is True
    return False


class Inbound:
    def __init__(
        self, config: MatrixConfig, host: ChannelHost, client: AsyncClient, tasks: Tasks
    ) -> None:
        self.config = config
        self.host = host
        self.client = client
        self.tasks = tasks
        self.edge = host.edge("matrix", prefix="!", pair_as=PAIR_AS)  # Element keeps /help

    def room_allowed(self, room_id: str) -> bool:
        return self.config.rooms is None or room_id in self.config.rooms

    async def allowed(self, user_id: str) -> bool:
        return await self.host.access.is_allowed("matrix", user_id)

    # -- invites --------------------------------------------------------------------------
    async def on_invite(self, room_id: str, invite_state: list[Any]) -> None:
        """Join when an allowed user invited the bot (to an allowed room); else leave."""
        inviter = next(
            (e.sender for e in invite_state
             if isinstance(e, InviteMemberEvent) and e.state_key == self.client.user_id
             and e.membership == "invite"),
            None,
        )  # fmt: skip
        direct = _direct_invite(invite_state, self.client.user_id)
        if inviter is not None and self.room_allowed(room_id):
            answer = await self.edge.invited(inviter, direct=direct, where=room_id)
        else:  # no one to ask about, or a room outside [matrix] rooms
            answer = "refuse"
            await self.host.audit("matrix.invite_refused", chat=room_id, inviter=inviter or "?")
        if inviter is not None and answer != "refuse":
            joined = await self.client.join(room_id)
            if isinstance(joined, JoinError):
                if joined.status_code in (None, "M_LIMIT_EXCEEDED", "M_UNKNOWN"):
                    # Not lost: the token stays before the invite, which comes again.
                    wait = min((joined.retry_after_ms or 1000) / 1000, MAX_JOIN_WAIT)
                    await asyncio.sleep(wait)
                    raise CommitFailed(f"joining {room_id} failed for now: {joined}")
                log.warning("matrix: could not join %s (invited by %s): %s", room_id, inviter,
                            joined)  # fmt: skip
                return
            log.info("matrix: joined %s (invited by %s)", room_id, inviter)
            if answer == "pair":  # a pairing code waits: they may send it here
                await self.edge.refuse(address_of(room_id), inviter)
        else:
            await self.client.room_leave(room_id)
            log.warning(
                "matrix: refused the invite to %s from %s: not in [matrix] allowed_users. To"
                " let them in, add them there, or run `echo-bot pair` and have them invite"
                " the bot to a direct chat within 10 minutes and send it the code",
                room_id, inviter,
            )  # fmt: skip

    # -- timeline events ------------------------------------------------------------------
    async def on_event(self, room_id: str, event: Any) -> None:
        sender = getattr(event, "sender", None)
        if not isinstance(sender, str) or sender == self.client.user_id:
            return
        if not self.room_allowed(room_id):
            return
        if isinstance(event, MegolmEvent):
            await self._undecryptable(room_id, event)
            return
        who, at = self._sender(room_id, sender), address_of(room_id)
        if isinstance(event, ReactionEvent):  # an answer to a prompt, from anyone: the
            if event.reacts_to:  # edge checks it is one, the gate who decides
                await self.edge.react(event.reacts_to, who, event.event_id, event.key or "", at)
            return
        media = media_content(event)
        if media is None and not isinstance(event, RoomMessageText | RoomMessageEmote):
            return  # state, redactions, notices (bots talk with m.notice), unknown kinds
        if relates_to(event).get("rel_type") == "m.replace":
            return  # an edit: not run again (as on Telegram and Slack)
        target = reply_target(event)
        typed = (event.body or "") if isinstance(event, RoomMessageText) else None
        if target is not None and typed and await self.edge.reply(target, who, event.event_id,
                                                                 typed, at):  # fmt: skip
            return  # as a reaction
        if not await self.allowed(sender):
            await self._stranger(room_id, sender, event)
            return
        await self._message(room_id, sender, event, media, answers_prompt=target is not None)

    async def _stranger(self, room_id: str, sender: str, event: Any) -> None:
        """A stranger is answered only alone with the bot (a room they invited it to
        while a pairing code waited), where they may send the code."""
        if self._direct(room_id, sender) and isinstance(event, RoomMessageText):
            await self.edge.take(MessageInbound(
                address=address_of(room_id), sender=Sender(id=sender),
                text=self._text(event), external_id=event.event_id,
            ))  # fmt: skip

    async def _message(
        self,
        room_id: str,
        sender: str,
        event: Any,
        media: dict[str, Any] | None,
        *,
        answers_prompt: bool,
    ) -> None:
        """An allowed person's message, with its file, into the inbox."""
        attachments: list[Attachment] = []
        if media is not None:
            text, attachments = await self._media(event.event_id, media)
        else:
            text = self._text(event)
        if (
            not answers_prompt
            and text
            and await self.edge.lone_answer(address_of(room_id), text, HOW_TO_ANSWER)
        ):
            return  # no buttons here: told how to answer instead
        await self.edge.take(
            MessageInbound(
                address=address_of(room_id),
                sender=self._sender(room_id, sender),
                text=text,
                attachments=attachments,
                external_id=event.event_id,
                message_id=event.event_id,
                metadata={DIRECT: True} if self._direct(room_id, sender) else {},
            )
        )

    def _direct(self, room_id: str, sender: str) -> bool:
        """Whether the room is the sender's alone with the bot as the sync left it: two
        members (the joined and the invited, as the room's summary counts them), both
        of them joined, in a room only an invite lets anyone into, whose history only
        members read. A room ID never says so, and a room marked direct (``m.direct``)
        may hold anyone: the gate trusts an approver's direct chat with the owner's
        data, so only the membership and the rules count. A person the approver invites
        later reads what the bot says from then on (and, in a room without encryption,
        what it said before, as the room's history visibility allows), as in any chat
        its approver opens up."""
        room = self.client.rooms.get(room_id)
        if room is None or room.member_count != 2 or room.join_rule != "invite":
            return False
        if room.history_visibility == "world_readable":
            return False
        joined = {user for user, member in room.users.items() if not member.invited}
        return joined == {sender, self.client.user_id}

    async def _media(
        self, event_id: str, content: dict[str, Any]
    ) -> tuple[str | None, list[Attachment]]:
        """A media message's caption and notes, and its file (fetched during the turn);
        an encrypted file's keys are kept in the store before its message is published."""
        received = read_media(event_id, content, self.config)
        if received.kept is not None:
            try:
                await self.host.remember_note(KEPT + event_id, received.kept)
            except StoreError as exc:
                raise CommitFailed(str(exc)) from exc
        caption = clean(received.caption).strip() if received.caption else None
        text = "\n".join(part for part in (caption, received.note) if part) or None
        return text, [received.attachment] if received.attachment else []

    def _text(self, event: Any) -> str:
        body = clean(str(event.body or ""))
        if reply_target(event) is not None:  # the quoted fallback of a reply
            lines = body.splitlines()
            while lines and lines[0].startswith(">"):
                lines.pop(0)
            body = "\n".join(lines).strip()
        if isinstance(event, RoomMessageEmote):
            body = f"* {body}"
        return body

    def _sender(self, room_id: str, user_id: str) -> Sender:
        room = self.client.rooms.get(room_id)
        name = room.user_name(user_id) if room is not None else None
        return Sender(id=user_id, name=clean(str(name or user_id)))

    async def _undecryptable(self, room_id: str, event: MegolmEvent) -> None:
        log.warning(
            "matrix: could not decrypt event %s from %s in %s (session %s)",
            event.event_id, event.sender, room_id, getattr(event, "session_id", "?"),
        )  # fmt: skip
        await self.host.audit(
            "matrix.undecryptable", room=room_id, event_id=event.event_id, sender=event.sender
        )
        at = address_of(room_id)
        await self.edge.notice(at, UNDECRYPTABLE, quote=event.event_id, seldom=True)
