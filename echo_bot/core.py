"""The core's parts built from a validated config — everything that can be checked
before anything starts (tools, policy, approvers, commands, cron schedules)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .approvals import ApprovalGate, ApprovalPolicy, ApproverDirectory
from .commands.core import register_core_commands
from .commands.registry import CommandRegistry
from .commands.reminders import register_reminder_commands
from .config import (
    CHANNEL_NAMES,
    CHANNEL_SWITCHES,
    Config,
    LoadedConfig,
    channel_enabled,
    check_environment,
    secret_env_names,
)
from .errors import ConfigError
from .events import OutboundMessage
from .live import Live, LiveSettings
from .scheduling.reminders import ReminderService
from .secrets import Masker
from .store import Store, make_database
from .store.approvals import ApprovalRow
from .tools.base import Tool
from .tools.builtin import builtin_tools
from .tools.registry import ToolRegistry

if TYPE_CHECKING:
    from .mcp.hub import McpHub

log = logging.getLogger(__name__)


@dataclass
class Core:
    """Every core part, built from the config; nothing started yet."""

    loaded: LoadedConfig
    state_dir: Path
    masker: Masker
    registry: ToolRegistry
    exposed: list[Tool]
    live: Live  # what SIGHUP changes: the approval policy, approvers and timeout
    commands: CommandRegistry
    store: Store
    gate: ApprovalGate
    reminders: ReminderService
    workspace: Path
    mcp: McpHub | None = None  # the MCP servers' tools, when any server is configured


def process_instance() -> str:
    """This daemon among those that write the store: host and pid, and a few random
    characters that tell apart two daemons built in one process (tests do)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def live_settings(config: Config, policy: ApprovalPolicy) -> LiveSettings:
    return LiveSettings(
        policy=policy,
        directory=ApproverDirectory(config),
        approval_timeout=config.approvals.timeout,
    )


def build_core(loaded: LoadedConfig, state_dir: Path, environ: Mapping[str, str]) -> Core:
    """Validate everything that can be validated without starting anything."""
    config = loaded.config
    source = str(loaded.path) if loaded.path else "<defaults>"
    check_environment(loaded, environ)
    masker = Masker.from_environment(secret_env_names(config), environ)
    workspace = (config.tools.workspace or state_dir / "workspace").expanduser().resolve()
    database = make_database(
        config.storage.engine,
        state_dir=state_dir,
        durability=config.bot.durability,
        url=environ.get(config.storage.url_env),
    )
    # The store knows this process by a name no other can have (leases are held by it);
    # [bot] instance is only the label people see (every machine may share one config).
    store = Store(database, masker, instance=process_instance())
    reminders = ReminderService(
        store,
        timezone=config.bot.timezone,
        languages=config.scheduler.languages,
        max_active=config.scheduler.max_active_per_chat,
    )
    registry = ToolRegistry(output_limit=config.tools.output_limit)
    for tool in builtin_tools(
        config.tools,
        workspace=workspace,
        timezone=config.bot.timezone,
        reminders=reminders,
        outgoing=state_dir / "outgoing",
    ):
        registry.register(tool)
    hub: McpHub | None = None
    if config.mcp.servers:  # imported only then: a plain run's footprint stays as it is
        from .mcp.hub import McpHub

        hub = McpHub(config.mcp.servers, registry, environ, max_tools=config.mcp.max_tools)
    registry.check_names(config.tools.allow, "tools.allow", source)
    registry.check_names(config.tools.deny, "tools.deny", source)
    policy = ApprovalPolicy(config.approvals, registry, source)
    exposed = registry.exposed(config.tools.profile, config.tools.allow, config.tools.deny)
    commands = CommandRegistry()

    async def pending() -> list[Any]:
        return await store.run(lambda tx: tx.approvals.list())

    live = Live(live_settings(config, policy))
    gate = ApprovalGate(live, masker, timezone=config.bot.timezone)

    async def reset(session_key: str) -> None:
        await store.run(lambda tx: tx.turns.reset_session(session_key))

    async def reprompt(row: ApprovalRow) -> OutboundMessage:
        return await store.run(lambda tx: gate.reprompt(tx, row))

    register_core_commands(commands, pending, reprompt, reset, reminders.timezone_for)
    register_reminder_commands(commands, reminders)
    _check_references(loaded, registry, environ, source)
    core = Core(
        mcp=hub,
        loaded=loaded,
        state_dir=state_dir,
        masker=masker,
        registry=registry,
        exposed=exposed,
        live=live,
        commands=commands,
        store=store,
        gate=gate,
        reminders=reminders,
        workspace=workspace,
    )
    if hub is not None:  # a server's tools come and go: what the brain sees follows

        def expose() -> None:
            tools = config.tools
            core.exposed = registry.exposed(tools.profile, tools.allow, tools.deny)

        hub.on_change = expose
    return core


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
    on = config.webhook.enabled
    users = [
        _User(f"webhook.routes[{i}]", f"route {r.name}", on, r.tool, None, r.deliver_to)
        for i, r in enumerate(config.webhook.routes)
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
    if channel not in CHANNEL_NAMES:
        return f"no channel {channel!r} in {address!r} (channels: {', '.join(CHANNEL_NAMES)})"
    if must_be_on and not channel_enabled(loaded, environ, channel):
        return f"the {channel} channel is off ({CHANNEL_SWITCHES[channel]})"
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
