"""Mail out over SMTP (aiosmtplib): each part of a text one mail, ``multipart/alternative``
(plain and HTML, both from the pipeline: masked), threaded under the mail it answers,
with a Message-ID of our own made from the outbound's id (a mail sent again after a
crash carries the same one, so a mail client shows it once). Approval prompts carry the
approver's one-time code (``codes``); every mail says ``Auto-Submitted: auto-replied``,
so other robots do not answer it."""

from __future__ import annotations

import asyncio
import mimetypes
import re
from email.message import EmailMessage
from email.utils import formatdate
from pathlib import Path
from typing import Any

import aiosmtplib

from channels.parts import clean, tls_context
from echo_bot.bus import ChannelEdge, ChannelHost
from echo_bot.errors import ChannelError
from echo_bot.events import Address, OutboundKind, OutboundMessage, Receipt, TextFormat
from echo_bot.pacing import Pacer
from echo_bot.prompt_answers import actions_of
from echo_bot.richtext import parts

from .codes import Codes
from .formatting import TEXT
from .settings import EmailConfig
from .threads import Thread, Threads

SMTP_TIMEOUT = 30.0
# The longest a mail waits in send() for its turn in the account's budget; a later turn
# is kept for it and the delivery worker holds the mail until then (a send that waited
# past the worker's timeout could be cut in the middle of its SMTP session).
MAX_WAIT = 20.0
PROMPT_ID = re.compile(r"^<[0-9a-f]{32}\.approval@[^<>\s]+>$")


def subject_of(text: str) -> str:
    """A header-safe subject: one line, control characters out, at most 78 characters
    (whatever the model wrote, it never reaches the header as more than text)."""
    line = " ".join(clean(text).split())  # str.split breaks at \n, \t and \u2028 too
    return line if len(line) <= 78 else line[:77].rstrip() + "…"


def smtp_options(config: EmailConfig) -> dict[str, Any]:
    """How aiosmtplib reaches the SMTP server: the same for the mail and for doctor."""
    return dict(
        hostname=config.smtp_host, port=config.smtp_at, timeout=SMTP_TIMEOUT,
        use_tls=config.smtp_security == "tls", start_tls=config.smtp_security == "starttls",
        tls_context=tls_context(config.ca_file),
    )  # fmt: skip


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        return all(400 <= refused.code < 500 for refused in exc.recipients)
    if isinstance(exc, aiosmtplib.SMTPResponseException) and not isinstance(
        exc, aiosmtplib.SMTPServerDisconnected
    ):
        return 400 <= exc.code < 500
    return True  # the server away or gone mid-way


class Outbound:
    def __init__(
        self, config: EmailConfig, host: ChannelHost, edge: ChannelEdge, password: str
    ) -> None:
        self.config = config
        self.host = host
        self.edge = edge
        self.codes = Codes(host)
        self.threads = Threads(host)
        self._password = password
        self._domain = str(config.address).rpartition("@")[2]
        # At most 3 at once, then spaced: a provider counts mails as they arrive, and
        # concurrent submissions arrive out of step with their start.
        self.pacer = Pacer((config.max_per_minute / 60.0, min(config.max_per_minute, 3)))
        self._turns: dict[str, float] = {}  # a held mail's turn (the pacer's clock)
        self._parts_sent: dict[str, int] = {}  # outbound id → parts sent before a failure

    async def send(self, message: OutboundMessage) -> Receipt:
        """Each part a mail, sent once; an approval prompt with its code and kept by its
        Message-ID before it goes (a reply may come at once)."""
        to = message.to
        prompt = message.kind == OutboundKind.APPROVAL and bool(message.buttons)
        text = await self._prompt_text(message) if prompt else message.text
        markdown = message.format == TextFormat.MARKDOWN
        wires = await parts.rendered_parts(text, markdown, self.host.masker, TEXT)
        thread = await self.threads.of(to) if to.thread_id else Thread()
        sent = None
        done = self._parts_sent.pop(message.id, 0)  # parts a failed try already sent
        for index, (plain, html) in enumerate(wires):
            last = index == len(wires) - 1
            if index < done:
                continue
            message_id = self._id(message, index, prompt and last)
            mail = self._mail(to, thread, plain, html, message_id)
            if last and message.file is not None:
                await self._attach(mail, message.file.path, message.file.name, message.file.size)
            if prompt and last:
                await self.edge.keep_prompt(message_id, message)
            try:
                await self._turn(message_id)
                await self._submit(mail)
            except (ChannelError, asyncio.CancelledError):
                if index:  # the parts before it went out: not again when tried again
                    self._parts_sent[message.id] = index
                raise
            if to.thread_id:
                await self.threads.said(to, thread, message_id)
            sent = message_id
        return Receipt(channel_message_id=sent)

    async def _turn(self, message_id: str) -> None:
        """Wait for this mail's turn in ``max_per_minute``, or, when it is further off
        than MAX_WAIT, keep the turn for it and have the worker hold it until then."""
        now = self.pacer.clock()
        turn = self._turns.pop(message_id, None)
        if turn is None:
            turn = now + self.pacer.reserve("account")
        if turn - now > MAX_WAIT:
            if len(self._turns) > 10_000:  # turns of mails never tried again
                self._turns = {k: t for k, t in self._turns.items() if t > now}
            self._turns[message_id] = turn
            raise ChannelError(
                f"email: over [email] max_per_minute, its turn in {turn - now:.0f} s",
                retry_after=turn - now,
            )
        await asyncio.sleep(max(0.0, turn - now))

    def _id(self, message: OutboundMessage, index: int, prompt: bool) -> str:
        return f"<{message.id}.{'approval' if prompt else index}@{self._domain}>"

    async def _prompt_text(self, message: OutboundMessage) -> str:
        """The gate's prompt, then how to answer it by mail: with this approver's code."""
        prompt_id = self._id(message, 0, True)
        code = await self.codes.code(prompt_id, message.to.chat_id)
        verbs = {action.split(":", 1)[0] for action in actions_of(message.buttons)}
        ways = [f"approve {code}"] if "approve_once" in verbs else []
        ways.append(f"deny {code}")
        how = (
            "\n\nTo answer, reply to this mail with `"
            + "` or `".join(ways)
            + f"`. Only a reply from {message.to.chat_id} with this code counts."
        )
        if self.config.console_url and message.approval is not None:
            request = message.approval.request_id
            how += f"\nOr in the console: {self.config.console_url}/console/approvals/{request}"
        return message.text + how

    def _mail(
        self, to: Address, thread: Thread, plain: str, html: str, message_id: str
    ) -> EmailMessage:
        mail = EmailMessage()
        mail["From"] = str(self.config.address)
        mail["To"] = to.chat_id
        if thread.subject or thread.references:
            subject = subject_of(thread.subject)
            mail["Subject"] = subject if subject.lower().startswith("re:") else f"Re: {subject}"
            if thread.references:
                mail["In-Reply-To"] = thread.references[-1]
                mail["References"] = " ".join(thread.references)
        else:
            mail["Subject"] = subject_of(plain.split("\n", 1)[0]) or "echo-bot"
        mail["Message-ID"] = message_id
        mail["Date"] = formatdate(localtime=False)
        mail["Auto-Submitted"] = "auto-replied"
        mail.set_content(plain)
        mail.add_alternative(f"<!DOCTYPE html><html><body>{html}</body></html>", subtype="html")
        return mail

    async def _attach(self, mail: EmailMessage, path: str, name: str, size: int) -> None:
        """The file, base64 in the mail: a server counts it so (4 bytes for 3, and a line
        break every 76), and refuses a mail over its limit only once all of it is sent.
        Encoded off the event loop (25 MB took 0.8 s)."""
        if size * 4 // 3 + size // 57 * 2 + 64 * 1024 > self.config.max_message:
            raise ChannelError(
                f"email: {name} is over [email] max_message once encoded for mail",
                retryable=False,
            )
        data = await asyncio.to_thread(Path(path).read_bytes)
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        maintype, _, subtype = kind.partition("/")
        await asyncio.to_thread(
            mail.add_attachment, data, maintype=maintype, subtype=subtype, filename=name
        )

    async def _submit(self, mail: EmailMessage) -> None:
        config = self.config
        try:
            await aiosmtplib.send(
                mail, username=config.login, password=self._password, **smtp_options(config)
            )
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            where = f"{config.smtp_host}:{config.smtp_at}"
            raise ChannelError(f"email: SMTP {where}: {exc}", retryable=_retryable(exc)) from None
