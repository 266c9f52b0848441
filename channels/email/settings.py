"""``[email]``: the channel's config section and what its environment must hold.
Pure pydantic: imported to read a config file, without the mail libraries."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from echo_bot.config import is_loopback
from echo_bot.sections import (
    ByteSize,
    ChatSection,
    Duration,
    EnvName,
    FilesSection,
    ca_file_problem,
    http_url,
    shaped,
)


def _lower(value: str) -> str:
    return value.lower()


# An address as the allowlist writes it: one mailbox, no display name, no angle brackets.
EmailAddress = Annotated[
    str,
    AfterValidator(shaped(r"[^@\s<>\"(),;:]{1,64}@[A-Za-z0-9.-]{1,253}", "an e-mail address")),
    AfterValidator(_lower),
]
Host = Annotated[str, Field(pattern=r"^[A-Za-z0-9.:-]{1,253}$")]
Port = Annotated[int, Field(ge=1, le=65535)]

IMAP_PORTS = {"tls": 993, "plain": 143}
SMTP_PORTS = {"tls": 465, "starttls": 587, "plain": 25}


class EmailConfig(ChatSection[EmailAddress], FilesSection):
    address: EmailAddress | None = None  # the bot's own mailbox
    username: str | None = Field(None, min_length=1, max_length=256)  # unset: `address`
    password_env: EnvName = "ECHO_BOT_EMAIL_PASSWORD"
    # Mail in: IMAP over TLS (993); "plain" only to a server on this machine.
    imap_host: Host | None = None
    imap_port: Port | None = None
    imap_security: Literal["tls", "plain"] = "tls"
    mailbox: str = Field("INBOX", min_length=1, max_length=200, pattern=r"^[^\r\n\"\\]+$")
    # Where the server has no IDLE, how often the mailbox is looked at.
    poll_every: Duration = Field(timedelta(seconds=60), ge=timedelta(seconds=5))
    # Mail out: SMTP with STARTTLS (587), or TLS from the start (465); "plain" only to
    # a server on this machine.
    smtp_host: Host | None = None
    smtp_port: Port | None = None
    smtp_security: Literal["starttls", "tls", "plain"] = "starttls"
    # Mails sent per minute at most (a provider's limit: Gmail's is about 20).
    max_per_minute: int = Field(20, ge=1, le=600)
    ca_file: str | None = None  # a CA to trust besides the system's (a server's own)
    # Who sent a mail is what the receiving server checked, never `From:` alone: the
    # topmost `auth_header` must be this server's (`auth_serv_id`) and say DMARC or DKIM
    # passed for the From: address's domain. `trust_from = true` accepts From: as it
    # is, for a server that adds no such header: anyone can then write as your allowed
    # senders (said loudly at every start).
    auth_header: str = Field("Authentication-Results", pattern=r"^[A-Za-z0-9-]{1,76}$")
    auth_serv_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,253}$")
    trust_from: StrictBool = False
    # Your console's address (its [console] public_url): approval prompts link to it.
    console_url: Annotated[str, AfterValidator(http_url)] | None = None
    # A mail larger than this (as the server counts it, attachments included) is not
    # read; its sender is told.
    max_message: ByteSize = 25 * 1000**2

    @model_validator(mode="after")
    def _complete(self) -> EmailConfig:
        if not self.enabled:
            return self
        for key in ("address", "imap_host", "smtp_host"):
            if not getattr(self, key):
                raise ValueError(f"{key} is needed when [email] is enabled")
        if not self.trust_from and not self.auth_serv_id:
            raise ValueError(
                "auth_serv_id is needed: the name your mail server writes first in the"
                f" {self.auth_header} header it adds (or trust_from = true, which lets"
                " anyone write as your allowed senders)"
            )
        for kind in ("imap", "smtp"):
            host = getattr(self, f"{kind}_host")
            if getattr(self, f"{kind}_security") == "plain" and not is_loopback(host):
                raise ValueError(
                    f"{kind}_security = 'plain' is for a server on this machine only"
                    f" ({host} is not a loopback address): use TLS"
                )
        return self

    @property
    def login(self) -> str:
        return self.username or str(self.address)

    @property
    def imap_at(self) -> int:
        return self.imap_port or IMAP_PORTS[self.imap_security]

    @property
    def smtp_at(self) -> int:
        return self.smtp_port or SMTP_PORTS[self.smtp_security]


def secrets_in_use(section: EmailConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    return [(section.password_env, True)]


def environment_problems(
    section: EmailConfig, environ: Mapping[str, str], state_dir: Path | None
) -> list[str]:
    problems = [ca_file_problem(section.ca_file)]
    if not environ.get(section.password_env):
        problems.append(
            f"password_env: environment variable {section.password_env} is not set (the"
            f" password of {section.login} on the IMAP and SMTP servers)"
        )
    return [p for p in problems if p]


def summary(section: EmailConfig) -> str:
    senders = (
        "From: trusted as written (trust_from: anyone can write as your senders)"
        if section.trust_from
        else f"senders checked by {section.auth_header} from {section.auth_serv_id}"
    )
    return (
        f"on as {section.address}: IMAP {section.imap_host}:{section.imap_at}"
        f" ({section.imap_security}), SMTP {section.smtp_host}:{section.smtp_at}"
        f" ({section.smtp_security}); {senders}"
    )
