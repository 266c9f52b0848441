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
class FileNote:
    """A file a user's message carried, as its turn made it ready (``media/inbound.py``):
    saved in the workspace at ``path``, or not downloaded (``path`` None)."""

    what: str  # "photo", "voice note", "document", …
    path: str | None  # as the workspace's tools name it; None: not downloaded
    # Saved: its facts ("image/jpeg, 10.2 KB", perhaps "; transcribed above");
    # not downloaded: why.
    detail: str

    @property
    def line(self) -> str:
        """The note as the model reads it, one line of the user's message."""
        if self.path is None:
            return f"[{self.what} not downloaded: {self.detail}]"
        return f"[{self.what} saved: {self.path}, {self.detail}]"

    @property
    def reply(self) -> str:
        """What an offline brain says about it: where it is, or why it is not."""
        if self.path is None:
            return f"I could not download your {self.what}: {self.detail}."
        return f"Your {self.what} is saved in the workspace as {self.path} ({self.detail})."

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "path": self.path, "detail": self.detail}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FileNote:
        return cls(what=raw["what"], path=raw.get("path"), detail=raw.get("detail") or "")


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    # A user's message: their words (a voice note's transcript first); its files are
    # ``files``, not lines of it. A history row stored before ``files`` existed has the
    # notes as lines of its content and no files: ``text`` is the same either way.
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    turn_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    files: tuple[FileNote, ...] = ()

    @property
    def text(self) -> str | None:
        """The content as the model reads it: the words, then a line per file."""
        if not self.files:
            return self.content
        return "\n".join(part for part in [self.content, *(f.line for f in self.files)] if part)


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
    # The channel said the chat is the sender's alone with the bot (``Inbound.direct``).
    direct: bool = False
    # The chat's memory notes (``echo_bot/memory_notes.py``), for a brain that reads
    # them: data someone saved, never instructions.
    notes: tuple[str, ...] = ()
    # The model the chat chose with /model (None: the configured one), for a brain that
    # reads it.
    model: str | None = None
    # The running summary of the conversation's oldest part, carried instead of it.
    summary: str | None = None


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
    # False: the text is kept in the conversation only, not sent (the attachments say
    # it to the chat, e.g. the console's sign-in link, kept out of the history).
    shown: bool = True
