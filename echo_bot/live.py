"""What SIGHUP may change while the daemon runs, and how a part takes a new config.

The approval policy, the approvers and the approval timeout are read together when a
call is decided, so they live in one immutable ``LiveSettings`` that a reload replaces in
one assignment: no call is ever decided with the policy of one file and the approvers of
another. Parts that keep other live state (routes, allowlists, cron jobs, the shell's
allowlist) implement ``Reloadable``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .config import Config, LoadedConfig, ToolsConfig, channel_section
from .plugins import registry

if TYPE_CHECKING:
    from .approvals import ApprovalPolicy, ApproverDirectory
    from .tools.base import Tool
    from .tools.registry import ToolRegistry


@dataclass(frozen=True, slots=True)
class LiveSettings:
    loaded: LoadedConfig  # the config file these settings were made from
    policy: ApprovalPolicy
    directory: ApproverDirectory
    approval_timeout: timedelta


class Live:
    """Holds the current ``LiveSettings``; a reload assigns ``current`` a new one."""

    __slots__ = ("current",)

    def __init__(self, current: LiveSettings) -> None:
        self.current = current


class Exposed:
    """What the brain sees: the registry's tools that the ``[tools]`` profile, allow and
    deny let in. An MCP server's tools come and go while the daemon runs; ``refresh``
    (the hub's ``on_change``) makes the list follow them."""

    __slots__ = ("_registry", "_section", "tools")

    def __init__(self, registry: ToolRegistry, section: ToolsConfig) -> None:
        self._registry = registry
        self._section = section  # what it reads needs a restart to change
        self.tools: list[Tool] = []
        self.refresh()

    def refresh(self) -> None:
        section = self._section
        self.tools = self._registry.exposed(section.profile, section.allow, section.deny)

    def __call__(self) -> list[Tool]:
        return self.tools


@runtime_checkable
class Reloadable(Protocol):
    def reload(self, config: Config) -> list[str]:
        """Take what ``config`` changes live; return the changes that need a restart
        (empty: all applied). Raise ``ConfigError`` to keep the running settings."""
        ...


# What a reload applies while running; any other change needs a restart.
LIVE_SECTIONS = frozenset({"approvals", "cron", "tools", "mcp"})


def restart_needed(old: Config, new: Config) -> list[str]:
    """The changed keys a reload cannot apply: whole sections, the channels' keys other
    than those they take live (``ChannelSpec.live_keys``: the chat networks'
    allowlists, read at each message and decision), and the tools other than the
    shell's live settings."""
    specs = registry().specs
    changed = [
        name
        for name in Config.model_fields
        if name not in LIVE_SECTIONS
        and name not in specs
        and getattr(old, name) != getattr(new, name)
    ]
    for name, spec in specs.items():
        before, after = channel_section(old, name), channel_section(new, name)
        if before is None or after is None or type(before) is not type(after):
            changed += [name] if before != after else []
            continue
        changed += [
            f"{name}.{key}"
            for key in type(before).model_fields
            if key not in spec.live_keys and getattr(before, key) != getattr(after, key)
        ]
    if old.tools.model_copy(update={"shell": new.tools.shell}) != new.tools or (
        old.tools.shell.enabled != new.tools.shell.enabled
    ):
        changed.append("tools")
    return changed
