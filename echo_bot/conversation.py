"""Conversation history as the brains see it. A leaf module (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
