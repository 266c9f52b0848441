"""The built-in channels as plugins: their ``ChannelSpec``s, registered in pyproject.toml
under the ``echo_bot.channels`` entry point group like any other channel's. This module
imports no network library: each channel's section is its package's ``settings`` (pure
pydantic), and the channel classes are named here and imported only when their channel
runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from echo_bot.config import WebhookConfig
from echo_bot.plugins import ChannelSpec, Trigger

from .discord import settings as discord
from .email import settings as email
from .matrix import settings as matrix
from .slack import settings as slack
from .telegram import settings as telegram

TELEGRAM = ChannelSpec(
    name="telegram",
    target="channels.telegram.channel:TelegramChannel",
    dedupe_window=72 * 3600.0,  # Telegram may reuse an update_id after a week of silence
    ids_tell_direct=True,
    pair_hint="on Telegram: /pair {code}",
    example_id="12345",
    enabled=telegram.is_on,
    without_file=lambda s: f"set ${s.token_env} for Telegram",
    http_reason=lambda s: "Telegram webhook mode" if s.mode == "webhook" else None,
    secrets_in_use=telegram.secrets_in_use,
    secret_names=lambda s: [s.token_env, s.webhook_secret_env],
    environment_problems=telegram.environment_problems,
    summary=telegram.summary,
    config_model=telegram.TelegramConfig,
)

MATRIX = ChannelSpec(
    name="matrix",
    target="channels.matrix.channel:MatrixChannel",
    install="echo-bot[matrix]",
    colons_in_chat_ids=True,  # a room ID: !opaque:server
    prefix="!",  # Element takes /help as its own, and asks about any other /word
    pair_hint="on Matrix: invite the bot to a direct chat, then send: pair {code}",
    example_id="@you:example.org",
    secrets_in_use=matrix.secrets_in_use,
    secret_names=lambda s: [s.access_token_env] + ([s.password_env] if s.password_env else []),
    environment_problems=matrix.environment_problems,
    summary=matrix.summary,
    config_model=matrix.MatrixConfig,
)

SLACK = ChannelSpec(
    name="slack",
    target="channels.slack.channel:SlackChannel",
    install="echo-bot[slack]",
    prefix="!",  # Slack takes /commands as its own
    pair_hint="on Slack, in a direct message to the bot: pair {code}",
    example_id="U0123ABCD",
    http_reason=lambda s: "Slack's Events API" if s.mode == "http" else None,
    secrets_in_use=slack.secrets_in_use,
    secret_names=lambda s: [s.bot_token_env, s.app_token_env, s.signing_secret_env],
    environment_problems=slack.environment_problems,
    summary=slack.summary,
    config_model=slack.SlackConfig,
)

DISCORD = ChannelSpec(
    name="discord",
    target="channels.discord.channel:DiscordChannel",
    install="echo-bot[discord]",
    prefix="!",  # Discord takes /commands as its own
    pair_hint="on Discord, in a direct message to the bot: pair {code}",
    example_id="123456789012345678",
    secrets_in_use=discord.secrets_in_use,
    secret_names=lambda s: [s.token_env],
    environment_problems=discord.environment_problems,
    summary=discord.summary,
    config_model=discord.DiscordConfig,
)

EMAIL = ChannelSpec(
    name="email",
    target="channels.email.channel:EmailChannel",
    install="echo-bot[email]",
    pair_hint="by e-mail to the bot, as its text: pair {code}",
    example_id="you@example.org",
    secrets_in_use=email.secrets_in_use,
    secret_names=lambda s: [s.password_env],
    environment_problems=email.environment_problems,
    summary=email.summary,
    config_model=email.EmailConfig,
)


def _webhook_secrets(section: WebhookConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    return [(r.secret_env, True) for r in section.routes if r.secret_env]


def _webhook_problems(
    section: WebhookConfig, environ: Mapping[str, str], state_dir: Path | None
) -> list[str]:
    return [
        f"routes[{index}].secret_env: environment variable {route.secret_env} is not set"
        " (the route's secret)"
        for index, route in enumerate(section.routes)
        if route.secret_env and not environ.get(route.secret_env)
    ]


WEBHOOK = ChannelSpec(
    name="webhook",
    target="channels.webhook:WebhookChannel",
    machine=True,  # a route's sender is a program
    enabled=lambda s, environ, from_file: s.enabled,
    http_reason=lambda s: "webhooks",
    secrets_in_use=_webhook_secrets,
    secret_names=lambda s: [r.secret_env for r in s.routes if r.secret_env],
    environment_problems=_webhook_problems,
    triggers=lambda s: [
        Trigger(f"routes[{i}]", f"route {r.name}", r.tool, r.deliver_to)
        for i, r in enumerate(s.routes)
    ],
    summary=lambda s: f"on ({len(s.routes)} route(s))",
    live_keys=frozenset(WebhookConfig.model_fields),  # its routes: all of it, at SIGHUP
)

# The terminal: runs when asked; its person is the owner at the machine.
CLI = ChannelSpec(name="cli", target="channels.cli:CliChannel", local=True)
