"""The mailbox read in order, each mail committed before it is flagged (commit before
acknowledging): its position is the mailbox's UIDVALIDITY and the last UID taken, kept
in the store; a mail taken twice (a crash between the commit and the flag) is one
inbound, deduplicated by its Message-ID.

What is never answered: mail a program sent (``reading.automatic``), mail from the bot
itself, and mail whose sender the receiving server did not vouch for (``reading.authentic``)
— all flagged and audited, so none is looked at again. A reply to an approval prompt
decides it only with the approver's code (``codes``)."""

from __future__ import annotations

import asyncio
import logging
import time

from echo_bot.bus import ChannelEdge, ChannelHost, ChannelLink
from echo_bot.errors import CommitFailed, StoreError
from echo_bot.events import (
    DIRECT,
    Address,
    Attachment,
    DecisionVerb,
    MediaKind,
    MessageInbound,
    Sender,
)
from echo_bot.prompt_answers import verb_of_reply
from echo_bot.sizes import format_size

from .codes import Codes, is_code
from .mailbox import Mailbox, MailRefused, Selected
from .outbound import PROMPT_ID
from .reading import Mail, read
from .settings import EmailConfig
from .threads import Threads

log = logging.getLogger("echo_bot.channels.email")
MAX_PAUSE = 60.0  # seconds between tries of a mail the store does not take, at most
MAX_REFUSED = 5  # times in a row the server refuses to hand a mail over before it is let go
# How far back before the last mail taken a renumbered mailbox is searched (seconds).
RENUMBER_LOOKBACK = 2 * 86_400.0

HOW_TO_ANSWER = (
    "To answer an approval request, reply to its mail with `approve CODE` or `deny CODE`,"
    " the code it gave you."
)
NO_CODE = (
    "⚠️ That reply is not allowed to decide: a decision by mail needs the code its request"
    " mail gave you (`approve CODE` or `deny CODE`), from the address it was sent to."
)


class Reader:
    def __init__(
        self, config: EmailConfig, host: ChannelHost, edge: ChannelEdge, link: ChannelLink,
        mailbox: Mailbox, codes: Codes, threads: Threads,
    ) -> None:  # fmt: skip
        self.config = config
        self.host = host
        self.edge = edge
        self.link = link
        self.mailbox = mailbox
        self.codes = codes
        self.threads = threads
        where = f"{config.login}/{config.mailbox}"
        self._position = f"email-uid:{where}"  # + ":<UIDVALIDITY>[:<mark>]" (``_uid_key``)
        self._at = ""  # the open mailbox's ``_uid_key``, set by ``resume``
        self._validity = f"email-uidvalidity:{where}"
        self._first_start = f"email-first-start:{where}"  # when reading began: a time
        self.selected: Selected | None = None
        self.after = 0
        self._pause = 1.0  # before a mail the store did not take is read again
        self._refused = (0, 0)  # the mail the server refused last, and how often in a row
        self._auth = (config.auth_header, config.auth_serv_id or "")

    async def resume(self) -> None:
        """The mailbox opened anew, and where reading goes on from, as the store has it
        now (another daemon on the store may have read meanwhile). On the first start:
        the mail that comes from now on. After the mailbox was renumbered (its
        UIDVALIDITY changed): the mail of the last two days this channel never flagged,
        none that came before the first start (it was left unread on purpose)."""
        self.selected = None
        selected = await self.mailbox.open()
        kept = await self._kept_mark()
        position = None
        if kept is not None:  # a store written before positions named their UIDVALIDITY: its one
            position = await self.host.recall(self._uid_key(kept)) or (
                await self.host.recall(self._position)
            )
        # A position past the mailbox's next UID: restored from a backup (its UIDVALIDITY
        # back to one read before, or left as it was): read as renumbered.
        same = kept is not None and int(kept.partition(":")[0]) == selected.validity
        if same and position is not None and position[0] < selected.next_uid:
            assert kept is not None
            self._at = self._uid_key(kept)
            self.after = position[0]  # as the store has it: nothing to write
            self.selected = selected
            return
        mark = str(selected.validity)
        if kept is None or position is None:
            self.after = selected.next_uid - 1
            log.info("email: reading %s from the next mail on", self.config.mailbox)
            await self.host.remember_note(self._first_start, repr(time.time()), replace=False)
        else:
            log.warning(
                "email: %s was renumbered or restored (UIDVALIDITY %s, was %s; next UID %s):"
                " taking the mail not taken yet",
                self.config.mailbox, selected.validity, kept, selected.next_uid,
            )  # fmt: skip
            first = await self.host.recall_note(self._first_start)  # None: a store from before
            since = max(position[1] - RENUMBER_LOOKBACK, float(first[0]) if first else 0.0)
            for uid in await self.mailbox.untaken_since(since):
                if not await self._taken(uid, selected):
                    raise CommitFailed("the store did not take a mail; read again")
            self.after = selected.next_uid - 1
            # A position of its own (it only moves forward): one kept when this
            # UIDVALIDITY was read before may be past the UIDs it gives out again.
            mark = f"{selected.validity}:{time.time_ns()}"
        self._at = self._uid_key(mark)
        await self.host.remember(self._at, self.after)
        # Then the mark, a note (a restore may bring the UIDVALIDITY down as well as up):
        # a crash between the two reads the mailbox as renumbered again, losing nothing.
        await self.host.remember_note(self._validity, mark)
        self.selected = selected

    async def _kept_mark(self) -> str | None:
        """The UIDVALIDITY the store last read the mailbox under, with the mark of that
        reading after a colon when it began at a renumbering (a store from before it
        was a note kept it as a position)."""
        note = await self.host.recall_note(self._validity)
        if note is not None:
            return note[0]
        legacy = await self.host.recall(self._validity)
        return str(legacy[0]) if legacy is not None else None

    def _uid_key(self, mark: str) -> str:
        """Where the last UID taken under ``mark`` (``_kept_mark``) is kept: a stored
        position only moves forward, and a renumbered mailbox's UIDs start again from 1."""
        return f"{self._position}:{mark}"

    async def once(self) -> None:
        """The new mail taken in order; then a wait for more (IDLE, or a pause)."""
        if not self.mailbox.is_open or self.selected is None:
            await self.resume()  # the connection was lost
        assert self.selected is not None
        self.link.connected()
        uids = await self.mailbox.after(self.after)
        for uid in uids:
            if not await self._taken_unless_refused(uid, self.selected):
                # Not flagged: read again, less often while the store keeps failing
                # (each try fetches the whole mail again).
                await asyncio.sleep(self._pause)
                self._pause = min(self._pause * 2, MAX_PAUSE)
                return
            self._pause = 1.0
            self.after = uid
            await self.host.remember(self._at, uid)
        if not uids:
            await self.mailbox.wait(self.selected.idle, self.config.poll_every.total_seconds())

    async def _taken_unless_refused(self, uid: int, selected: Selected) -> bool:
        """``_taken``; a mail the server refused to hand over MAX_REFUSED times in a row
        (a damaged file on it) is let go, audited: it would hold up all the mail after it
        for ever."""
        try:
            taken = await self._taken(uid, selected)
        except MailRefused as exc:
            refused = self._refused[1] + 1 if self._refused[0] == uid else 1
            self._refused = (uid, refused)
            if refused < MAX_REFUSED:
                raise
            log.error("email: mail %s refused %d times (%s): let go", uid, refused, exc)
            await self.host.audit("email.not_answered", sender="", message=str(uid),
                                  reason=f"the server would not hand it over: {exc}")  # fmt: skip
            return True
        self._refused = (0, 0)
        return taken

    async def _taken(self, uid: int, selected: Selected) -> bool:
        """``uid`` committed (or let go, for a reason), then flagged; False when the
        store did not take it."""
        try:
            await self.take(uid, selected)
        except (CommitFailed, StoreError) as exc:
            log.warning("email: mail %s not taken (%s); it is read again", uid, exc)
            return False
        await self.mailbox.flag(uid)
        return True

    async def take(self, uid: int, selected: Selected) -> None:
        head = await self.mailbox.head(uid)
        if head is None:
            return  # removed meanwhile
        size, header = head
        # Who sent it, first, from its header: the body of a mail nobody vouched for is
        # never parsed.
        mail = await self._read(header, whole=False)
        if mail is None or not await self._answerable(mail):
            return
        # A stranger is told how to pair, seldom (the edge), and nothing else: what they
        # write (a size, a thread, a reply to a prompt) never makes the bot write again.
        known = await self._known(str(mail.sender))
        if size > self.config.max_message:
            text = (
                f"Your mail of {format_size(size)} is over the"
                f" {format_size(self.config.max_message)} this bot reads; it was not read."
            )
            if known:
                await self.edge.notice(self._address(mail), text, seldom=True)
            else:
                await self.edge.refuse(self._address(mail), str(mail.sender))
            return
        raw = await self.mailbox.whole(uid)
        mail = await self._read(raw) if raw is not None else None
        if mail is None:
            return
        address = self._address(mail)
        external_id = mail.message_id or f"{selected.validity}:{uid}"
        sender = Sender(id=str(mail.sender), name=mail.name)
        if known:
            await self.threads.heard(address, mail)
            if await self._decided(mail, address, sender, external_id):
                return
            if await self.edge.lone_answer(address, mail.text, HOW_TO_ANSWER):
                return
        files = [
            Attachment(
                kind=MediaKind.PHOTO if f.mime_type.startswith("image/") else MediaKind.DOCUMENT,
                file_ref=f"{selected.validity}:{uid}:{f.index}",
                name=f.name,
                mime_type=f.mime_type,
                size=f.size,
            )
            for f in (mail.files if self.config.media else [])
        ]
        await self.edge.take(
            MessageInbound(
                address=address, sender=sender, text=mail.text, external_id=external_id,
                message_id=mail.message_id, attachments=files,
                metadata={DIRECT: True} if mail.direct(str(self.config.address)) else {},
            )
        )  # fmt: skip

    async def _known(self, sender: str) -> bool:
        """An allowed sender, or an approver."""
        try:
            access = self.host.access
            return access.may_approve("email", sender) or await access.is_allowed("email", sender)
        except StoreError as exc:
            raise CommitFailed(str(exc)) from exc

    async def _read(self, raw: bytes, *, whole: bool = True) -> Mail | None:
        """``raw`` read off the event loop (a hostile mail may take the parser a while);
        None, audited, when it cannot be read at all (a multipart nested too deep)."""
        try:
            return await asyncio.to_thread(read, raw, auth=self._auth, whole=whole)
        except Exception as exc:
            log.warning("email: a mail could not be read: %r", exc)
            reason = f"unreadable ({type(exc).__name__})"
            await self.host.audit("email.not_answered", sender="", message=None, reason=reason)
            return None

    def _address(self, mail: Mail) -> Address:
        return Address(channel="email", chat_id=str(mail.sender), thread_id=mail.thread)

    async def _answerable(self, mail: Mail) -> bool:
        """Whether ``mail`` may be answered: one sender, not the bot, not a program,
        and vouched for by the receiving server. What is not is audited."""
        reason = None
        if mail.sender is None:
            reason = "From: does not name one sender cleanly"
        elif mail.automatic is not None:
            reason = f"sent by a program ({mail.automatic})"
        elif mail.sender == self.config.address:
            reason = "from the bot's own address"
        elif not self.config.trust_from and not mail.vouched:
            reason = f"{self.config.auth_header} does not vouch for the sender"
        if reason is None:
            return True
        log.info("email: mail %s from %s not answered: %s", mail.message_id, mail.sender, reason)
        await self.host.audit(
            "email.not_answered", sender=str(mail.sender), message=mail.message_id, reason=reason
        )
        return False

    @staticmethod
    def _verb(text: str) -> DecisionVerb | None:
        """The pipeline's answer by reply (the verb as the whole first line), the code
        after it or not: "Yes — but what does it do?" decides nothing, even where the
        client quoted the prompt, its code included, without ``>``."""
        first = next((line for line in text.splitlines() if line.strip()), "")
        return verb_of_reply(" ".join(w for w in first.split() if not is_code(w.strip(".,!"))))

    async def _decided(self, mail: Mail, address: Address, sender: Sender, said: str) -> bool:
        """A reply to an approval prompt answering it: decided when it holds the
        approver's code, refused (audited, said) when not."""
        target = mail.in_reply_to
        verb = self._verb(mail.text)
        if target is None or verb is None or not PROMPT_ID.match(target):
            return False
        if not await self.codes.given(target, sender.id, mail.text):
            log.warning("email: %s answered %s without its code", sender.id, target)
            await self.host.audit(
                "email.forged_action", user=sender.id, message=target, action=verb.value
            )
            await self.edge.notice(address, NO_CODE, seldom=True)
            return True
        decided = await self.edge.decide(target, sender, said, verb=verb, at=address)
        return decided.outcome != "no_prompt"
