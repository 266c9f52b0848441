"""Who is asked: read → never, write → ask, dangerous → always, with config overrides.

The owner's config wins over a tool's own rule. First match wins:

1. the tool is in ``[approvals] require`` → ask;
2. this call's own risk (``tool.risk_for(args)``) is dangerous → ask, unless the tool's
   own rule (``approval_override``, e.g. the shell allowlist) exempts this exact call;
   ``never`` and grants never exempt a dangerous call;
3. the tool is in ``[approvals] never`` → no asking (a tool declared dangerous may not
   be listed there: a config error);
4. a live "allow for a time" grant → no asking (write-risk calls only);
5. the tool's own rule, if it gives an answer;
6. read → no asking; ``default_approval = "origin_chat"`` → no asking; otherwise ask.
"""

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
        if tool.name in self._require:
            return True, "listed in approvals.require"
        risk = tool.risk_for(args)
        override = tool.approval_override(args, ctx)
        if risk == Risk.DANGEROUS:
            if override is False:
                return False, "tool rule (allowlisted)"
            return True, "dangerous call"
        if tool.name in self._never:
            return False, "listed in approvals.never"
        if granted and risk == Risk.WRITE:
            return False, "allowed for a time in this chat"
        if override is not None:
            return override, "tool rule" + ("" if override else " (allowlisted)")
        if risk == Risk.READ:
            return False, "read-only"
        if tool.default_approval == "origin_chat":
            return False, "effect stays in the requester's chat"
        return True, "write risk"
