"""What a tool is: a declaration (name, schema, risk, triggers) plus ``run``.

A tool never raises into the loop: the registry turns every failure into a ToolResult
with an error code the model (or the user) can act on.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

from ..events import Address, Sender


class Risk(StrEnum):
    READ = "read"
    WRITE = "write"
    DANGEROUS = "dangerous"


class ErrorCode(StrEnum):
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    INVALID_PARAMETER = "INVALID_PARAMETER"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    APPROVAL_UNAVAILABLE = "APPROVAL_UNAVAILABLE"
    TIMEOUT = "TIMEOUT"
    UPSTREAM_ERROR = "UPSTREAM_ERROR"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    TOOL_ERROR = "TOOL_ERROR"
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"  # its server is down or has not listed it
    NOT_FOUND = "NOT_FOUND"


@dataclass(slots=True)
class ToolResult:
    ok: bool
    output: str
    data: dict[str, Any] = field(default_factory=dict)
    error_code: ErrorCode | None = None
    latency_ms: float = 0.0

    @classmethod
    def success(cls, output: str, **data: Any) -> ToolResult:
        return cls(ok=True, output=output, data=data)

    @classmethod
    def failure(cls, code: ErrorCode, message: str, **data: Any) -> ToolResult:
        return cls(ok=False, output=message, data=data, error_code=code)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "output": self.output,
            "data": self.data,
            "error_code": self.error_code.value if self.error_code else None,
            "latency_ms": round(self.latency_ms, 3),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ToolResult:
        code = raw.get("error_code")
        return cls(
            ok=bool(raw["ok"]),
            output=str(raw.get("output", "")),
            data=dict(raw.get("data") or {}),
            error_code=ErrorCode(code) if code else None,
            latency_ms=float(raw.get("latency_ms") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class ToolContext:
    trace_id: str
    session_key: str
    origin: Address
    user: Sender
    attempt: int = 1
    idempotency_key: str = ""
    approval_id: str | None = None
    # Where results go (a webhook's or cron job's deliver_to); None: the origin.
    answer_to: Address | None = None
    # Whether the requester is an approver of the origin chat (the owner at the
    # terminal always is), and whether that chat is theirs alone with the bot (a
    # private chat, the terminal; not a group): the gate trusts an approver's own
    # direct chat with the owner's data.
    approver: bool = False
    direct: bool = False
    # The turn the call is part of (its inbound's id; "" outside a turn).
    turn_id: str = ""


@dataclass(frozen=True, slots=True)
class Effect:
    """What a call does that the gate judges by (docs/SECURITY.md: rules are about effects,
    not tool names). A tool states it; the policy decides from it, so a new tool that
    sends or discloses is asked for the way the built-ins are, without a rule of its own.

    ``sends_to``: the chat a sending tool delivers to (None: it sends to no chat; its
    result goes back to the requester's answer like any tool's).
    ``discloses``: the owner's data the call hands out, said for people ("the workspace
    file notes.txt"), or "" when it hands out none. A call that discloses hands it to
    whoever receives its effect: the chat it sends to, else the requester."""

    sends_to: Address | None = None
    discloses: str = ""


# Which profile a tool belongs to (see ``registry.PROFILES``).
ToolGroup = Literal["basic", "messaging", "coding", "extra", "mcp"]


class Tool(ABC):
    """Subclass, fill the class attributes and implement ``run``."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "basic"
    # "policy": ask as the risk says; "origin_chat": no asking while the effect stays in
    # the requester's own chat (reminders, send_message to the origin chat).
    default_approval: ClassVar[Literal["policy", "origin_chat"]] = "policy"
    # The arguments that decide what a call does (where it writes, whom it reaches,
    # what it runs): an approval prompt shows them first, before any long content.
    key_args: ClassVar[tuple[str, ...]] = ()
    # The arguments that become a command line (a list of its elements, or a string split
    # like a shell would): a webhook value may never begin one of their elements with
    # ``-`` (an option) unless the route's template puts ``--`` before it.
    argv_args: ClassVar[tuple[str, ...]] = ()
    timeout: ClassVar[float] = 30.0
    idempotent: ClassVar[bool] = False
    retries: ClassVar[int] = 0
    triggers: ClassVar[tuple[str, ...]] = ()
    negative_triggers: ClassVar[tuple[str, ...]] = ()

    def available(self) -> bool:
        """False while the tool is switched off in config (it is then never exposed)."""
        return True

    def risk_for(self, args: dict[str, Any]) -> Risk:
        """The risk of this particular call (e.g. GET is read, POST is write)."""
        return self.risk

    def approval_override(self, args: dict[str, Any], ctx: ToolContext) -> bool | None:
        """True/False to force asking or not for this call; None defers to the policy."""
        return None

    def effect(self, args: dict[str, Any], ctx: ToolContext) -> Effect:
        """What this call does that the gate judges (see ``Effect``); by default: it
        sends to no chat and discloses nothing of the owner's."""
        return Effect()

    def grant_scope(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """What an "allow for a time" grant made on this call covers beside the tool:
        by default the values of its deciding arguments (``key_args``) exactly, so a
        grant covers a later call only when what the prompt showed first is the same;
        a tool that declares none (an MCP server's, whose arguments nobody rated) is
        covered for exactly the same arguments only. Tools whose deciding argument has
        a natural wider unit say so (the host of a request, the directory of a write)."""
        if not self.key_args:
            return json.dumps(args, sort_keys=True, separators=(",", ":"))
        return json.dumps([args.get(key) for key in self.key_args], separators=(",", ":"))

    def extract_args(self, text: str) -> dict[str, Any] | None:
        """Arguments for the offline rules brain, taken from the user's words.

        ``None`` means the text does not give what the tool needs.
        """
        return {} if not self.parameters.get("required") else None

    def describe(self) -> str:
        """Description with when-to-use and when-not-to-use, for a model."""
        text = self.description
        if self.triggers:
            text += " Use for requests like: " + "; ".join(self.triggers[:5]) + "."
        if self.negative_triggers:
            text += " Not for: " + "; ".join(self.negative_triggers[:5]) + "."
        return text

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.describe(), "parameters": self.parameters}

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def within(root: Path, candidate: Path) -> bool:
    """True when ``candidate`` (already resolved) lies inside ``root`` (resolved)."""
    return candidate == root or root in candidate.parents


_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())
