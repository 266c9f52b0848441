"""``[slack]``: the channel's config section and what its environment must hold.
Pure pydantic: imported to read a config file, without slack-sdk."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from echo_bot.sections import ChatSection, EnvName, FilesSection, http_url, shaped


def _api_base(value: str) -> str:
    return http_url(value) + "/"


SlackUser = Annotated[
    str,
    AfterValidator(shaped(r"[UW][A-Z0-9]{2,}", "a Slack user ID (U… or W…, as its profile shows)")),
]
SlackChannel = Annotated[
    str, AfterValidator(shaped(r"[CG][A-Z0-9]{2,}", "a Slack channel ID (C… or G…, not its #name)"))
]


class SlackConfig(ChatSection[SlackUser], FilesSection):
    # "socket": Socket Mode, a WebSocket the daemon opens (no public URL needed; the app
    # token). "http": the Events API and interactivity POSTed to [http] at `path`
    # (a public HTTPS URL in front of it; the signing secret).
    mode: Literal["socket", "http"] = "socket"
    bot_token_env: EnvName = "SLACK_BOT_TOKEN"  # xoxb-…
    app_token_env: EnvName = "SLACK_APP_TOKEN"  # xapp-…, Socket Mode
    signing_secret_env: EnvName = "SLACK_SIGNING_SECRET"  # HTTP mode
    path: str = Field("/slack/events", pattern=r"^/[A-Za-z0-9/_-]{1,100}$")
    # The channels (C…/G…) it answers mentions in; None: any it is a member of. Direct
    # messages from allowed users are always taken.
    channels: list[SlackChannel] | None = None
    # The Web API's base URL (a test server or a proxy).
    api_base: Annotated[str, AfterValidator(_api_base)] = "https://slack.com/api/"


TOKEN_KINDS = {"xoxb-": "a bot token", "xapp-": "an app-level token", "xoxp-": "a user token"}


def _token_problems(key: str, name: str, environ: Mapping[str, str]) -> list[str]:
    """The token missing, or of the wrong kind (each names its kind in its prefix: the
    two tokens swapped is the common mistake), said now, not after a network call."""
    prefix, short, what = {
        "bot_token_env": (
            "xoxb-",
            "the bot token",
            "the bot token, the app's Bot User OAuth Token",
        ),
        "app_token_env": ("xapp-", "the app token", "the app-level token, with connections:write"),
    }[key]
    token = environ.get(name, "")
    if not token:
        return [f"{key}: environment variable {name} is not set ({short}, {prefix}…)"]
    if token.startswith(prefix):
        return []
    kind = next((k for p, k in TOKEN_KINDS.items() if token.startswith(p)), None)
    found = f"it holds {kind}" if kind else "it does not look like a Slack token"
    return [f"{key}: ${name} should be {what} ({prefix}…); {found}"]


def secrets_in_use(section: SlackConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    # Socket Mode reads the app token, the HTTP mode the signing secret.
    transport = section.app_token_env if section.mode == "socket" else section.signing_secret_env
    return [(section.bot_token_env, True), (transport, True)]


def environment_problems(
    section: SlackConfig, environ: Mapping[str, str], state_dir: Path | None
) -> list[str]:
    problems = _token_problems("bot_token_env", section.bot_token_env, environ)
    if section.mode == "socket":
        problems += _token_problems("app_token_env", section.app_token_env, environ)
    elif not environ.get(section.signing_secret_env):
        problems.append(
            f"signing_secret_env: environment variable {section.signing_secret_env} is not"
            " set (the signing secret)"
        )
    return problems


def summary(section: SlackConfig) -> str:
    if section.mode == "socket":
        return "on, Socket Mode (a WebSocket to Slack; no public URL)"
    return f"on, the Events API over HTTP at {section.path} on [http]"
