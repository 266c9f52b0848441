"""Who is asked: read → never, write → ask, dangerous → always, with config overrides."""

from __future__ import annotations

from typing import Any

from ..config import ApprovalsConfig
from ..errors import ConfigError
from ..tools.base import Risk, Tool, ToolContext
from ..tools.registry import ToolRegistry


class ApprovalPolicy:
    def __init__(self, config: ApprovalsConfig, registry: ToolRegistry, source: str) -> None:
        registry.check_names(config.require, "approvals.require", source)
        registry.check_names(config.never, "approvals.never", source)
        dangerous = [
            name
            for name in config.never
            if (tool := registry.get(name)) and tool.risk == Risk.DANGEROUS
        ]
        if dangerous:
            raise ConfigError(
                f"{source}: approvals.never: {', '.join(dangerous)} is dangerous and always "
                "asks; it cannot be listed in 'never'"
            )
        self._require = frozenset(config.require)
        self._never = frozenset(config.never)

    def needs_approval(
        self, tool: Tool, args: dict[str, Any], ctx: ToolContext, *, granted: bool
    ) -> tuple[bool, str]:
        """Whether this call waits for consent, and why (for the audit and the prompt)."""
        risk = tool.risk_for(args)
        override = tool.approval_override(args, ctx)
        if override is not None:
            return override, "tool rule" + (" (allowlisted)" if not override else "")
        if risk == Risk.DANGEROUS:
            return True, "dangerous tool"
        if tool.name in self._require:
            return True, "listed in approvals.require"
        if risk == Risk.READ:
            return False, "read-only"
        if tool.name in self._never:
            return False, "listed in approvals.never"
        if tool.default_approval == "origin_chat":
            return False, "effect stays in the requester's chat"
        if granted:
            return False, "allowed for a time in this session"
        return True, "write risk"
