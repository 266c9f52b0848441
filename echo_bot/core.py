"""The core's parts built from a validated config — everything that can be checked
before anything starts (tools, policy, approvers, commands, cron schedules)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .approvals import ApprovalGate, ApprovalPolicy, ApproverDirectory
from .brains.core_commands import register_core_commands
from .brains.reminder_commands import register_reminder_commands
from .commands import CommandRegistry
from .config import Config, LoadedConfig, check_environment, secret_env_names
from .errors import ConfigError
from .events import OutboundMessage
from .reminders import ReminderService
from .secrets import Masker
from .store import DB_FILENAME, Database
from .store.approvals import ApprovalRow, list_approvals
from .store.audit import AuditWriter
from .store.turns import reset_session
from .tools.base import Tool
from .tools.builtin import builtin_tools
from .tools.registry import ToolRegistry

log = logging.getLogger(__name__)


@dataclass
class Core:
    """Every core part, built from the config; nothing started yet."""

    loaded: LoadedConfig
    state_dir: Path
    masker: Masker
    registry: ToolRegistry
    exposed: list[Tool]
    policy: ApprovalPolicy
    directory: ApproverDirectory
    commands: CommandRegistry
    db: Database
    audit: AuditWriter
    gate: ApprovalGate
    reminders: ReminderService
    brain_name: str = "rules"
    extras: dict[str, Any] = field(default_factory=dict)


def build_core(loaded: LoadedConfig, state_dir: Path, environ: Mapping[str, str]) -> Core:
    """Validate everything that can be validated without starting anything."""
    config = loaded.config
    source = str(loaded.path) if loaded.path else "<defaults>"
    check_environment(loaded, environ)
    masker = Masker.from_environment(secret_env_names(config), environ)
    workspace = (config.tools.workspace or state_dir / "workspace").expanduser().resolve()
    db = Database(state_dir / DB_FILENAME, durability=config.bot.durability)
    reminders = ReminderService(
        db,
        timezone=config.bot.timezone,
        languages=config.scheduler.languages,
        max_active=config.scheduler.max_active_per_chat,
    )
    registry = ToolRegistry(output_limit=config.tools.output_limit)
    for tool in builtin_tools(
        config.tools, workspace=workspace, timezone=config.bot.timezone, reminders=reminders
    ):
        registry.register(tool)
    registry.check_names(config.tools.allow, "tools.allow", source)
    registry.check_names(config.tools.deny, "tools.deny", source)
    policy = ApprovalPolicy(config.approvals, registry, source)
    exposed = registry.exposed(config.tools.profile, config.tools.allow, config.tools.deny)
    commands = CommandRegistry()

    async def pending() -> list[Any]:
        return await db.run(lambda conn: list_approvals(conn))

    directory = ApproverDirectory(config)
    audit = AuditWriter(masker)
    gate = ApprovalGate(directory, audit, masker, config.approvals.timeout)

    async def reset(session_key: str) -> None:
        await db.run(lambda conn: reset_session(conn, session_key))

    async def reprompt(row: ApprovalRow) -> OutboundMessage:
        return await db.run(lambda conn: gate.reprompt(conn, row))

    register_core_commands(commands, pending, reprompt, reset)
    register_reminder_commands(commands, reminders)
    _check_cron_jobs(config, registry, source)
    return Core(
        loaded=loaded,
        state_dir=state_dir,
        masker=masker,
        registry=registry,
        exposed=exposed,
        policy=policy,
        directory=directory,
        commands=commands,
        db=db,
        audit=audit,
        gate=gate,
        reminders=reminders,
    )


def _check_cron_jobs(config: Config, registry: ToolRegistry, source: str) -> None:
    from zoneinfo import ZoneInfo

    from .crontab import cron_trigger

    for index, job in enumerate(config.cron):
        where = f"{source}: cron[{index}] ({job.name})"
        try:
            cron_trigger(job.schedule, ZoneInfo(job.timezone or config.bot.timezone))
        except ValueError as exc:
            raise ConfigError(f"{where}: schedule: {exc}") from None
        if job.tool is not None and registry.get(job.tool) is None:
            raise ConfigError(f"{where}: tool: unknown tool {job.tool!r}")
