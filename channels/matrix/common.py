"""What the parts of the Matrix channel share: the log, health, background tasks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from aiohttp import ClientError

from channels.parts import Health as ChannelHealth
from channels.parts import Tasks
from echo_bot.errors import CommitFailed, EchoBotError

log = logging.getLogger("channels.matrix")


class Unreachable(EchoBotError):
    """The homeserver did not answer, or answered with a failure of its own (a 5xx, a
    rate limit): tried again later, never a reason to stop."""


# What a request to a homeserver that cannot be reached raises (nio retries a few times
# first, then lets aiohttp's error through).
NETWORK_ERRORS = (ClientError, OSError, TimeoutError, Unreachable)


def transient(answer: Any) -> bool:
    """Whether nio's error answer is the server's passing failure (a 5xx from it or a
    proxy in front of it, a rate limit), not a refusal."""
    status = getattr(getattr(answer, "transport_response", None), "status", 0) or 0
    limited = getattr(answer, "status_code", "") == "M_LIMIT_EXCEEDED"
    return status >= 500 or status == 429 or limited


@dataclass
class Health(ChannelHealth):
    channel: ClassVar[str] = "matrix"
    rate_limited: int = 0  # M_LIMIT_EXCEEDED answers seen (each waited out)
    standby: bool | None = None  # another daemon syncs this account now (None: not asked)


__all__ = ["NETWORK_ERRORS", "CommitFailed", "Health", "Tasks", "Unreachable", "log", "transient"]
