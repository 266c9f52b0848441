"""memory_save, memory_forget: short facts the model keeps for this chat
(``echo_bot/memory_notes.py``), shown to it in every later turn here and in no other
chat. Their effect stays in the requester's chat, so they ask no approval there."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from ...memory_notes import NOTE_CHARS, NOTES_MAX, MemoryFull, MemoryNotes
from ..base import ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult

# "remember that I take my coffee black", "please remember: the wifi is …"
_REMEMBER = re.compile(r"\b(?:remember|note)(?:\s+that)?\s*:?\s+(?P<text>\S.*)$", re.I | re.S)
# What comes just before "remember" and says not to: "don't", "do not", "never", "no
# need to", "you needn't".
_NEGATED = re.compile(
    r"\b(?:don'?t|do\s+not|never|no\s+need\s+to|needn'?t|shouldn'?t|not)\s+(?:\w+\s+){0,2}$", re.I
)


class MemorySaveTool(Tool):
    name: ClassVar[str] = "memory_save"
    description: ClassVar[str] = (
        "Keep a short fact about this chat for later turns: a preference, a name, something"
        " the user asked you to remember. You are shown this chat's notes in every turn;"
        f" keep each to one fact ({NOTE_CHARS} characters at most; {NOTES_MAX} notes per"
        " chat: forget one that is stale with memory_forget)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": NOTE_CHARS}},
        "required": ["text"],
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "basic"
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "origin_chat"
    idempotent: ClassVar[bool] = True  # the same text again is the note it is
    timeout: ClassVar[float] = 15.0
    triggers: ClassVar[tuple[str, ...]] = ("remember that", "please remember", "note that")
    negative_triggers: ClassVar[tuple[str, ...]] = (
        "do you remember", "what do you remember", "remember when",
    )  # fmt: skip

    def __init__(self, notes: MemoryNotes) -> None:
        self.notes = notes

    def extract_args(self, text: str) -> dict[str, Any] | None:
        match = _REMEMBER.search(text.strip())
        if match is None or _NEGATED.search(text.strip()[: match.start()]):
            return None  # "please don't remember that my PIN is 4921": not a note
        return {"text": match.group("text").strip()[:NOTE_CHARS]}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            note = await self.notes.save(ctx.session_key, args["text"], ctx.user.id, ctx.trace_id)
        except MemoryFull as exc:
            return ToolResult.failure(ErrorCode.PERMISSION_DENIED, str(exc))
        except ValueError as exc:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, str(exc))
        return ToolResult.success(f"Noted ({note.id}): {note.text}", id=note.id)


class MemoryForgetTool(Tool):
    name: ClassVar[str] = "memory_forget"
    description: ClassVar[str] = "Forget one of this chat's memory notes by its id."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"id": {"type": "string", "minLength": 1, "maxLength": 32}},
        "required": ["id"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("id",)
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "basic"
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "origin_chat"
    idempotent: ClassVar[bool] = True
    timeout: ClassVar[float] = 15.0

    def __init__(self, notes: MemoryNotes) -> None:
        self.notes = notes

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        note = await self.notes.forget(args["id"], ctx.session_key, by=ctx.user.id)
        if note is None:
            return ToolResult.failure(ErrorCode.NOT_FOUND, f"this chat has no note {args['id']!r}")
        return ToolResult.success(f"Forgotten ({note.id}): {note.text}")
