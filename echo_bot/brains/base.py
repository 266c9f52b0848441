"""The Brain protocol: ``step(conversation, tools, context) -> BrainReply``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..conversation import ChatMessage, ToolCall
from ..events import Address, OutboundMessage, Sender
from ..tools.base import Tool


class Preview(Protocol):
    """A reply shown while it is written. Only a preview: the final reply is the record."""

    def update(self, text: str) -> None:
        """The whole text so far (cheap: shown when the channel's pace allows)."""
        ...

    async def stopped(self) -> None:
        """Returns when the person asked to stop the reply being written."""
        ...


@dataclass(frozen=True, slots=True)
class BrainContext:
    trace_id: str
    session_key: str
    origin: Address
    sender: Sender
    step: int
    # Photos of this turn's message, saved in the workspace (absolute paths): a model
    # that sees is shown them with the message.
    images: tuple[Path, ...] = ()
    # Where a brain that streams shows its reply as it is written (None: nowhere).
    preview: Preview | None = None


@dataclass(frozen=True, slots=True)
class BrainReply:
    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    route_reason: str = ""
    # Facts for the audit log (model name, token usage, latency…).
    details: dict[str, object] = field(default_factory=dict)
    # Messages sent right after the final reply (e.g. approval prompts shown again).
    attachments: list[OutboundMessage] = field(default_factory=list)
    # The text is Markdown (a model's answer): chat channels may show it formatted.
    markdown: bool = False


class Brain(Protocol):
    name: str

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply: ...
