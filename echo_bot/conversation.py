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

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "args": self.args}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ToolCall:
        return cls(id=raw["id"], name=raw["name"], args=dict(raw.get("args") or {}))


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    turn_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
