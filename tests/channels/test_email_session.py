"""The IMAP session against servers that misbehave in ways Dovecot does not: a command
answered BAD (the session is given up and a new one made, never used again with
whatever the failed command left waiting in it), and a SELECT without UIDNEXT (the
first start reads from after the newest mail, never from the first). A scripted IMAP
server on 127.0.0.1 that aioimaplib talks to over TCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from channels.email.mailbox import Mailbox, MailboxAway
from channels.email.settings import EmailConfig


@dataclass
class ScriptedImap:
    """Answers LOGIN, SELECT (its mail's UIDs; UIDNEXT only when ``uidnext``), NOOP
    (BAD for the first ``bad_noops``), UID SEARCH and LOGOUT; counts the logins and
    the connections the client closed."""

    uids: list[int]
    uidnext: bool = True
    bad_noops: int = 0
    logins: int = 0
    closed_by_client: int = 0
    commands: list[str] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        def say(*lines: str) -> None:
            writer.write("".join(f"{line}\r\n" for line in lines).encode())

        say("* OK [CAPABILITY IMAP4rev1 IDLE] scripted")
        while line := await reader.readline():
            tag, _, rest = line.decode().strip().partition(" ")
            verb = rest.split(" ", 2)
            command = " ".join(verb[:2]).upper() if verb[0].upper() == "UID" else verb[0].upper()
            self.commands.append(command)
            if command == "CAPABILITY":
                say("* CAPABILITY IMAP4rev1 IDLE", f"{tag} OK done")
            elif command == "LOGIN":
                self.logins += 1
                say(f"{tag} OK logged in")
            elif command == "SELECT":
                top = max(self.uids, default=0)
                say(f"* {len(self.uids)} EXISTS", "* OK [UIDVALIDITY 7] kept")
                if self.uidnext:
                    say(f"* OK [UIDNEXT {top + 1}] next")
                say(f"{tag} OK [READ-WRITE] selected")
            elif command == "NOOP" and self.bad_noops:
                self.bad_noops -= 1
                say(f"{tag} BAD not now")
            elif command == "NOOP":
                say(f"{tag} OK noop")
            elif command == "UID SEARCH":
                asked = verb[2].split()[-1]
                low = int(asked.split(":")[0]) if ":" in asked else 0
                found = [uid for uid in self.uids if uid >= low]
                say("* SEARCH " + " ".join(map(str, found)), f"{tag} OK searched")
            elif command == "LOGOUT":
                say("* BYE", f"{tag} OK bye")
                await writer.drain()
                break
            else:
                say(f"{tag} BAD unknown")
            await writer.drain()
        else:
            self.closed_by_client += 1
        writer.close()


@pytest.fixture
async def imap() -> AsyncIterator[tuple[ScriptedImap, EmailConfig]]:
    script = ScriptedImap(uids=[5, 9])
    server = await asyncio.start_server(script.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = EmailConfig(
        enabled=True, address="bot@example.org", imap_host="127.0.0.1", imap_port=port,
        imap_security="plain", smtp_host="127.0.0.1", smtp_security="plain", trust_from=True,
    )  # fmt: skip
    async with server:
        yield script, config


async def test_a_session_a_command_failed_in_is_given_up_and_a_new_one_made(
    imap: tuple[ScriptedImap, EmailConfig],
) -> None:
    script, config = imap
    script.bad_noops = 1
    box = Mailbox(config, "secret")
    try:
        await box.open()
        with pytest.raises(MailboxAway, match="BAD"):
            await box.after(9)
        assert not box.is_open  # the next round opens a new session: not this one
        await box.open()
        assert box.is_open and await box.after(5) == [9]
        assert script.logins == 2
        await asyncio.sleep(0.2)
        assert script.closed_by_client == 1  # the given-up session's connection closed
    finally:
        await box.close()


async def test_a_server_without_uidnext_is_read_from_after_its_newest_mail(
    imap: tuple[ScriptedImap, EmailConfig],
) -> None:
    script, config = imap
    script.uidnext = False
    box = Mailbox(config, "secret")
    try:
        selected = await box.open()
        assert (selected.validity, selected.next_uid) == (7, 10)  # never 1: all old mail
    finally:
        await box.close()


async def test_a_mail_the_server_keeps_refusing_is_let_go_after_five_tries_and_audited() -> None:
    """A mail the server will not hand over (NO to its FETCH, or its data left out: a
    damaged file on the server) held up all the mail after it for ever: each try
    raised, the session was made anew, and the same mail was asked for again. After
    MAX_REFUSED refusals in a row it is let go, and the reader goes on."""
    from channels.email.inbound import MAX_REFUSED, Reader
    from channels.email.mailbox import MailRefused, Selected

    audited: list[dict[str, object]] = []

    class Host:
        async def audit(self, event: str, **data: object) -> None:
            audited.append({"event": event, **data})

    class Box:
        async def head(self, uid: int) -> tuple[int, bytes] | None:
            raise MailRefused(f"IMAP fetch: NO [SERVERBUG] mail {uid}")

    reader = Reader.__new__(Reader)
    reader.host, reader.mailbox, reader._refused = Host(), Box(), (0, 0)  # type: ignore[assignment]
    selected = Selected(validity=7, next_uid=3, idle=False)
    for _ in range(MAX_REFUSED - 1):
        with pytest.raises(MailRefused):
            await reader._taken_unless_refused(2, selected)
    assert audited == []
    assert await reader._taken_unless_refused(2, selected)  # let go: the next one is read
    [row] = audited
    assert row["event"] == "email.not_answered" and "would not hand it over" in str(row["reason"])
    with pytest.raises(MailRefused):  # another mail starts its own count
        await reader._taken_unless_refused(3, selected)


async def test_a_file_over_the_limit_once_encoded_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    """A file is base64 in a mail (4 bytes for 3): one of 800 kB under a 1 MB
    max_message was sent whole, then refused by the server for good. It is refused at
    once, saying why; one that fits is attached."""
    from email.message import EmailMessage

    from channels.email.outbound import Outbound
    from echo_bot.errors import ChannelError

    config = EmailConfig(enabled=True, address="bot@example.org", imap_host="127.0.0.1",
                         smtp_host="127.0.0.1", trust_from=True, max_message=1_000_000)  # fmt: skip
    outbound = Outbound(config, host=None, edge=None, password="")  # type: ignore[arg-type]
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    big.write_bytes(b"\1" * 800_000)
    small.write_bytes(b"\1" * 500_000)
    mail = EmailMessage()
    mail.set_content("here it is")
    with pytest.raises(ChannelError, match="once encoded") as refused:
        await outbound._attach(mail, str(big), "big.bin", 800_000)
    assert not refused.value.retryable
    await outbound._attach(mail, str(small), "small.bin", 500_000)
    [part] = list(mail.iter_attachments())
    assert part.get_filename() == "small.bin" and len(bytes(mail)) < 1_000_000
