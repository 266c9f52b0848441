"""What can be checked before anything starts, without a store: ``check`` validates a
config (tools, policy, approvers, routes' and jobs' references, cron schedules) and
returns the settings a reload applies at once. ``runtime.build`` makes the daemon from
the same pieces; a reload calls ``check`` alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .approvals import ApprovalPolicy, ApproverDirectory
from .config import (
    Config,
    LoadedConfig,
    channel_enabled,
    channel_names,
    channel_switch,
    check_environment,
    triggers,
)
from .errors import ConfigError
from .live import LiveSettings
from .scheduling.reminders import ReminderService
from .tools.builtin import builtin_tools
from .tools.builtin.messaging import Outlet
from .tools.registry import ToolRegistry


def source_of(loaded: LoadedConfig) -> str:
    """The config's name in error messages."""
    return str(loaded.path) if loaded.path else "<defaults>"


def workspace_of(config: Config, state_dir: Path) -> Path:
    return (config.tools.workspace or state_dir / "workspace").expanduser().resolve()


def tool_registry(
    loaded: LoadedConfig,
    state_dir: Path,
    reminders: ReminderService,
    outlet: Outlet | None = None,
) -> ToolRegistry:
    """The built-in tools, made for ``loaded``; none started (MCP servers' tools are
    registered by their hub). The sending tools send through ``outlet``."""
    config = loaded.config
    registry = ToolRegistry(output_limit=config.tools.output_limit)
    for tool in builtin_tools(
        config.tools,
        workspace=workspace_of(config, state_dir),
        timezone=config.bot.timezone,
        reminders=reminders,
        outgoing=state_dir / "outgoing",
        outlet=outlet,
        store=reminders.store,  # the memory and recall tools': the reminders' store
    ):
        registry.register(tool)
    return registry


def settings(
    loaded: LoadedConfig, environ: Mapping[str, str], registry: ToolRegistry
) -> LiveSettings:
    """Check what the config names against ``registry`` (its tools, and the prefixes of
    the MCP servers' tools); the approval policy, approvers and timeout it makes."""
    config = loaded.config
    source = source_of(loaded)
    registry.check_names(config.tools.allow, "tools.allow", source)
    registry.check_names(config.tools.deny, "tools.deny", source)
    policy = ApprovalPolicy(config.approvals, registry, source)
    _check_references(loaded, registry, environ, source)
    return LiveSettings(
        loaded=loaded,
        policy=policy,
        directory=ApproverDirectory(config),
        approval_timeout=config.approvals.timeout,
    )


def check(
    loaded: LoadedConfig,
    environ: Mapping[str, str],
    *,
    state_dir: Path,
    reminders: ReminderService,
) -> LiveSettings:
    """Validate ``loaded`` as a reload would apply it: no store is made or opened and
    nothing starts (the tools made here are thrown away; ``reminders`` is the running
    service the reminder tools are declared on). Raises ``ConfigError``."""
    check_environment(loaded, environ, state_dir)
    registry = tool_registry(loaded, state_dir, reminders)
    if loaded.config.mcp.servers:  # their tools are known once listed: names only here
        from .mcp.naming import prefix

        for server in loaded.config.mcp.servers:
            registry.reserve(prefix(server.name), lambda: "")
    return settings(loaded, environ, registry)


# How to switch on a built-in tool whose ``available()`` is False.
_SWITCH_ON = {
    "shell_exec": "[tools.shell] enabled = true switches it on",
    "http_request": "[tools.http] allow_domains (the domains it may reach) switches it on",
}


def _check_references(
    loaded: LoadedConfig, registry: ToolRegistry, environ: Mapping[str, str], source: str
) -> None:
    """What routes and jobs promise must exist: their tools and their chats.

    A name that exists nowhere is always an error; a tool or channel that is switched
    off is one when the route or job that needs it can run (jobs always; routes when
    [webhook] is on). Every problem is reported, one line each.
    """
    config = loaded.config
    problems = [f"{source}: {problem}" for problem in _cron_schedule_problems(config)]
    users = [
        _User(
            f"{name}.{t.key}",
            t.who,
            channel_enabled(loaded, environ, name),
            t.tool,
            None,  # a channel's triggers send what comes in: their args are templates
            t.deliver_to,
        )
        for name, t in triggers(config)
    ]
    users += [
        _User(f"cron[{i}]", f"job {j.name}", True, j.tool, j.args, j.deliver_to)
        for i, j in enumerate(config.cron)
    ]
    for user in users:
        found = [_tool_problem(registry, user)]
        if user.deliver_to is not None:
            problem = _channel_problem(loaded, environ, user.deliver_to, must_be_on=user.runs)
            found.append(f"{user.key}.deliver_to: {problem}" if problem else None)
        problems += [f"{source}: {line} ({user.who})" for line in found if line]
    if config.approvals.default_chat:
        # Only the name: the gate's prompts may reach a chat by a channel added later.
        problem = _channel_problem(loaded, environ, config.approvals.default_chat, must_be_on=False)
        if problem:
            problems.append(f"{source}: approvals.default_chat: {problem}")
    if problems:
        raise ConfigError("\n".join(problems))


@dataclass(frozen=True)
class _User:
    """A route or job: what it names, and whether it can run with this config."""

    key: str
    who: str
    runs: bool
    tool: str | None
    args: dict[str, Any] | None  # sent as written (a job); a route's are templates
    deliver_to: str | None


def _tool_problem(registry: ToolRegistry, user: _User) -> str | None:
    if user.tool is None:
        return None
    tool = registry.get(user.tool)
    if tool is None and registry.reserved(user.tool):
        return None  # an MCP server's: known once the server lists it
    if tool is None:
        known = ", ".join(sorted(t.name for t in registry))
        return f"{user.key}.tool: unknown tool {user.tool!r} (tools: {known})"
    if user.runs and not tool.available():
        how = _SWITCH_ON.get(tool.name, "it is switched off in this config")
        return f"{user.key}.tool: {tool.name} is switched off ({how})"
    invalid = registry.validate(tool.name, user.args) if user.args is not None else None
    return f"{user.key}.args: {invalid.output}" if invalid is not None else None


def _channel_problem(
    loaded: LoadedConfig, environ: Mapping[str, str], address: str, *, must_be_on: bool
) -> str | None:
    channel = address.split(":", 1)[0]
    if channel not in channel_names():
        return f"no channel {channel!r} in {address!r} (channels: {', '.join(channel_names())})"
    if must_be_on and not channel_enabled(loaded, environ, channel):
        return f"the {channel} channel is off ({channel_switch(channel)})"
    return None


def _cron_schedule_problems(config: Config) -> list[str]:
    from zoneinfo import ZoneInfo

    from .scheduling.crontab import cron_trigger

    problems = []
    for index, job in enumerate(config.cron):
        try:
            cron_trigger(job.schedule, ZoneInfo(job.timezone or config.bot.timezone))
        except ValueError as exc:
            problems.append(f"cron[{index}].schedule: {exc} (job {job.name})")
    return problems
