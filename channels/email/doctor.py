"""What ``echo-bot doctor`` checks of e-mail: the IMAP login and the mailbox (opened,
nothing read or flagged), whether the server has IDLE, the SMTP login, and — only
when asked, with ``ECHO_BOT_EMAIL_TEST_SEND=1`` in doctor's environment — a test mail
to the bot's own address. Every step bounded; the password never in what is printed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib

from echo_bot.bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnosis
from echo_bot.errors import ConfigError

from .mailbox import Mailbox, MailboxAway
from .outbound import smtp_options
from .reading import parsed, topmost_results
from .settings import EmailConfig

STEP_TIMEOUT = 20.0
TEST_SEND = "ECHO_BOT_EMAIL_TEST_SEND"


async def diagnose(
    section: EmailConfig, environ: Mapping[str, str], state_dir: Path
) -> list[Diagnosis]:
    password = environ.get(section.password_env, "")
    found = [*await _imap(section, password), await _smtp(section, password, send=False)]
    if environ.get(TEST_SEND) == "1":
        found.append(await _smtp(section, password, send=True))
    elif found[-1].status == DIAGNOSIS_OK:
        found.append(Diagnosis("email test mail", DIAGNOSIS_OK,
                               f"not sent (set {TEST_SEND}=1 to send one to the bot)"))  # fmt: skip
    return found


async def _imap(section: EmailConfig, password: str) -> list[Diagnosis]:
    name, where = "email imap", f"{section.imap_host}:{section.imap_at}"
    box = Mailbox(section, password)
    try:
        async with asyncio.timeout(STEP_TIMEOUT):
            selected = await box.open()
            newest = await box.head(selected.next_uid - 1) if selected.next_uid > 1 else None
    except ConfigError as exc:
        return [Diagnosis(name, DIAGNOSIS_FAIL, str(exc))]
    except (MailboxAway, TimeoutError) as exc:
        return [Diagnosis(name, DIAGNOSIS_FAIL, f"cannot reach {where}: {exc}")]
    finally:
        await box.close()
    text = f"{section.login} logged in at {where}, {section.mailbox} opened"
    senders = _senders(section, newest[1] if newest else None)
    if not selected.idle:
        every = f"{section.poll_every.total_seconds():g} s"
        return [Diagnosis(name, DIAGNOSIS_WARN, f"{text}; no IDLE: looked at every {every}"),
                senders]  # fmt: skip
    return [Diagnosis(name, DIAGNOSIS_OK, f"{text}; IDLE: new mail is seen at once"), senders]


def _senders(section: EmailConfig, header: bytes | None) -> Diagnosis:
    """Whether the newest mail's topmost ``auth_header`` is ``auth_serv_id``'s: if not,
    every sender's mail is taken as not vouched for, and never answered."""
    name, wanted = "email senders", f"{section.auth_header} from {section.auth_serv_id}"
    if section.trust_from:
        return Diagnosis(name, DIAGNOSIS_WARN, "trust_from: From: is taken as written")
    if header is None:
        return Diagnosis(name, DIAGNOSIS_OK, f"no mail yet to look for {wanted} in")
    found = topmost_results(parsed(header), section.auth_header)
    server = found[0][0] if found and found[0] else None
    if server is not None and server.lower() == str(section.auth_serv_id).lower():
        return Diagnosis(name, DIAGNOSIS_OK, f"the newest mail has {wanted}")
    said = f"was written by {server!r}" if server else "is missing"
    return Diagnosis(name, DIAGNOSIS_WARN,
                     f"the newest mail's {section.auth_header} {said} (auth_serv_id is"
                     f" {section.auth_serv_id!r}): mail checked this way is never answered; set"
                     " auth_serv_id to the name your server writes first in it")  # fmt: skip


async def _smtp(section: EmailConfig, password: str, *, send: bool) -> Diagnosis:
    name = "email test mail" if send else "email smtp"
    where = f"{section.smtp_host}:{section.smtp_at} ({section.smtp_security})"
    client = aiosmtplib.SMTP(**smtp_options(section))
    try:
        async with asyncio.timeout(STEP_TIMEOUT * 2):
            await client.connect()
            await client.login(section.login, password)
            if send:
                await client.send_message(_test_mail(section))
            await client.quit()
    except aiosmtplib.SMTPAuthenticationError:
        return Diagnosis(name, DIAGNOSIS_FAIL, f"{where} refused the login of {section.login}")
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        return Diagnosis(name, DIAGNOSIS_FAIL, f"{where}: {exc}")
    finally:
        client.close()
    if send:
        return Diagnosis(name, DIAGNOSIS_OK, f"sent to {section.address}: look for it there")
    return Diagnosis(name, DIAGNOSIS_OK, f"{section.login} logged in at {where}")


def _test_mail(section: EmailConfig) -> EmailMessage:
    mail = EmailMessage()
    mail["From"] = mail["To"] = str(section.address)
    mail["Subject"] = "echo-bot doctor: a test mail"
    mail["Auto-Submitted"] = "auto-generated"  # the bot never answers it
    mail.set_content("echo-bot doctor sent this to check that mail goes out. Nothing to do.")
    return mail
