"""``[telegram]``: the channel's config section and what its environment must hold.
Pure pydantic: imported to read a config file, without aiogram."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from echo_bot.sections import ByteSize, ChatSection, Duration, EnvName, FilesSection

BOT_TOKEN_SHAPE = "expected 123456:ABC…, as @BotFather gives it"


def looks_like_bot_token(token: str) -> bool:
    """A Telegram bot token's shape: ``<digits>:<rest>``, no whitespace (the rule aiogram
    applies when a Bot is made). ``run``, ``check-config`` and ``doctor`` all ask here."""
    bot_id, sep, rest = token.partition(":")
    return bool(sep and bot_id.isdigit() and rest) and not any(c.isspace() for c in token)


def _https_url(value: str | None) -> str | None:
    """Telegram delivers webhook updates only to HTTPS URLs (setWebhook refuses others)."""
    if value is None:
        return value
    parts = urlsplit(value)
    if parts.scheme.lower() != "https" or not parts.hostname:
        scheme = f"{parts.scheme}://" if parts.scheme else "no scheme"
        raise ValueError(
            f"Telegram sends updates only to an https:// URL with a host (this one has "
            f"{scheme if parts.scheme.lower() != 'https' else 'no host'}): your reverse "
            "proxy's public HTTPS address"
        )
    return value


class TelegramConfig(ChatSection[int], FilesSection):
    token_env: EnvName = "TELEGRAM_BOT_TOKEN"
    api_base: str = "https://api.telegram.org"
    mode: Literal["polling", "webhook"] = "polling"
    # Several daemons on one PostgreSQL store: one polls; when it dies, another takes
    # over once it has been unseen this long (at least 10 s: daemons are seen every 5).
    lease: Duration = Field(timedelta(seconds=15), ge=timedelta(seconds=10))
    webhook_url: Annotated[str | None, AfterValidator(_https_url)] = None
    webhook_secret_env: EnvName = "TELEGRAM_WEBHOOK_SECRET"
    # Telegram's cloud Bot API hands bots files of at most 20 MB; a local Bot API server
    # allows more.
    max_download: ByteSize = 20 * 1000**2

    @model_validator(mode="after")
    def _webhook_needs_url(self) -> TelegramConfig:
        if self.mode == "webhook" and not self.webhook_url:
            raise ValueError("mode = 'webhook' needs webhook_url (the public HTTPS URL)")
        if self.webhook_url and urlsplit(self.webhook_url).path in ("", "/"):
            # The daemon serves the webhook at the URL's path; at "/" Telegram's posts
            # would meet a 404 and every update would be dropped.
            raise ValueError(
                f"webhook_url {self.webhook_url} needs a path, the one the daemon serves"
                " Telegram's posts at (e.g. https://bot.example.org/telegram)"
            )
        return self


def is_on(section: TelegramConfig, environ: Mapping[str, str], from_file: bool) -> bool:
    """Switched on in the config file; with no file, by its token in the environment."""
    return section.enabled if from_file else bool(environ.get(section.token_env))


def secrets_in_use(section: TelegramConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    found = [(section.token_env, True)]
    if section.mode == "webhook":
        found.append((section.webhook_secret_env, True))
    return found


def environment_problems(
    section: TelegramConfig, environ: Mapping[str, str], state_dir: Path | None
) -> list[str]:
    """The token missing or not a bot token's shape; the webhook mode's secret missing."""
    problems = []
    token = environ.get(section.token_env)
    if not token:
        problems.append(
            f"token_env: environment variable {section.token_env} is not set (the bot token)"
        )
    elif not looks_like_bot_token(token):
        problems.append(
            f"token_env: ${section.token_env} does not look like a bot token ({BOT_TOKEN_SHAPE})"
        )
    if section.mode == "webhook" and not environ.get(section.webhook_secret_env):
        problems.append(
            f"webhook_secret_env: environment variable {section.webhook_secret_env} is not"
            " set (the webhook secret token)"
        )
    return problems


def summary(section: TelegramConfig) -> str:
    return "on" if section.mode == "polling" else f"on, webhook at {section.webhook_url}"
