"""send_file: send a workspace file to a chat, as a document or a photo.

A workspace file is the owner's data: it goes unasked only to an approver in their own
chat. Anyone else asks (``Effect.discloses``), except for the files they sent
themselves (their inbox folder); a file for any other chat asks whoever asks for it.
The file is copied when the call runs (opened without following symlinks, as file_read
does) into the state directory's ``outgoing/``: what is sent is what the call read,
even if the workspace changes before delivery. The delivery worker deletes the copy
once the message is delivered or has failed.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from ...events import MediaKind, OutboundFile, OutboundKind, OutboundMessage, new_id
from ...sizes import format_size
from ..base import Effect, ErrorCode, Risk, ToolContext, ToolGroup, ToolResult
from .files import read_workspace_file, workspace_file_effect
from .messaging import ChatSender, Outlet

# The smallest of the chat networks' limits (Telegram's for bots): 50 MB a document,
# 10 MB a photo, so that a file sent fits wherever it is sent.
MAX_DOCUMENT = 50 * 1000**2
MAX_PHOTO = 10 * 1000**2
PHOTO_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp"})
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SendFileTool(ChatSender):
    name: ClassVar[str] = "send_file"
    description: ClassVar[str] = (
        "Send a file from the workspace to a chat (the current one unless `to` names "
        "another, as channel:chat_id), as a document, or as a photo (`as_photo`, for "
        "images), with an optional caption."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 4096},
            "caption": {"type": "string", "maxLength": 1024},
            "as_photo": {"type": "boolean"},
            "to": {"type": "string", "minLength": 3, "maxLength": 200},
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("path", "to")
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "messaging"
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "origin_chat"
    timeout: ClassVar[float] = 30.0
    triggers: ClassVar[tuple[str, ...]] = ("send me the file", "send the file", "send file")

    def __init__(self, workspace: Path, outgoing: Path, outlet: Outlet | None = None) -> None:
        super().__init__(outlet)
        self.workspace = workspace
        self.outgoing = outgoing

    def effect(self, args: dict[str, Any], ctx: ToolContext) -> Effect:
        return workspace_file_effect(
            self.workspace, str(args.get("path", "")), ctx, sends_to=self.recipient(args, ctx)
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        target = self._target(args, ctx)
        if isinstance(target, ToolResult):
            return target
        sink = self._outlet.sink
        assert sink is not None  # _target says so
        raw = str(args["path"])
        name = PurePosixPath(raw).name
        photo = bool(args.get("as_photo", PurePosixPath(name).suffix.lower() in PHOTO_SUFFIXES))
        limit = MAX_PHOTO if photo else MAX_DOCUMENT
        read = await asyncio.to_thread(read_workspace_file, self.workspace, raw, limit + 1)
        if isinstance(read, ToolResult):
            return read
        data, _info = read
        if len(data) > limit:
            what = "a photo" if photo else "a document"
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                f"{raw} is over {format_size(limit)}, the most {target.channel} is sent as {what}",
            )
        copy = await asyncio.to_thread(self._keep, name, data)
        await sink(
            OutboundMessage(
                to=target,
                text=str(args.get("caption") or ""),
                kind=OutboundKind.NOTICE,
                file=OutboundFile(
                    path=str(copy),
                    name=name[:256] or "file",
                    kind=MediaKind.PHOTO if photo else MediaKind.DOCUMENT,
                    size=len(data),
                ),
                trace_id=ctx.trace_id,
                metadata={"sent_by_tool": ctx.idempotency_key},
            )
        )
        what = "photo" if photo else "document"
        return ToolResult.success(
            f"Sent {raw} ({format_size(len(data))}) to {target} as a {what}.",
            to=str(target),
            path=raw,
            bytes=len(data),
        )

    def _keep(self, name: str, data: bytes) -> Path:
        """A copy under a name no other call can have, written whole before it counts."""
        self.outgoing.mkdir(mode=0o700, parents=True, exist_ok=True)
        safe = _SAFE.sub("_", name).strip("._")[:80] or "file"
        path = self.outgoing / f"{new_id()}-{safe}"
        partial = path.with_name(f".{path.name}.part")
        with partial.open("xb") as handle:
            handle.write(data)
        partial.replace(path)
        return path
