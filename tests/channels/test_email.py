"""The e-mail channel against real servers on 127.0.0.1 (tests/mail_server.py: Dovecot
for the mailboxes, an aiosmtpd receiving server that stamps Authentication-Results and
delivers over LMTP), for what the contract suite does not cover: who a sender is
(forged From:, a forged header), approvals by code (none, another request's), robots
never answered, threads, HTML-only mail, files both ways and a 30 MB one, malformed
MIME, a header injected through a subject, a renumbered mailbox.

The owner (an approver) and a friend (allowed to chat) mail the bot; a sender logged in
at the receiving server as its From: address is vouched for (dmarc=pass)."""

from __future__ import annotations

import asyncio
import imaplib
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast

import pytest

from channels.email.codes import Codes
from channels.email.outbound import subject_of
from channels.email.reading import Mail as ReadMail
from channels.email.reading import authentic, parsed, read
from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.brains.rules import files_reply
from echo_bot.bus import ChannelHost
from echo_bot.conversation import ChatMessage
from echo_bot.errors import ConfigError
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store
from echo_bot.tools.base import Tool
from tests.channels.contract.drivers import ContractBrain, EmailDriver, mail_text
from tests.mail_server import AUTH_SERV_ID, MailServers
from tests.waiting import eventually


class MailBrain(ContractBrain):
    """Files → where each was saved; ``heard:`` → what it heard; else the contract's
    brain."""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        if last.role == "user" and last.files:
            return BrainReply(text=files_reply(last.files), route_reason="test: files")
        if last.role == "user" and "heard:" in (last.content or ""):
            return BrainReply(text=f"heard: {last.content}", route_reason="test")
        return await super().step(conversation, tools, context)


class Mail(EmailDriver):
    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.brain = MailBrain()

    @property
    def peer_servers(self) -> MailServers:
        assert self.servers is not None
        return self.servers

    async def audit(self, kind: str) -> list[dict[str, Any]]:
        assert self.bot is not None
        rows = await self.bot.store.run(lambda tx: tx.audit.read(tail=10_000))
        return [row.data for row in rows if row.kind == kind]

    async def replies_to(self, message_id: str) -> list[EmailMessage]:
        return [m for m in self.mails() if message_id in str(m.get("In-Reply-To", ""))]


@pytest.fixture
async def chat(state_dir: Path, mail_servers: MailServers) -> AsyncIterator[Mail]:
    made = Mail(state_dir)
    made.fixtures = {"mail_servers": mail_servers}
    async with made.peer():
        yield made


async def test_a_reply_is_threaded_multipart_and_marked_as_automatic(chat: Mail) -> None:
    async with chat.running():
        first = chat.mail("say:one", Subject="plans")
        said = await chat.send(first)
        await chat.wait_received("echo: one")
        [reply] = await chat.replies_to(said)
        assert reply["Subject"] == "Re: plans"
        assert said in str(reply["References"])
        assert reply["Auto-Submitted"] == "auto-replied"  # other robots do not answer it
        assert reply.get_content_type() == "multipart/alternative"
        assert reply.get_body(preferencelist=("html",)) is not None
        # The same thread goes on in the same conversation; a new mail is a new one.
        follow = chat.mail("say:two", Subject="Re: plans", In_Reply_To=str(reply["Message-ID"]),
                           References=f"{said} {reply['Message-ID']}")  # fmt: skip
        await chat.send(follow)
        await chat.send(chat.mail("say:three", Subject="other"))
        await chat.wait_received("echo: two", "echo: three")
        inbound = await chat.inbound_addresses()
    assert inbound[0] == inbound[1] != inbound[2]
    assert all(a.startswith(f"email:{chat.owner}:") for a in inbound)


async def test_attack_a_forged_from_without_authentication_is_never_answered(
    chat: Mail,
) -> None:
    async with chat.running():
        # Sent as the owner by someone not logged in as the owner: the receiving server
        # says dmarc=fail; a header claiming a pass, added by the forger, sits below it.
        forged = chat.mail("say:forged")
        forged["Authentication-Results"] = f"{AUTH_SERV_ID}; dmarc=pass header.from=example.org"
        said = await chat.send(forged, login=chat.friend)
        await chat.acknowledged(said)  # flagged: looked at once, let go
        await chat.acknowledged(await chat.say("say:real"))
        await chat.wait_received("echo: real")
        assert "say:forged" not in await chat.inbound_texts()
        [refused] = await chat.audit("email.not_answered")
        assert refused["sender"] == chat.owner and "vouch" in refused["reason"]
    assert not any("forged" in text for text in chat.received())


async def test_attack_an_approval_reply_without_the_code_or_with_another_ones_decides_nothing(
    chat: Mail,
) -> None:
    async with chat.running():
        await chat.say("run:first")
        first = await chat.prompt()
        await chat.say("run:second")
        second = await chat.prompt()
        prompt: EmailMessage = first.handle
        # A reply "from the owner" with no code at all, then one with the second
        # request's code: neither decides the first request.
        for text in ("approve", f"approve {_code(second.text)}"):
            reply = chat.mail(text, Subject="Re: approve",
                              In_Reply_To=str(prompt["Message-ID"]))  # fmt: skip
            await chat.acknowledged(await chat.send(reply))
        await eventually(lambda: len([t for t in chat.received() if "not allowed" in t]) >= 1,
                         timeout=20, what="the refusal")  # fmt: skip
        assert not (chat.state_dir / "workspace" / "contract.txt").exists()
        assert len(await chat.audit("email.forged_action")) == 2
        await chat.decide(first, approve=True)
        await chat.wait_received("ran: first")
        await chat.decide(second, approve=False)
        await chat.wait_received("not run: second")


async def test_a_question_answering_a_prompt_quoted_without_marks_decides_nothing(
    chat: Mail,
) -> None:
    """A client that quotes the prompt without ``>`` (Outlook's "From:/Sent:" block)
    carries its code along: "Yes, but what does it do?" above it is a question, not a
    decision; the bare verb on its own line is one."""
    async with chat.running():
        await chat.say("run:first")
        first = await chat.prompt()
        prompt: EmailMessage = first.handle
        quoted = f"\n\nFrom: {chat.bot_address}\nSent: today\n\n{first.text}"
        for text in ("Yes what does this do?" + quoted, "approve" + quoted):
            reply = chat.mail(text, Subject="Re: approve",
                              In_Reply_To=str(prompt["Message-ID"]))  # fmt: skip
            await chat.acknowledged(await chat.send(reply))
            if text.startswith("Yes"):
                await chat.acknowledged(await chat.say("say:between"))
                await chat.wait_received("echo: between")
                assert not (chat.state_dir / "workspace" / "contract.txt").exists()
        await chat.wait_received("ran: first")


def _code(text: str) -> str:
    from tests.channels.contract.drivers import MAIL_CODE

    found = MAIL_CODE.search(text)
    assert found is not None, text
    return found.group(0)


@pytest.mark.parametrize(
    "headers",
    [
        {"Auto-Submitted": "auto-replied"},
        {"Precedence": "bulk"},
        {"List-Id": "<news.example.org>"},
        {"X-Autoreply": "yes"},
    ],
)
async def test_attack_a_robots_mail_is_never_answered_so_no_loop_starts(
    chat: Mail, headers: dict[str, str]
) -> None:
    async with chat.running():
        said = await chat.send(chat.mail("say:robot", **headers))
        await chat.acknowledged(said)
        await chat.acknowledged(await chat.say("say:person"))
        await chat.wait_received("echo: person")
        [let_go] = await chat.audit("email.not_answered")
        assert "program" in let_go["reason"]
    assert not any("robot" in text for text in chat.received())


async def test_a_bounce_with_an_empty_return_path_is_never_answered(chat: Mail) -> None:
    bounce = chat.mail("say:bounce", Subject="Undelivered Mail Returned to Sender")
    stamped = f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org\r\n"
    async with chat.running():
        raw = stamped.encode() + bytes(bounce)
        await asyncio.to_thread(chat.peer_servers.deliver, raw, chat.bot_address, "")
        await chat.acknowledged(str(bounce["Message-ID"]))
        await chat.acknowledged(await chat.say("say:after"))
        await chat.wait_received("echo: after")
        assert "bounce" in (await chat.audit("email.not_answered"))[0]["reason"]
    assert not any("bounce" in text for text in chat.received())


async def test_attack_a_malformed_from_naming_an_allowed_sender_is_never_answered(
    chat: Mail,
) -> None:
    """``From: owner@example.org <mallory@example.org>``: the receiving server reads the
    address in angle brackets, Mallory's own, and vouches for its domain (the owner's
    too); Python's parser reads the owner. Such a From: is not one sender."""
    mallory, _ = chat.peer_servers.add_user("mallory")
    raw = (
        f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org\r\n"
        f"From: {chat.owner} <{mallory}>\r\nTo: {chat.bot_address}\r\nSubject: hi\r\n"
        "Message-ID: <forged@example.org>\r\n\r\nsay:forged\r\n"
    ).encode()
    async with chat.running():
        await asyncio.to_thread(chat.peer_servers.deliver, raw, chat.bot_address, mallory)
        await chat.acknowledged("<forged@example.org>")
        await chat.acknowledged(await chat.say("say:after"))
        await chat.wait_received("echo: after")
        [let_go] = await chat.audit("email.not_answered")
        assert let_go["reason"] == "From: does not name one sender cleanly"
    assert not any("forged" in text for text in chat.received())


async def test_a_stranger_vouched_for_is_told_how_to_pair_and_an_unvouched_one_hears_nothing(
    chat: Mail,
) -> None:
    stranger, _ = chat.peer_servers.add_user("stranger")
    async with chat.running():
        await chat.acknowledged(await chat.send(chat.mail("hello", sender=stranger)))
        await eventually(lambda: chat.mails(stranger), timeout=20, what="the refusal")
        [told] = chat.mails(stranger)
        assert stranger in mail_text(told) and "pair" in mail_text(told)
        # Mail "from" another stranger, not vouched for: no answer goes anywhere.
        forged = chat.mail("hello", sender="victim@example.org")
        await chat.acknowledged(await chat.send(forged, login=stranger))
    assert len(chat.mails(stranger)) == 1
    sent_by_bot = f"From: {chat.bot_address}".encode()
    assert len([raw for raw in chat.peer_servers.received if sent_by_bot in raw]) == 1


async def test_attack_a_stranger_cannot_make_the_bot_write_to_them_again_and_again(
    chat: Mail,
) -> None:
    """Replies "approve" to prompt-looking ids, each in a thread of its own, used to be
    answered each with a notice (and a thread kept each): a stranger could make the bot
    mail them as often as they liked. A stranger is told how to pair, once."""
    stranger, _ = chat.peer_servers.add_user("stranger")
    domain = chat.bot_address.rpartition("@")[2]
    async with chat.running():
        for n in range(4):
            target = f"<{n:032x}.approval@{domain}>"
            reply = chat.mail("approve", sender=stranger, Subject=f"Re: {n}",
                              In_Reply_To=target, References=target)  # fmt: skip
            await chat.acknowledged(await chat.send(reply))
        await eventually(lambda: chat.mails(stranger), timeout=20, what="the refusal")
        await asyncio.sleep(1.0)
        assert await chat.audit("email.forged_action") == []
    [told] = chat.mails(stranger)
    assert "pair" in mail_text(told)


async def test_html_only_mail_is_read_as_text_quoted_mail_left_out_a_subject_alone_read(
    chat: Mail,
) -> None:
    mail = chat.mail("")
    mail.set_content(
        "<html><head><style>p{}</style></head><body><p>heard: <b>bold</b> &amp; done</p>"
        "<script>alert(1)</script></body></html>",
        subtype="html",
    )
    async with chat.running():
        await chat.send(mail)
        await chat.wait_received("heard:")
        quoted = chat.mail("heard: mine\n\nOn Monday, someone wrote:\n> old text\n> more")
        await chat.send(quoted)
        await chat.send(chat.mail("", Subject="heard: only the subject"))
        await eventually(lambda: len(chat.received()) == 3, timeout=20, what="three replies")
        texts = await chat.inbound_texts()
    assert texts == ["heard: bold & done", "heard: mine", "heard: only the subject"]


async def test_files_both_ways_within_max_download(chat: Mail) -> None:
    content = b"quarterly numbers: 42\n" * 50
    workspace = chat.state_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "report.txt").write_bytes(b"the report body\n")
    chat.extra = 'max_download = "2KB"'
    mail = chat.mail("here it is")
    mail.add_attachment(content, maintype="text", subtype="plain", filename="q3.txt")
    mail.add_attachment(b"x" * 5000, maintype="application", subtype="octet-stream",
                        filename="big.bin")  # fmt: skip
    async with chat.running():
        await chat.send(mail)
        await chat.wait_received("q3.txt", "big.bin")
        saved = sorted(p for p in (workspace / "inbox").rglob("*") if p.is_file())
        assert [p.read_bytes() for p in saved] == [content], chat.received()
        [reply] = [t for t in chat.received() if "big.bin" in t]
        assert "max_download" in reply or "limit" in reply, reply

        args = {"path": "report.txt", "caption": "the **report**"}
        await chat.say(f"/tool send_file {json.dumps(args)}")  # the owner's own mail
        await eventually(lambda: [m for m in chat.mails() if list(m.iter_attachments())],
                         timeout=20, what="the file by mail")  # fmt: skip
    [sent] = [m for m in chat.mails() if list(m.iter_attachments())]
    [attached] = list(sent.iter_attachments())
    assert attached.get_filename() == "report.txt"
    assert attached.get_content() in (b"the report body\n", "the report body\n")


async def test_attack_a_30_mb_mail_is_answered_with_a_note_and_not_read(chat: Mail) -> None:
    mail = chat.mail("say:huge")
    mail.add_attachment(b"\0" * (30 * 1000**2), maintype="application",
                        subtype="octet-stream", filename="huge.bin")  # fmt: skip
    async with chat.running():
        said = await chat.send(mail)
        await chat.acknowledged(said)
        await eventually(lambda: any("over the" in t for t in chat.received()), timeout=30,
                         what="the note")  # fmt: skip
        await chat.acknowledged(await chat.say("say:small"))
        await chat.wait_received("echo: small")
        assert "say:huge" not in await chat.inbound_texts()
    [note] = [t for t in chat.received() if "over the" in t]
    assert "over the 25.0 MB this bot reads" in note, note


MALFORMED = [
    # A multipart whose boundary never comes, a charset nobody knows, 8-bit bytes in
    # headers, a header folded forever, and no Message-ID.
    b"Content-Type: multipart/mixed; boundary=nowhere\r\n\r\n--elsewhere\r\nheard: cut\r\n",
    b"Content-Type: text/plain; charset=x-unknown-42\r\n\r\nheard: \xff\xfe odd\r\n",
    b"Subject: \xc3\x28 bad utf-8\r\nContent-Type: text/plain\r\n\r\nheard: 8bit\r\n",
    b"X-Long: " + b"a" * 5000 + b"\r\n\r\nheard: long header\r\n",
]


async def test_attack_malformed_mime_is_read_as_far_as_it_goes_and_nothing_stops(
    chat: Mail,
) -> None:
    stamp = f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org\r\n"
    async with chat.running():
        for body in MALFORMED:
            head = f"{stamp}From: {chat.owner}\r\nTo: {chat.bot_address}\r\n"
            await asyncio.to_thread(chat.peer_servers.deliver, head.encode() + body,
                                    chat.bot_address)  # fmt: skip
        # Nested deeper than the parser goes: let go (audited), never read again.
        nested = b"".join(b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n"
                          % (i, i) for i in range(1500))  # fmt: skip
        head = f"{stamp}From: {chat.owner}\r\nTo: {chat.bot_address}\r\n"
        await asyncio.to_thread(chat.peer_servers.deliver, head.encode() + nested,
                                chat.bot_address, chat.owner)  # fmt: skip
        await chat.acknowledged(await chat.say("say:still"))
        await chat.wait_received("echo: still")
        assert chat.health() == "ok"
        assert len(await chat.inbound_texts()) == len(MALFORMED) + 1
        [unreadable] = await chat.audit("email.not_answered")
        assert "RecursionError" in unreadable["reason"]


async def test_attack_a_header_injected_through_a_subject_never_becomes_a_header(
    chat: Mail,
) -> None:
    """A subject whose encoded words decode to a line break and a Bcc: header: the
    reply's subject stays one line, and no Bcc goes out."""
    stamp = f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org"
    raw = (
        f"{stamp}\r\nFrom: {chat.owner}\r\nTo: {chat.bot_address}\r\n"
        "Subject: =?utf-8?q?hello=0D=0ABcc=3A_victim=40example=2Eorg?=\r\n"
        "Message-ID: <injected@example.org>\r\n\r\nsay:subject\r\n"
    ).encode()
    assert subject_of("line\r\nBcc: x@y.org\u2028To: z") == "line Bcc: x@y.org To: z"
    async with chat.running():
        await asyncio.to_thread(chat.peer_servers.deliver, raw, chat.bot_address)
        await chat.wait_received("echo: subject")
        [reply] = await chat.replies_to("<injected@example.org>")
        assert "Bcc" not in reply and "\n" not in str(reply["Subject"])
        assert str(reply["Subject"]).startswith("Re: hello")
    outgoing = [raw for raw in chat.peer_servers.received if b"echo: subject" in raw]
    assert len(outgoing) == 1 and b"\nBcc:" not in outgoing[0]


async def test_a_renumbered_mailbox_answers_the_untaken_mail_and_not_the_old(
    chat: Mail,
) -> None:
    chat.extra = 'mailbox = "Bot"'
    _mailbox(chat, "CREATE")
    async with chat.running():
        await chat.acknowledged(await chat.send_to_box("say:old"))
        await chat.wait_received("echo: old")
    # The mailbox made anew (a new UIDVALIDITY): the old mail, taken, copied back in with
    # its flag, and a new one that came while the daemon was down.
    _mailbox(chat, "RENUMBER")
    await chat.send_to_box("say:new")
    async with chat.running():
        await chat.wait_received("echo: new")
        await chat.acknowledged(await chat.send_to_box("say:later"))
        await chat.wait_received("echo: later")
    texts = [t for t in chat.received() if t.startswith("echo")]
    assert texts == ["echo: old", "echo: new", "echo: later"]


async def test_a_mailbox_restored_from_an_older_backup_is_read_on_after_each_restart(
    chat: Mail,
) -> None:
    """Renumbered with fewer mails than it had (its UIDs now below the last one taken
    before): new mail is answered, and still after the next restart."""
    chat.extra = 'mailbox = "Bot"'
    _mailbox(chat, "CREATE")
    async with chat.running():
        for word in ("one", "two", "three"):
            await chat.acknowledged(await chat.send_to_box(f"say:{word}"))
            await chat.wait_received(f"echo: {word}")
    _mailbox(chat, "RENUMBER", keep=1)
    async with chat.running():
        await chat.acknowledged(await chat.send_to_box("say:new"))
        await chat.wait_received("echo: new")
    async with chat.running():
        await chat.acknowledged(await chat.send_to_box("say:restarted"))
        await chat.wait_received("echo: restarted")
    texts = [t for t in chat.received() if t.startswith("echo")]
    assert texts == ["echo: one", "echo: two", "echo: three", "echo: new", "echo: restarted"]


async def test_a_mailbox_restored_to_its_earlier_uidvalidity_with_fewer_mails_is_read_on(
    chat: Mail,
) -> None:
    """Read up to UID 5 under UIDVALIDITY V1, renumbered (V2, one mail kept), then
    given V1 again: UIDs 3 to 5 come again. The position kept for V1 (5) only moves
    forward: after the next restart they were never read. A position past the
    mailbox's next UID is now a renumbering."""
    chat.extra = 'mailbox = "Bot"'
    _mailbox(chat, "CREATE")
    first = _validity(chat)
    words = ("one", "two", "three", "four", "five")
    async with chat.running():
        for word in words:
            await chat.acknowledged(await chat.send_to_box(f"say:{word}"))
            await chat.wait_received(f"echo: {word}")
    _mailbox(chat, "RENUMBER", keep=1)
    async with chat.running():
        await chat.acknowledged(await chat.send_to_box("say:renumbered"))
        await chat.wait_received("echo: renumbered")
    _mailbox(chat, f"LOWER:{first}")  # V1 again, its next UID 3
    for word in ("back", "restarted", "again"):
        async with chat.running():
            await chat.acknowledged(await chat.send_to_box(f"say:{word}"))
            await chat.wait_received(f"echo: {word}")
    texts = [t.removeprefix("echo: ") for t in chat.received() if t.startswith("echo")]
    assert texts == [*words, "renumbered", "back", "restarted", "again"]


async def test_mail_left_unread_at_the_first_start_stays_unanswered_after_a_renumbering(
    chat: Mail, caplog: pytest.LogCaptureFixture
) -> None:
    """The first start reads from the next mail on: what waited before it is left
    alone, also when the mailbox is renumbered soon after. And a restore that brings
    the UIDVALIDITY *down* is taken as a renumbering once, not at every start."""
    chat.extra = 'mailbox = "Bot"'
    _mailbox(chat, "CREATE")
    before = chat.mail("say:before")  # an hour before the daemon's first start
    stamp = f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org"
    raw = stamp.encode() + b"\r\n" + bytes(before)
    await asyncio.to_thread(chat.peer_servers.append, chat.bot_address, "Bot", raw,
                            arrived=time.time() - 3600)  # fmt: skip
    async with chat.running():
        await chat.acknowledged(await chat.send_to_box("say:first"))
        await chat.wait_received("echo: first")
    _mailbox(chat, "RENUMBER")
    await chat.send_to_box("say:new")
    async with chat.running():
        await chat.wait_received("echo: new")
        await chat.acknowledged(await chat.send_to_box("say:later"))
        await chat.wait_received("echo: later")
    _mailbox(chat, "LOWER")
    for word in ("lowered", "again"):
        caplog.clear()
        async with chat.running():
            await chat.acknowledged(await chat.send_to_box(f"say:{word}"))
            await chat.wait_received(f"echo: {word}")
            assert "say:before" not in await chat.inbound_texts()
        renumbered = [r for r in caplog.records if "was renumbered" in r.getMessage()]
        assert len(renumbered) == (1 if word == "lowered" else 0)
    texts = [t for t in chat.received() if t.startswith("echo")]
    assert texts == ["echo: first", "echo: new", "echo: later", "echo: lowered", "echo: again"]


def _validity(chat: Mail) -> int:
    """The UIDVALIDITY of the bot's mailbox "Bot" now."""
    conf = str(chat.peer_servers.root / "dovecot.conf")
    status = subprocess.run(["doveadm", "-c", conf, "-f", "flow", "mailbox", "status", "-u",
                             chat.bot_address, "uidvalidity", "Bot"],
                            check=True, capture_output=True, text=True)  # fmt: skip
    return int(status.stdout.split("=")[-1])


def _mailbox(chat: Mail, what: str, keep: int | None = None) -> None:
    """The bot's mailbox "Bot" made (CREATE), restored from a backup of its mail, each
    with its flags and arrival (RENUMBER; ``keep``: the first ones only), or given a
    lower UIDVALIDITY, its mail kept (LOWER)."""
    servers = chat.peer_servers
    conf = str(servers.root / "dovecot.conf")
    if what.startswith("LOWER"):  # LOWER:<n>: to that UIDVALIDITY (a restore's)
        validity = what.partition(":")[2] or "5"
        subprocess.run(["doveadm", "-c", conf, "mailbox", "update", "-u", chat.bot_address,
                        "--uid-validity", validity, "Bot"],
                       check=True, capture_output=True)  # fmt: skip
        return
    with imaplib.IMAP4("127.0.0.1", servers.imap_port, timeout=20) as imap:
        imap.login(chat.bot_address, servers.passwords[chat.bot_address])
        if what == "CREATE":
            imap.create("Bot")
            return
        imap.select("Bot")
        _, found = imap.uid("SEARCH", "ALL")
        kept = []
        for uid in found[0].split():
            _, data = imap.uid("FETCH", uid, "(FLAGS INTERNALDATE BODY.PEEK[])")
            items, raw = next(part for part in data if isinstance(part, tuple))
            listed = re.search(rb"FLAGS \(([^)]*)\)", items)
            own = [f for f in (listed.group(1).split() if listed else []) if f != rb"\Recent"]
            kept.append((b"(" + b" ".join(own) + b")", imaplib.Internaldate2tuple(items), raw))
        imap.close()
        imap.rename("Bot", "Bot-before")  # as a restore from a backup leaves it
        imap.create("Bot")
        for flags, arrived, raw in kept[:keep]:  # keep: only the first ones (an older backup)
            imap.append("Bot", flags.decode(), arrived, raw)  # each as it was


def test_authentication_results_are_read_from_the_topmost_header_of_the_server_only() -> None:
    def vouched(*headers: str, sender: str = "me@example.org") -> bool:
        raw = "".join(f"Authentication-Results: {h}\r\n" for h in headers)
        message = parsed(f"{raw}From: {sender}\r\n\r\nhi\r\n".encode())
        return authentic(message, sender, "Authentication-Results", "mx.example.org")

    assert vouched("mx.example.org; dmarc=pass header.from=example.org")
    assert vouched("mx.example.org 1; dkim=pass (good) header.d=example.org; spf=fail")
    assert vouched("mx.example.org; dkim=pass header.i=@example.org", sender="a@sub.example.org")
    assert not vouched("mx.example.org; dmarc=fail header.from=example.org")
    assert not vouched("mx.example.org; dmarc=pass header.from=evil.example")
    assert not vouched("mx.example.org; dkim=pass header.d=ample.org")
    assert not vouched("other.example; dmarc=pass header.from=example.org")
    assert not vouched("mx.example.org; dmarc=none",
                       "mx.example.org; dmarc=pass header.from=example.org")  # fmt: skip
    assert not vouched("mx.example.org; (dmarc=pass header.from=example.org) dmarc=fail")
    assert not vouched(";;;=;", "")
    # A domain without a DMARC policy (none) or a DNS failure (temperror) vetoes no DKIM
    # pass; only its policy's failure does, and none of them vouches alone.
    signed = "mx.example.org; dkim=pass header.d=example.org; dmarc={} header.from=example.org"
    assert vouched(signed.format("none")) and vouched(signed.format("temperror"))
    assert not vouched(signed.format("fail"))
    assert not vouched("mx.example.org; dmarc=none header.from=example.org")
    assert not vouched()
    mail = read(b"From: a@x.org, b@x.org\r\n\r\nhi", auth=("Authentication-Results", "mx"))
    assert mail.sender is None  # two senders: nobody to answer


def test_who_a_mail_is_from_and_to_is_read_off_its_headers_and_a_mailer_daemon_is_a_program() -> (
    None
):
    def mail(headers: str) -> ReadMail:
        return read(f"{headers}\r\n\r\nhi".encode(), auth=("Authentication-Results", "mx"))

    one = mail('From: "Ann \x07Lee" <Ann@X.org>\r\nTo: Bot@x.org\r\nCc: c@x.org, bot@x.org')
    assert (one.sender, one.name, one.recipients) == (
        "ann@x.org",
        "Ann Lee",
        ["bot@x.org", "c@x.org"],
    )
    assert one.automatic is None and one.direct("bot@x.org") is False
    assert mail("From: a@x.org\r\nTo: bot@x.org").direct("bot@x.org")
    assert mail("From: nobody").sender is None  # no address in it
    assert mail("From: <MAILER-DAEMON@x.org>").automatic == "a mailer daemon"
    assert mail("From: postmaster@x.org").automatic == "a mailer daemon"
    assert mail("From: a@x.org\r\nTo: ,,,<>").recipients == []
    # Malformed, it may name another address than it reads as: not one sender.
    assert mail("From: a@x.org <m@x.org>").sender is None
    assert mail("From: <a@x.org> <m@x.org>").sender is None
    assert mail("From: Ann.Lee <ann@x.org>").sender == "ann@x.org"  # obsolete, not malformed


async def test_over_tls_both_ways_with_the_servers_own_certificate(
    state_dir: Path, tls_mail_servers: MailServers
) -> None:
    """IMAP over TLS and SMTP with STARTTLS, the servers' certificate trusted through
    ca_file; without it, the start is refused saying what to set."""
    made = Mail(state_dir)
    made.fixtures = {"mail_servers": tls_mail_servers}
    async with made.peer():
        made.ports = (tls_mail_servers.imaps_port, tls_mail_servers.smtp_port)
        made.security = 'imap_security = "tls"\nsmtp_security = "starttls"'
        with pytest.raises(ConfigError, match="ca_file"):
            async with made.running():
                pass
        made.extra = f'ca_file = "{tls_mail_servers.tls}"'
        async with made.running():
            await made.acknowledged(await made.say("say:secure"))
            await made.wait_received("echo: secure")
    outgoing = [raw for raw in tls_mail_servers.received if b"echo: secure" in raw]
    assert len(outgoing) == 1


def test_attack_a_quoted_value_in_authentication_results_is_never_read_as_a_result() -> None:
    def vouched(header: str, sender: str = "you@example.org") -> bool:
        raw = f"Authentication-Results: {header}\r\nFrom: {sender}\r\n\r\nhi\r\n".encode()
        return authentic(parsed(raw), sender, "Authentication-Results", "mx.example.org")

    smuggled = 'spf=pass smtp.mailfrom="x;dkim=pass header.d=example.org;"@evil.com'
    assert not vouched(f"mx.example.org; {smuggled}; dmarc=fail header.from=example.org")
    assert not vouched(f"mx.example.org; {smuggled}")
    # The server's own DMARC failure for the domain wins over a DKIM pass.
    assert not vouched("mx.example.org; dkim=pass header.d=example.org; dmarc=fail"
                       " header.from=example.org")  # fmt: skip
    assert not vouched("mx.example.org; dkim=pass header.d=org")  # a top-level domain
    assert vouched('mx.example.org; spf=pass smtp.mailfrom="a;b"@x.org;'
                   " dmarc=pass header.from=example.org")  # fmt: skip
    # An envelope sender is any local part: `=?utf-8?q?…?=` is one, which the header's
    # decoding turned into `);dkim=pass header.d=example.org;(` (rspamd and Gmail copy
    # it into a comment and into smtp.mailfrom). The header is read as it came.
    word = "=?utf-8?q?=29=3Bdkim=3Dpass_header.d=3Dexample.org=3B=28?="
    assert not vouched(f"mx.example.org; spf=pass (domain of {word}@evil.org designates"
                       f" 192.0.2.1) smtp.mailfrom={word}@evil.org; dmarc=none")  # fmt: skip
    assert not vouched(f'mx.example.org; spf=none smtp.mailfrom="{word}"')
    assert not vouched("mx.example.org; spf=none smtp.helo= =?utf-8?q?x=3B_dkim=3Dpass"
                       "_header.d=3Dexample.org?=")  # fmt: skip
    # Comments nest: what is inside one is never a result.
    assert not vouched("mx.example.org; spf=pass (of (x) ; dkim=pass header.d=example.org )"
                       " smtp.mailfrom=x@evil.org")  # fmt: skip
    assert not vouched("mx.example.org; spf=pass (open; dkim=pass header.d=example.org")
    assert vouched("mx.example.org; dkim=pass (a (nested) note)header.d=example.org")


def test_attack_a_mail_nested_too_deep_or_with_hostile_html_is_let_go_in_bounded_time() -> None:
    nested = b"".join(
        b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (i, i)
        for i in range(1500)
    )
    with pytest.raises(RecursionError):
        read(b"From: you@example.org\r\n" + nested, auth=("Authentication-Results", "mx"))
    hostile = b"Content-Type: text/html\r\n\r\n<!--" + b"<a" * 3_000_000
    mail = read(b"From: you@example.org\r\n" + hostile, auth=("Authentication-Results", "mx"))
    assert len(mail.text) <= 64_000


class StoreNotes:
    """The notes of a ``ChannelHost`` on a real store, as a daemon's host keeps them;
    ``meanwhile`` runs once, after the first read that finds nothing (another daemon
    acting between this one's read and its write)."""

    def __init__(self, store: Store, meanwhile: Callable[[], Awaitable[object]] | None = None):
        self.store = store
        self.meanwhile = meanwhile

    async def recall_note(self, name: str) -> tuple[str, float] | None:
        kept = await self.store.run(lambda tx: tx.meta.note(name))
        if kept is None and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        return kept

    async def remember_note(self, name: str, value: str, *, replace: bool = True) -> None:
        await self.store.run(lambda tx: tx.meta.set_note(name, value, replace=replace))


async def test_two_daemons_making_the_approval_key_at_once_both_use_the_one_kept(
    tmp_path: Path,
) -> None:
    """Both daemons of a store find no key and make one: the first written is kept and
    used by both, so a code one daemon mailed is the code the other one checks."""
    store = Store(Database(tmp_path / "codes.sqlite3"), Masker())
    await store.open()
    try:
        other = Codes(cast(ChannelHost, StoreNotes(store)))
        first = Codes(cast(ChannelHost, StoreNotes(store, lambda: other.code("p", "a@x.org"))))
        mailed = await first.code("<p>", "a@x.org")
        assert await other.given("<p>", "A@x.org", f"approve {mailed}")
        assert mailed == await other.code("<p>", "a@x.org")
        assert not await other.given("<q>", "a@x.org", f"approve {mailed}")  # another prompt's
    finally:
        await store.close()
