"""What the parts of the Matrix channel share: the log, background tasks, and what a
homeserver that cannot be reached raises."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import ClientError

from channels.parts import Tasks
from echo_bot.errors import CommitFailed, PeerAway

log = logging.getLogger("channels.matrix")

# What a request to a homeserver that cannot be reached raises (nio retries a few times
# first, then lets aiohttp's error through; a failure on the server's side, a 5xx or a
# rate limit, is PeerAway): tried again later, never a reason to stop.
NETWORK_ERRORS = (ClientError, OSError, TimeoutError, PeerAway)


def transient(answer: Any) -> bool:
    """Whether nio's error answer is the server's passing failure (a 5xx from it or a
    proxy in front of it, a rate limit), not a refusal."""
    status = getattr(getattr(answer, "transport_response", None), "status", 0) or 0
    limited = getattr(answer, "status_code", "") == "M_LIMIT_EXCEEDED"
    return status >= 500 or status == 429 or limited


__all__ = ["NETWORK_ERRORS", "CommitFailed", "PeerAway", "Tasks", "log", "transient"]
