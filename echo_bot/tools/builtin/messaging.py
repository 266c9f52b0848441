"""send_message: post a message to a chat through the outbox.

Its effect stays in the requester's own chat by default, so it does not ask there; a
message to any other chat asks for approval.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

from ...events import Address, OutboundKind, OutboundMessage
from ..base import Effect, ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult

OutboundSink = Callable[[OutboundMessage], Awaitable[None]]

_SAYING = re.compile(r"(?:saying|that says|:)\s*(.+)$", re.IGNORECASE | re.DOTALL)


class Outlet:
    """Where the sending tools send: the bus's outbox, and the channels running in this
    run. Made with the tools, not connected ("messaging is not connected"); the daemon
    connects it once its channels have started, so no tool is looked for among the
    registry's to be wired."""

    def __init__(self) -> None:
        self.sink: OutboundSink | None = None
        self.channels: frozenset[str] = frozenset()

    def connect(self, sink: OutboundSink, channels: frozenset[str]) -> None:
        self.sink = sink
        self.channels = channels


class ChatSender(Tool):
    """A tool that sends to a chat through the bus: the requester's own unless ``to``
    names another. Its effect says where it sends (the gate asks for any other chat
    than the requester's); it sends through the ``Outlet`` it was made with."""

    def __init__(self, outlet: Outlet | None = None) -> None:
        self._outlet = outlet if outlet is not None else Outlet()

    def recipient(self, args: dict[str, Any], ctx: ToolContext) -> Address | None:
        """The chat this call sends to (None: ``to`` is not an address; it sends
        nothing)."""
        try:
            return Address.parse(args["to"]) if args.get("to") else ctx.origin
        except ValueError:
            return None

    def effect(self, args: dict[str, Any], ctx: ToolContext) -> Effect:
        return Effect(sends_to=self.recipient(args, ctx))

    def grant_scope(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """A grant covers sending to one chat: the recipient the prompt showed first."""
        return str(self.recipient(args, ctx) or args.get("to"))

    def _target(self, args: dict[str, Any], ctx: ToolContext) -> Address | ToolResult:
        """Where to send (a running channel's chat), or why not."""
        if self._outlet.sink is None:
            return ToolResult.failure(ErrorCode.UPSTREAM_ERROR, "messaging is not connected")
        try:
            target = Address.parse(args["to"]) if args.get("to") else ctx.origin
        except ValueError as exc:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, str(exc))
        if target.channel not in self._outlet.channels:
            known = ", ".join(sorted(self._outlet.channels)) or "none"
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                f"no channel named {target.channel!r} is running (running: {known})",
            )
        return target


class SendMessageTool(ChatSender):
    name: ClassVar[str] = "send_message"
    description: ClassVar[str] = (
        "Send a text message to a chat (the current one unless `to` names another, "
        "as channel:chat_id)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 16000},
            "to": {"type": "string", "minLength": 3, "maxLength": 200},
        },
        "required": ["text"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("to",)
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "messaging"
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "origin_chat"
    timeout: ClassVar[float] = 10.0
    triggers: ClassVar[tuple[str, ...]] = ("send a message", "send message", "post a message")
    negative_triggers: ClassVar[tuple[str, ...]] = ("remind me",)

    def extract_args(self, text: str) -> dict[str, Any] | None:
        match = _SAYING.search(text)
        return {"text": match.group(1).strip()} if match and match.group(1).strip() else None

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        target = self._target(args, ctx)
        if isinstance(target, ToolResult):
            return target
        sink = self._outlet.sink
        assert sink is not None  # _target says so
        await sink(
            OutboundMessage(
                to=target,
                text=args["text"],
                kind=OutboundKind.NOTICE,
                trace_id=ctx.trace_id,
                metadata={"sent_by_tool": ctx.idempotency_key},
            )
        )
        return ToolResult.success(f"Sent to {target}.", to=str(target))
