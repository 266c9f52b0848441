"""The Brain protocol: ``step(conversation, tools, context) -> BrainReply``.

``BrainContext`` and ``BrainReply`` live in the ``conversation`` leaf (commands answer
with them too); they are named here as well, beside the protocol that uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..conversation import BrainContext, BrainReply, ChatMessage, Preview
from ..errors import EchoBotError
from ..tools.base import Tool

__all__ = ["Brain", "BrainContext", "BrainReply", "LLMUnavailable", "Preview"]


class LLMUnavailable(EchoBotError):
    """The endpoint could not give a usable answer this time. ``server_away``: false
    when this request, not the server, was at fault (a 400 for a prompt too large, an
    empty answer): the offline brain answers it, and other chats keep the model."""

    def __init__(self, message: str, *, server_away: bool = True) -> None:
        super().__init__(message)
        self.server_away = server_away


class Brain(Protocol):
    name: str

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply: ...
