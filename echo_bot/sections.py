"""The building blocks of config sections, for the core's and every channel's: the base
that rejects unknown keys, the value types (``Duration``, ``ByteSize``, ``EnvName``, an
``http_url``, an id ``shaped`` by a pattern), and what every chat network's section
holds, written once (``ChatSection``, ``FilesSection``): whether it is on, who may chat,
who approves (unset: those who may chat); for a network whose people send files, whether
those are fetched and how large. A channel's section subclasses
``ChatSection[ItsUserId]`` (and ``FilesSection``) and adds only its own keys; its spec
then needs no ``enabled``, ``allowed_users``, ``approvers`` nor ``live_keys``
(``echo_bot.plugins.ChannelSpec`` reads them from here).

Pure pydantic: imported to read a config file, without any network library.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Generic, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
)

from .durations import format_duration, parse_duration
from .sizes import format_size, parse_size

Duration = Annotated[
    timedelta, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)
]

ByteSize = Annotated[
    int, BeforeValidator(parse_size), PlainSerializer(format_size, return_type=str)
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        # Never echo the value: a secret pasted here by mistake would reach the logs.
        raise ValueError(
            "not an environment variable name: give the name of the variable that holds "
            "the secret (like TELEGRAM_BOT_TOKEN), never the secret itself"
        )
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def http_url(value: str) -> str:
    """An http:// or https:// URL with a host, without its trailing slash (a peer's
    base address: a homeserver, an API)."""
    parts = urlsplit(value)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL with a host")
    return value.rstrip("/")


def without_login(url: str) -> str:
    """``url`` as it may be shown: without the user and password it may carry."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host).geturl()


def ca_file_problem(ca_file: str | None) -> str | None:
    """What is wrong with a ``ca_file`` key (a CA to trust besides the system's): not a
    file, or no certificate in it that loads; None when it loads. Said by check-config
    and doctor, and before a start: not a TLS error at each connection."""
    if not ca_file:
        return None
    path = Path(ca_file).expanduser()
    if not path.is_file():
        return f"ca_file: {ca_file} is not a file"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(path)
    except (ssl.SSLError, OSError, ValueError) as exc:
        return f"ca_file: {ca_file} holds no PEM certificate that loads ({exc})"
    return None


UserId = TypeVar("UserId")

# What a reload (SIGHUP) takes live of a chat section: who may chat and approve.
LIVE_KEYS = frozenset({"allowed_users", "approvers"})


class ChatSection(Section, Generic[UserId]):
    enabled: StrictBool = False
    allowed_users: list[UserId] = Field(default_factory=list)
    approvers: list[UserId] | None = None  # unset: the allowed users

    @property
    def approver_ids(self) -> list[UserId]:
        return self.allowed_users if self.approvers is None else self.approvers


class FilesSection(Section):
    # Files people send: fetched during the turn and saved in the workspace (off:
    # described by name only, nothing downloaded).
    media: StrictBool = True
    max_download: ByteSize = 20 * 1000**2


def shaped(pattern: str, what: str) -> Callable[[str], str]:
    """A validator (for ``AfterValidator``) of an id that must match ``pattern`` whole;
    its error names ``what`` it should be ("a Matrix user ID (@name:server)")."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return check
