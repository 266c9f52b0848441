"""Real mail servers for the e-mail tests, on 127.0.0.1: Dovecot (Debian's
``dovecot-imapd`` and ``dovecot-lmtpd``: ``.ci/run`` installs them) holds the mailboxes
and serves IMAP; an SMTP server (aiosmtpd) in the test's process receives every mail,
stamps it the way a receiving server does, and delivers it into Dovecot over LMTP.

The SMTP server plays the receiving server of ``example.org``: it takes a login (SMTP
AUTH, the users' Dovecot passwords) and adds, on top of the mail, the
``Authentication-Results`` header of ``AUTH_SERV_ID`` — ``dmarc=pass`` for the From:
domain when the sender logged in as the From: address, ``dmarc=fail`` otherwise. It
strips no header the mail came with: a forged one stays below, as on a careless server.
``refuse_next(n, login)`` answers the next ``n`` mails ``login`` sends with a 451 ("try
later").

Where Dovecot is missing the e-mail tests fail under CI (``CI`` set) and are skipped,
saying why, everywhere else, as tests/postgres.py does for PostgreSQL.

Fixture (tests/conftest.py registers this module as a plugin): ``mail_servers``, one
Dovecot and one SMTP server per test process (their start costs about a second). Its
``MailServers`` gives ``add_user(local) -> (address, password)`` (a new mailbox: tests
take fresh ones and share the servers), ``send(mail, login=…)``, ``inbox(address)``
(the mails there, parsed, oldest first), ``deliver(raw, to)`` (straight into a mailbox,
as if another server had stamped it), the ports and ``log_tail()``.
"""

from __future__ import annotations

import contextlib
import imaplib
import os
import pwd
import secrets
import shutil
import smtplib
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import parseaddr
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.ports import free_port

DOVECOT = Path("/usr/sbin/dovecot")
DOMAIN = "example.org"
AUTH_SERV_ID = "mx.example.org"
PLAIN = 'imap_security = "plain"\nsmtp_security = "plain"'  # loopback: no TLS
START_TIMEOUT = 20.0


def _unavailable(reason: str) -> NoReturn:
    message = f"no Dovecot for the e-mail tests: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message + " (apt-get install dovecot-imapd dovecot-lmtpd, as .ci/run does)")


def _certificate(root: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (its key beside it): the CA a test's
    config trusts through ``ca_file``."""
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert


def _dovecot_conf(
    root: Path, imap: int, lmtp: int, password: str, mail_user: str, imaps: int
) -> str:
    internal, login = ("dovecot", "dovenull") if os.geteuid() == 0 else (mail_user, mail_user)
    # With TLS: IMAPS on ``imaps`` for the bot; the plain port stays open for the tests.
    tls = "ssl = no"
    if imaps:
        tls = f"ssl = yes\nssl_cert = <{root}/cert.pem\nssl_key = <{root}/key.pem"
    return f"""
base_dir = {root}/run
state_dir = {root}/state
instance_name = echo-bot-test-{root.name}
listen = 127.0.0.1
protocols = imap lmtp
{tls}
disable_plaintext_auth = no
auth_mechanisms = plain login
log_path = {root}/dovecot.log
default_internal_user = {internal}
default_login_user = {login}
mail_location = maildir:{root}/mail/%u
mail_uid = {mail_user}
mail_gid = {mail_user}
first_valid_uid = 1
first_valid_gid = 1
passdb {{
  driver = static
  args = password={password}
}}
userdb {{
  driver = static
  args = uid={mail_user} gid={mail_user} home={root}/mail/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps}
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {lmtp}
  }}
  unix_listener lmtp {{
    mode = 0666
  }}
}}
service stats {{
  unix_listener stats-reader {{
    mode = 0666
  }}
  unix_listener stats-writer {{
    mode = 0666
  }}
}}
"""


@dataclass
class MailServers:
    root: Path
    imap_port: int
    lmtp_port: int
    smtp_port: int = 0
    tls: Path | None = None  # the certificate both servers present (IMAPS, STARTTLS)
    imaps_port: int = 0
    password: str = field(default_factory=lambda: secrets.token_hex(8))
    passwords: dict[str, str] = field(default_factory=dict)
    refusals: list[int] = field(default_factory=list)  # codes for the bot's next mails
    refuses_from: str = ""  # whose mails ``refusals`` answer (logged in as)
    refused: int = 0  # mails answered with one of them (or over ``limit_sends``)
    limited: tuple[str, float, float] | None = None  # (login, per second, burst)
    _bucket: list[float] = field(default_factory=list)  # [tokens, when last filled]
    received: list[bytes] = field(default_factory=list)  # as delivered, stamped

    def add_user(self, local: str) -> tuple[str, str]:
        """A new mailbox, ``local`` and six hex digits at example.org, and its password
        (the same for every mailbox: Dovecot makes a mailbox at its first login, and
        the tests tell people apart by who logged in)."""
        address = f"{local}-{secrets.token_hex(3)}@{DOMAIN}"
        self.passwords[address] = self.password
        return address, self.password

    def refuse_next(self, count: int, login: str, code: int = 451) -> None:
        """The next ``count`` mails of ``login`` answered ``code``."""
        self.refuses_from = login
        self.refusals.extend([code] * count)

    def section(
        self, bot: str, allowed: Sequence[str], *, ports: tuple[int, int] | None = None,
        security: str = PLAIN, extra: str = "",
    ) -> str:  # fmt: skip
        """An ``[email]`` section for ``bot`` on these servers, ``allowed`` its senders
        (``ports``: IMAP and SMTP as the daemon reaches them, through a proxy)."""
        imap, smtp = ports or (self.imap_port, self.smtp_port)
        senders = ", ".join(f'"{address}"' for address in allowed)
        return (
            f'\n[email]\nenabled = true\naddress = "{bot}"\nimap_host = "127.0.0.1"\n'
            f'imap_port = {imap}\nsmtp_host = "127.0.0.1"\nsmtp_port = {smtp}\n{security}\n'
            f'auth_serv_id = "{AUTH_SERV_ID}"\nallowed_users = [{senders}]\n{extra}\n'
        )

    def limit_sends(self, login: str, per_second: float, burst: int) -> None:
        """``login``'s mails past ``per_second`` (after ``burst`` at once) answered 451,
        as a provider's sending limit does."""
        self.limited = (login, per_second, float(burst))
        self._bucket = [float(burst), time.monotonic()]

    def over_limit(self, login: object) -> bool:
        if self.limited is None or login != self.limited[0]:
            return False
        _, rate, burst = self.limited
        now = time.monotonic()
        tokens = min(burst, self._bucket[0] + (now - self._bucket[1]) * rate)
        self._bucket[:] = [tokens - 1 if tokens >= 1 else tokens, now]
        return tokens < 1

    def deliver(self, raw: bytes, to: str, envelope_from: str | None = None) -> None:
        """Straight into ``to``'s INBOX over LMTP (the receiving server bypassed);
        ``envelope_from=""``: a bounce's empty return path."""
        sender = parseaddr(_from(raw))[1] if envelope_from is None else envelope_from
        with smtplib.LMTP("127.0.0.1", self.lmtp_port) as lmtp:
            lmtp.sendmail(sender, [to], raw)

    def append(self, address: str, box: str, raw: bytes, arrived: float | None = None) -> None:
        """``raw`` put into ``address``'s mailbox ``box`` (IMAP APPEND), as having
        arrived at ``arrived`` (a time; None: now)."""
        with imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=20) as imap:
            imap.login(address, self.passwords[address])
            imap.append(box, "", arrived, raw)

    def send(self, mail: EmailMessage, *, login: str | None = None) -> None:
        """``mail`` submitted to the SMTP server, logged in as ``login`` when given."""
        with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=20) as smtp:
            if login is not None:
                smtp.login(login, self.passwords[login])
            smtp.send_message(mail)

    def inbox(self, address: str) -> list[EmailMessage]:
        with imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=20) as imap:
            imap.login(address, self.passwords[address])
            imap.select("INBOX", readonly=True)
            _, found = imap.uid("SEARCH", "ALL")
            mails = []
            for uid in found[0].split():
                _, data = imap.uid("FETCH", uid, "(BODY.PEEK[])")
                raw = next(part[1] for part in data if isinstance(part, tuple))
                mails.append(_parsed(raw))
            return mails

    def flags_of(self, address: str, message_id: str, box: str = "INBOX") -> str:
        """The flags of the mail ``message_id`` in ``address``'s ``box`` ("" when absent)."""
        with imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=20) as imap:
            imap.login(address, self.passwords[address])
            imap.select(box, readonly=True)
            _, found = imap.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"')
            uids = found[0].split()
            if not uids:
                return ""
            _, flags = imap.uid("FETCH", uids[0], "(FLAGS)")
            return " ".join(line.decode() for line in flags if isinstance(line, bytes))

    def log_tail(self) -> str:
        log = self.root / "dovecot.log"
        return "\n".join(log.read_text().splitlines()[-30:]) if log.exists() else ""


def _from(raw: bytes) -> str:
    return str(_parsed(raw).get("From", ""))


def _parsed(raw: bytes) -> EmailMessage:
    message = BytesParser(policy=policy.default).parsebytes(raw)
    assert isinstance(message, EmailMessage)
    return message


class _Receiving:
    """aiosmtpd's handler: the receiving server's stamp, then LMTP into Dovecot."""

    def __init__(self, servers: MailServers) -> None:
        self.servers = servers

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        login = getattr(session, "auth_data", None)
        refused = self.servers.refusals and login == self.servers.refuses_from
        if refused or self.servers.over_limit(login):
            code = self.servers.refusals.pop(0) if refused else 451
            self.servers.refused += 1
            return f"{code} 4.7.0 Too many mails, try again later"
        raw = bytes(envelope.original_content or envelope.content)
        sender = parseaddr(_from(raw))[1].lower()
        domain = sender.rpartition("@")[2]
        verdict = "pass" if isinstance(login, str) and login.lower() == sender else "fail"
        stamp = f"Authentication-Results: {AUTH_SERV_ID}; dmarc={verdict} header.from={domain}\r\n"
        stamped = stamp.encode() + raw
        with smtplib.LMTP("127.0.0.1", self.servers.lmtp_port) as lmtp:
            lmtp.sendmail(envelope.mail_from or "", envelope.rcpt_tos, stamped)
        self.servers.received.append(stamped)
        return "250 OK delivered"


def _authenticator(servers: MailServers) -> Any:
    from aiosmtpd.smtp import AuthResult, LoginPassword

    def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        user, password = data.login.decode(), data.password.decode()
        if servers.passwords.get(user) != password:
            return AuthResult(success=False, handled=False)
        session.auth_data = user
        return AuthResult(success=True, auth_data=user)

    return check


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], servers: MailServers) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _unavailable(f"dovecot exited ({proc.returncode}): {servers.log_tail()}")
        with contextlib.suppress(OSError), imaplib.IMAP4("127.0.0.1", port, timeout=2):
            return
        time.sleep(0.1)
    _unavailable(f"dovecot did not answer in {START_TIMEOUT:g} s: {servers.log_tail()}")


@contextlib.contextmanager
def start_mail_servers(*, tls: bool = False) -> Iterator[MailServers]:
    """Dovecot and the SMTP server; ``tls``: IMAP over TLS only (on ``imaps_port``),
    STARTTLS offered on SMTP, with a self-signed certificate (``tls``)."""
    if not DOVECOT.exists():
        _unavailable(f"{DOVECOT} is not installed")
    from aiosmtpd.controller import Controller

    root = Path(tempfile.mkdtemp(prefix="eb-mail-"))  # short: Dovecot's sockets live here
    root.chmod(0o755)
    mail_user = "dovecot" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    (root / "mail").mkdir()
    shutil.chown(root / "mail", mail_user, mail_user)
    servers = MailServers(root, free_port(), free_port())
    context = None
    if tls:
        servers.tls, servers.imaps_port = _certificate(root), free_port()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(servers.tls, root / "key.pem")
    conf = root / "dovecot.conf"
    conf.write_text(_dovecot_conf(root, servers.imap_port, servers.lmtp_port, servers.password,
                                  mail_user, servers.imaps_port))  # fmt: skip
    proc = subprocess.Popen([str(DOVECOT), "-F", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)  # fmt: skip
    controller = None
    try:
        _wait_for_port(servers.imap_port, proc, servers)
        controller = Controller(
            _Receiving(servers), hostname="127.0.0.1", port=free_port(),
            authenticator=_authenticator(servers), auth_require_tls=False,
            auth_exclude_mechanism=["CRAM-MD5"], data_size_limit=64 * 1000**2,
            tls_context=context,
        )  # fmt: skip
        controller.start()
        servers.smtp_port = controller.port
        yield servers
    finally:
        if controller is not None:
            controller.stop()
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def mail_servers() -> Iterator[MailServers]:
    """The test process's Dovecot and SMTP server (see the module's doc)."""
    with start_mail_servers() as servers:
        yield servers


@pytest.fixture(scope="session")
def tls_mail_servers() -> Iterator[MailServers]:
    """The same over TLS (``start_mail_servers(tls=True)``)."""
    with start_mail_servers(tls=True) as servers:
        yield servers
