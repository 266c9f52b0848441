"""The bot's mailbox over IMAP (aioimaplib): one connection, the mailbox selected, its
mail read by UID and flagged once taken; IDLE where the server has it, a pause where not.
Every failure is a ``MailboxAway`` (the peer out of reach, tried again) or, for a login
refused, a ``ConfigError``."""

from __future__ import annotations

import asyncio
import contextlib
import imaplib
import re
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aioimaplib

from channels.parts import tls_context
from echo_bot.errors import ConfigError, PeerAway

from .settings import EmailConfig

TAKEN = "$EchoBotTaken"  # the keyword on a mail this channel committed
COMMAND_TIMEOUT = 60.0  # one command, a whole message of up to [email] max_message included
IDLE_FOR = 300.0  # an IDLE renewed this often (servers end one after 30 min)
_UIDVALIDITY = re.compile(rb"UIDVALIDITY (\d+)")
_UIDNEXT = re.compile(rb"UIDNEXT (\d+)")
_SIZE = re.compile(rb"RFC822\.SIZE (\d+)")
_UID = re.compile(rb"\bUID (\d+)")
NETWORK = (OSError, TimeoutError, aioimaplib.AioImapException)  # CommandTimeout, Abort, …


class MailboxAway(PeerAway):
    """The IMAP server out of reach, or failing a command."""


class MailRefused(MailboxAway):
    """The server answered, but not with the mail asked for (NO, BAD, its data left
    out): tried again, and a mail it keeps refusing is let go (``Reader``)."""


@dataclass(frozen=True)
class Selected:
    validity: int
    next_uid: int
    idle: bool


class Mailbox:
    def __init__(self, config: EmailConfig, password: str) -> None:
        self.config = config
        self._password = password
        self._client: aioimaplib.IMAP4 | None = None
        self._lost = asyncio.Event()

    async def open(self) -> Selected:
        """Connected, logged in, the mailbox selected. A refused login or an unknown
        mailbox is a ``ConfigError``; anything else ``MailboxAway``."""
        await self.close()
        # This session's own: a connection given up closes later and must not mark
        # the next session lost.
        self._lost = lost = asyncio.Event()
        config = self.config
        host, port = str(config.imap_host), config.imap_at
        try:
            context = tls_context(config.ca_file) if config.imap_security == "tls" else None
            client = aioimaplib.IMAP4(
                host,
                port,
                timeout=COMMAND_TIMEOUT,
                conn_lost_cb=lambda error: lost.set(),
                ssl_context=context,
            )
            self._client = client
            await client.wait_hello_from_server()
            login = await client.login(config.login, self._password)
        except ssl.SSLCertVerificationError as exc:
            raise ConfigError(
                f"email: the certificate of {host}:{port} is not trusted ({exc.verify_message});"
                " for a server's own certificate, set [email] ca_file"
            ) from None
        except NETWORK as exc:
            raise MailboxAway(f"IMAP {host}:{port}: {exc!r}") from None
        if login.result != "OK":
            raise ConfigError(f"email: the IMAP server refused the login of {config.login}")
        chosen = await self._call("select", config.mailbox)  # FETCH's PEEK changes no flag
        if chosen.result != "OK":
            raise ConfigError(f"email.mailbox: no mailbox {config.mailbox!r} on {host}")
        joined = b"\n".join(line for line in chosen.lines if isinstance(line, bytes))
        validity, following = _UIDVALIDITY.search(joined), _UIDNEXT.search(joined)
        if validity is None:
            raise MailboxAway(f"IMAP {host}: the mailbox has no UIDVALIDITY")
        if following is not None:
            next_uid = int(following.group(1))
        else:  # a server that leaves UIDNEXT out: after its newest mail, never its first
            next_uid = max(await self._search("ALL"), default=0) + 1
        return Selected(int(validity.group(1)), next_uid, client.has_capability("IDLE"))

    @property
    def is_open(self) -> bool:
        return self._client is not None and not self._lost.is_set()

    def _dropped(self, why: str, kind: type[MailboxAway] = MailboxAway) -> MailboxAway:
        """The session is given up (a command cut off by its timeout would still wait in
        it, and every later one behind it; a server that answered BAD): the next round
        opens a new one."""
        self._lost.set()
        return kind(why)

    async def _call(self, verb: str, *args: str, ok: bool = False) -> aioimaplib.Response:
        """``verb`` sent (fetch, store, search by UID); a BAD answer, or with ``ok`` a
        NO, is the server failing: ``MailboxAway``, tried again."""
        if self._client is None or self._lost.is_set():
            raise self._dropped("IMAP: the connection was lost")
        try:
            if verb == "fetch":  # aioimaplib's timeout: no data for COMMAND_TIMEOUT
                answer = await self._client.uid(verb, *args)
            elif verb == "store":  # aioimaplib bounds no UID STORE
                answer = await asyncio.wait_for(self._client.uid(verb, *args), COMMAND_TIMEOUT)
            elif verb == "search":
                answer = await self._client.uid_search(*args)
            else:
                answer = await getattr(self._client, verb)(*args)
        except NETWORK as exc:
            raise self._dropped(f"IMAP {verb}: {exc!r}") from None
        if answer.result != "OK" and (ok or answer.result != "NO"):
            raise self._dropped(f"IMAP {verb}: {answer.result} {answer.lines[-1:]!r}", MailRefused)
        return answer

    async def _search(self, *criteria: str) -> list[int]:
        answer = await self._call("search", *criteria, ok=True)
        first = answer.lines[0] if answer.lines else b""
        return sorted(int(word) for word in bytes(first).split() if word.isdigit())

    async def after(self, uid: int) -> list[int]:
        """The UIDs above ``uid``, oldest first (``N:*`` always holds the newest). A NOOP
        first: the server brings the session's view up to date at a command's end, so a
        search alone can miss a mail that came just before it — and IDLE, which reports
        only what comes after, would leave it waiting."""
        await self._call("noop")
        return [found for found in await self._search(f"UID {uid + 1}:*") if found > uid]

    async def untaken_since(self, since: float) -> list[int]:
        """Mail that came at ``since`` (a time) or later, by its INTERNALDATE, that this
        channel never flagged. The server's SINCE is a date in its own zone: the day
        before covers any zone, and each mail's arrival says the rest."""
        day = datetime.fromtimestamp(since, UTC).date() - timedelta(days=1)
        found = await self._search("UNKEYWORD", TAKEN, "SINCE", day.strftime("%d-%b-%Y"))
        if not found:
            return []
        answer = await self._call("fetch", f"{found[0]}:{found[-1]}", "(UID INTERNALDATE)", ok=True)
        arrived: dict[int, float] = {}
        for line in answer.lines:
            uid, when = _UID.search(bytes(line)), imaplib.Internaldate2tuple(bytes(line))
            if uid is not None and when is not None:
                arrived[int(uid.group(1))] = time.mktime(when)
        # A mail whose arrival the server did not say is taken, as if it came later.
        return [uid for uid in found if arrived.get(uid, since) >= since]

    async def _fetched(self, uid: int, items: str) -> tuple[bytes, bytes] | None:
        """The FETCH response for ``uid`` (its item lines, wherever the server put the
        UID among them) and its literal; None only when the mail is gone. A server may
        send other mail's flag changes in the same answer; a refusal (NO) or an answer
        without the mail, while it is still there, is the server failing: tried again."""
        answer = await self._call("fetch", str(uid), items, ok=True)
        groups: list[tuple[bytes, bytes]] = []
        for line in answer.lines:
            if isinstance(line, bytearray):
                if groups:
                    groups[-1] = (groups[-1][0], bytes(line))
            elif b" FETCH (" in line:
                groups.append((bytes(line), b""))
            elif groups:
                groups[-1] = (groups[-1][0] + b" " + bytes(line), groups[-1][1])
        for items_line, literal in groups:
            if re.search(rb"\bUID %d\b" % uid, items_line):
                return items_line, literal
        if await self._search(f"UID {uid}") == [uid]:
            raise self._dropped(f"IMAP: the server did not send mail {uid}", MailRefused)
        return None

    async def head(self, uid: int) -> tuple[int, bytes] | None:
        """The mail's size as the server counts it, and its header."""
        found = await self._fetched(uid, "(UID RFC822.SIZE BODY.PEEK[HEADER])")
        if found is None:
            return None
        size = _SIZE.search(found[0])
        if size is None:
            raise self._dropped(f"IMAP: no size for mail {uid}", MailRefused)
        return int(size.group(1)), found[1]

    async def whole(self, uid: int) -> bytes | None:
        found = await self._fetched(uid, "(UID BODY.PEEK[])")
        return found[1] if found is not None else None

    async def flag(self, uid: int) -> None:
        """Taken: seen, and marked as this channel's (what a renumbered mailbox is
        searched by)."""
        await self._call("store", str(uid), "+FLAGS.SILENT", f"(\\Seen {TAKEN})")

    async def wait(self, idle: bool, seconds: float) -> None:
        """Until the server says something changed (IDLE), or ``seconds``."""
        client = self._client
        if client is None or self._lost.is_set():
            raise self._dropped("IMAP: the connection was lost")
        if not idle:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), seconds)
            return
        try:
            # A server that never acknowledges IDLE, or a connection gone meanwhile,
            # would leave idle_start waiting: it is bounded.
            done = await asyncio.wait_for(
                client.idle_start(timeout=min(seconds, IDLE_FOR)), COMMAND_TIMEOUT
            )
            lost = asyncio.ensure_future(self._lost.wait())
            pushed = asyncio.ensure_future(client.wait_server_push(timeout=min(seconds, IDLE_FOR)))
            try:
                await asyncio.wait({lost, pushed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in (lost, pushed):
                    waiting.cancel()
                # A push's timeout is no error: nothing came, the mailbox is looked at.
                await asyncio.gather(lost, pushed, return_exceptions=True)
            if self._lost.is_set():
                done.cancel()  # its answer will never come
                raise self._dropped("IMAP: the connection was lost while idle")
            client.idle_done()
            ended = await asyncio.wait_for(done, COMMAND_TIMEOUT)
        except NETWORK as exc:
            raise self._dropped(f"IMAP idle: {exc!r}") from None
        heard = pushed.done() and not pushed.cancelled() and pushed.exception() is None
        said = pushed.result() if heard else []
        refused = [line for line in said if bytes(line).startswith((b"NO", b"BAD"))]
        if refused or ended.result != "OK":  # the session is unwell: a new one, after a pause
            raise self._dropped(f"IMAP idle refused: {(refused or ended.lines)[-1:]!r}")

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        with contextlib.suppress(Exception):
            if not self._lost.is_set():
                await asyncio.wait_for(client.logout(), 5)
        transport = client.protocol.transport if client.protocol is not None else None
        if transport is not None:
            transport.close()  # a session given up: its connection too
