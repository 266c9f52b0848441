"""The e-mail channel: the wiring of the mailbox reader, the SMTP sender and the parts
that do the work. A refused login fails the start with its key's name; a server out of
reach is tried again while the daemon runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from channels.parts import Tasks, ThroughParts
from echo_bot.bus import Bus, Capabilities, ChannelHost
from echo_bot.link import STANDBY_CHECK

from .doctor import diagnose
from .inbound import Reader, log
from .mailbox import Mailbox, MailboxAway
from .media import Downloads
from .outbound import Outbound
from .settings import EmailConfig

LEASE = 15.0  # seconds: several daemons on one store, one reads the mailbox


class EmailChannel(ThroughParts):
    """Mail in by IMAP, out by SMTP; a thread is a conversation, approvals are replies
    holding a one-time code."""

    name = "email"
    capabilities = Capabilities(
        media=True, threads=True, rate_limited=True, diagnoses=True, connects=True
    )

    def __init__(self, section: EmailConfig, options: Mapping[str, Any], host: ChannelHost) -> None:
        self.config = section
        self.host = host
        # Set: the host made the channel only after its spec found no problem.
        password = host.environ.get(section.password_env, "")
        self.link = host.link("email")
        self.link.facts["address"] = str(section.address)
        self.edge = host.edge("email")
        self.outbound = Outbound(section, host, self.edge, password)
        self.downloads = Downloads(section, password)
        self.mailbox = Mailbox(section, password)
        self.reader = Reader(
            section, host, self.edge, self.link, self.mailbox,
            self.outbound.codes, self.outbound.threads,
        )  # fmt: skip
        self._tasks = Tasks()

    async def start(self, bus: Bus) -> None:
        if self.config.trust_from:
            log.warning(
                "email: trust_from is on: mail is taken as from whoever its From: names;"
                " anyone can write as %s",
                ", ".join(self.config.allowed_users) or "your senders",
            )

    async def connect(self) -> None:
        """The login and the mailbox checked (refused: ``ConfigError``; away:
        ``PeerAway``), then the mailbox read for as long as the channel runs."""
        await self.reader.resume()
        self._tasks.spawn(
            self.link.receive(
                self.reader.once, resume=self.reader.resume, turn=self._may_read,
                away=(MailboxAway,), peer=f"IMAP {self.config.imap_host}",
            )
        )  # fmt: skip
        log.info("email: reading %s as %s", self.config.mailbox, self.config.login)

    async def _may_read(self) -> bool:
        if not self.host.shared:
            return True
        hold = self.host.hold(f"email-reader:{self.config.login}", LEASE - STANDBY_CHECK)
        return await self.link.takes_turn(hold, "read", "reading now", "another daemon reads")

    async def stop(self) -> None:
        await self._tasks.cancel_all()
        await self.mailbox.close()

    diagnose = staticmethod(diagnose)
