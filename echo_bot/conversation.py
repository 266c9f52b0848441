"""Conversation history as the brains see it, and what a brain (or a command) is asked
with and answers. A leaf module: stdlib and the other leaves only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from .events import Address, OutboundMessage, Sender

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]
    # Set when the model's arguments could not be read: the call is answered with
    # INVALID_PARAMETER (this text) so the model can correct itself.
    error: str | None = None
    raw_arguments: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "name": self.name, "args": self.args}
        if self.error is not None:
            data["error"] = self.error
            data["raw_arguments"] = self.raw_arguments
        return data

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ToolCall:
        return cls(
            id=raw["id"],
            name=raw["name"],
            args=dict(raw.get("args") or {}),
            error=raw.get("error"),
            raw_arguments=raw.get("raw_arguments"),
        )


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    turn_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


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
    """The next move of a turn, from a brain or a command: a text, or tool calls."""

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    route_reason: str = ""
    # Facts for the audit log (model name, token usage, latency…).
    details: dict[str, object] = field(default_factory=dict)
    # Messages sent right after the final reply (e.g. approval prompts shown again).
    attachments: list[OutboundMessage] = field(default_factory=list)
    # The text is Markdown (a model's answer): chat channels may show it formatted.
    markdown: bool = False
