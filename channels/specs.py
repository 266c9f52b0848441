"""The built-in channels as plugins: their ``ChannelSpec``s, registered in pyproject.toml
under the ``echo_bot.channels`` entry point group like any other channel's. This module
imports no network library: the channel classes are named here and imported only when
their channel runs."""

from __future__ import annotations

from collections.abc import Mapping

from echo_bot.config import MatrixConfig, SlackConfig, TelegramConfig, WebhookConfig
from echo_bot.plugins import ChannelSpec

CHAT_LIVE_KEYS = frozenset({"allowed_users", "approvers"})  # taken at SIGHUP


def _telegram_on(section: TelegramConfig, environ: Mapping[str, str], from_file: bool) -> bool:
    """Switched on in the config file; with no file, by its token in the environment."""
    return section.enabled if from_file else bool(environ.get(section.token_env))


def _telegram_secrets(
    section: TelegramConfig, environ: Mapping[str, str]
) -> list[tuple[str, bool]]:
    found = [(section.token_env, True)]
    if section.mode == "webhook":
        found.append((section.webhook_secret_env, True))
    return found


TELEGRAM = ChannelSpec(
    name="telegram",
    target="channels.telegram:TelegramChannel",
    dedupe_window=72 * 3600.0,  # Telegram may reuse an update_id after a week of silence
    ids_tell_direct=True,
    pair_hint="on Telegram: /pair {code}",
    enabled=_telegram_on,
    http_reason=lambda s: "Telegram webhook mode" if s.mode == "webhook" else None,
    allowed_users=lambda s: {str(u) for u in s.allowed_users},
    approvers=lambda s: {str(u) for u in s.approver_ids},
    secrets_in_use=_telegram_secrets,
    secret_names=lambda s: [s.token_env, s.webhook_secret_env],
    live_keys=CHAT_LIVE_KEYS,
)


def _matrix_secrets(section: MatrixConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    # The token, or for a first login the password (then the kept token is used).
    found = [(section.access_token_env, section.password_env is None)]
    if section.password_env:
        found.append((section.password_env, False))
    return found


MATRIX = ChannelSpec(
    name="matrix",
    target="channels.matrix:MatrixChannel",
    install="echo-bot[matrix]",
    colons_in_chat_ids=True,  # a room ID: !opaque:server
    pair_hint="on Matrix: invite the bot to a direct chat, then send: pair {code}",
    enabled=lambda s, environ, from_file: s.enabled,
    allowed_users=lambda s: set(s.allowed_users),
    approvers=lambda s: set(s.approver_ids),
    secrets_in_use=_matrix_secrets,
    secret_names=lambda s: [s.access_token_env] + ([s.password_env] if s.password_env else []),
    live_keys=CHAT_LIVE_KEYS,
)


def _slack_secrets(section: SlackConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    # Socket Mode reads the app token, the HTTP mode the signing secret.
    transport = section.app_token_env if section.mode == "socket" else section.signing_secret_env
    return [(section.bot_token_env, True), (transport, True)]


SLACK = ChannelSpec(
    name="slack",
    target="channels.slack:SlackChannel",
    install="echo-bot[slack]",
    prefix="!",  # Slack takes /commands as its own
    pair_hint="on Slack, in a direct message to the bot: pair {code}",
    enabled=lambda s, environ, from_file: s.enabled,
    http_reason=lambda s: "Slack's Events API" if s.mode == "http" else None,
    allowed_users=lambda s: set(s.allowed_users),
    approvers=lambda s: set(s.approver_ids),
    secrets_in_use=_slack_secrets,
    secret_names=lambda s: [s.bot_token_env, s.app_token_env, s.signing_secret_env],
    live_keys=CHAT_LIVE_KEYS,
)


def _webhook_secrets(section: WebhookConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    return [(r.secret_env, True) for r in section.routes if r.secret_env]


WEBHOOK = ChannelSpec(
    name="webhook",
    target="channels.webhook:WebhookChannel",
    machine=True,  # a route's sender is a program
    enabled=lambda s, environ, from_file: s.enabled,
    http_reason=lambda s: "webhooks",
    secrets_in_use=_webhook_secrets,
    secret_names=lambda s: [r.secret_env for r in s.routes if r.secret_env],
)

# The terminal: runs when asked; its person is the owner at the machine.
CLI = ChannelSpec(name="cli", target="channels.cli:CliChannel", local=True)
