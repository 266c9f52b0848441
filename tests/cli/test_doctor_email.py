"""`echo-bot check-config` and `echo-bot doctor` for e-mail as the user runs them (a
subprocess), against the real servers of tests/mail_server.py: the logins, the mailbox,
IDLE, and a test mail only when asked; a section that cannot work refused by name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.channels.contract.drivers import mail_text
from tests.cli.test_doctor_checks import check_config, doctor, line
from tests.mail_server import AUTH_SERV_ID, MailServers
from tests.waiting import eventually


def email_config(tmp_path: Path, servers: MailServers, bot: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(servers.section(bot, ["you@example.org"]))
    return path


async def test_doctor_logs_in_to_both_servers_and_sends_only_when_asked(
    tmp_path: Path, mail_servers: MailServers
) -> None:
    bot, password = mail_servers.add_user("bot")
    config = email_config(tmp_path, mail_servers, bot)
    args = ("--config", str(config), "--state-dir", str(tmp_path / "s"))
    code, out = await doctor(*args, ECHO_BOT_EMAIL_PASSWORD=password)
    assert code == 0, out
    assert line(out, "email imap").startswith("[  ok]") and "IDLE" in out
    assert line(out, "email smtp").startswith("[  ok]")
    assert "not sent" in line(out, "email test mail") and password not in out
    assert await asyncio.to_thread(mail_servers.inbox, bot) == []

    code, out = await doctor(*args, ECHO_BOT_EMAIL_PASSWORD=password, ECHO_BOT_EMAIL_TEST_SEND="1")
    assert code == 0 and line(out, "email test mail").startswith("[  ok]"), out
    mails = await eventually(lambda: mail_servers.inbox(bot), timeout=15, what="the test mail")
    assert mails[0]["Auto-Submitted"] == "auto-generated" and "doctor" in mail_text(mails[0])


async def test_doctor_fails_on_a_wrong_password_and_on_a_server_away(
    tmp_path: Path, mail_servers: MailServers
) -> None:
    bot, _ = mail_servers.add_user("bot")
    config = email_config(tmp_path, mail_servers, bot)
    args = ("--config", str(config), "--state-dir", str(tmp_path / "s"))
    code, out = await doctor(*args, ECHO_BOT_EMAIL_PASSWORD="wrong-password")
    assert code == 1
    assert line(out, "email imap").startswith("[FAIL]") and "refused the login" in out
    assert line(out, "email smtp").startswith("[FAIL]") and "wrong-password" not in out

    away = tmp_path / "away.toml"
    away.write_text(config.read_text().replace(str(mail_servers.imap_port), "1"))
    code, out = await doctor("--config", str(away), "--state-dir", str(tmp_path / "s"),
                             ECHO_BOT_EMAIL_PASSWORD="x")  # fmt: skip
    assert code == 1 and "cannot reach 127.0.0.1:1" in line(out, "email imap"), out


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ('imap_host = "imap.example.org"', "imap_security = 'plain' is for a server on this"),
        ("auth_serv_id = false", "auth_serv_id"),
        ('allowed_users = ["You <you@example.org>"]', "an e-mail address"),
        ('password_env = "A B"', "password_env"),
        ("max_per_minute = 0", "max_per_minute"),
        ('auth_header = "X\\nBcc: a"', "auth_header"),
    ],
)
def test_check_config_refuses_an_email_section_that_cannot_work(
    tmp_path: Path, mail_servers: MailServers, section: str, said: str
) -> None:
    config = email_config(tmp_path, mail_servers, "bot@example.org")
    key = section.split(" = ")[0]
    text = "\n".join(ln for ln in config.read_text().splitlines() if not ln.startswith(key))
    config.write_text(f"{text}\n{section}\n")
    done = check_config(config, ECHO_BOT_EMAIL_PASSWORD="x")
    assert done.returncode == 2, done.stdout
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_check_config_says_how_senders_are_checked_and_what_is_missing(
    tmp_path: Path, mail_servers: MailServers
) -> None:
    config = email_config(tmp_path, mail_servers, "bot@example.org")
    done = check_config(config, ECHO_BOT_EMAIL_PASSWORD="x")
    assert done.returncode == 0, done.stderr
    assert f"senders checked by Authentication-Results from {AUTH_SERV_ID}" in done.stdout
    done = check_config(config)
    assert done.returncode == 2 and "ECHO_BOT_EMAIL_PASSWORD is not set" in done.stderr
    config.write_text(config.read_text().replace(f'auth_serv_id = "{AUTH_SERV_ID}"',
                                                 "trust_from = true"))  # fmt: skip
    done = check_config(config, ECHO_BOT_EMAIL_PASSWORD="x")
    assert done.returncode == 0 and "anyone can write as your senders" in done.stdout


async def test_doctor_says_when_the_newest_mail_is_checked_by_another_server_name(
    tmp_path: Path, mail_servers: MailServers
) -> None:
    """A wrong auth_serv_id made every sender's mail 'not vouched for': never answered,
    with only an info line in the log. Doctor reads the newest mail's topmost header."""
    bot, password = mail_servers.add_user("bot")
    config = email_config(tmp_path, mail_servers, bot)
    args = ("--config", str(config), "--state-dir", str(tmp_path / "s"))
    code, out = await doctor(*args, ECHO_BOT_EMAIL_PASSWORD=password)
    assert "no mail yet" in line(out, "email senders"), out
    stamped = (
        f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org\r\n"
        f"From: you@example.org\r\nTo: {bot}\r\nSubject: hi\r\n\r\nhello\r\n"
    ).encode()
    await asyncio.to_thread(mail_servers.deliver, stamped, bot)
    code, out = await doctor(*args, ECHO_BOT_EMAIL_PASSWORD=password)
    assert code == 0 and line(out, "email senders").startswith("[  ok]"), out
    config.write_text(config.read_text().replace(AUTH_SERV_ID, "mx.elsewhere.example"))
    code, out = await doctor(*args, ECHO_BOT_EMAIL_PASSWORD=password)
    senders = line(out, "email senders")
    assert senders.startswith("[warn]") and repr(AUTH_SERV_ID) in senders, out
