"""``[discord]``: the channel's config section and what its environment must hold.
Pure pydantic: imported to read a config file, without discord.py."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, StrictBool

from echo_bot.sections import (
    ChatSection,
    EnvName,
    FilesSection,
    ca_file_problem,
    http_url,
    shaped,
    without_login,
)

# A user, guild or channel ID as Discord's "Copy ID" gives it (Developer Mode on).
Snowflake = Annotated[
    str, AfterValidator(shaped(r"[1-9][0-9]{15,19}", "a Discord ID (Copy ID, 17 to 20 digits)"))
]


class DiscordConfig(ChatSection[Snowflake], FilesSection):
    token_env: EnvName = "DISCORD_BOT_TOKEN"  # the bot's token (Bot → Reset Token)
    # The guilds (servers) and channels it answers in; a thread counts as its parent
    # channel. None: any it is in. Direct messages from allowed users are always taken.
    guilds: list[Snowflake] | None = None
    channels: list[Snowflake] | None = None
    # The privileged Message Content intent: without it Discord still sends the text of
    # direct messages and of messages that mention the bot; with it, also of a reply to
    # the bot that does not ping it. On here means on in the developer portal too.
    message_content: StrictBool = False
    # An HTTP proxy every request and the gateway go through, and a CA to trust besides
    # the system's (a proxy that ends TLS itself).
    proxy: Annotated[str, AfterValidator(http_url)] | None = None
    ca_file: str | None = None


def _token_problem(token: str, name: str) -> str | None:
    """The token missing, or not shaped as a bot token (three dot-separated parts): the
    application's client secret or public key pasted instead is the common mistake."""
    if not token:
        return f"token_env: environment variable {name} is not set (the bot's token)"
    if token.count(".") == 2 and all(token.split(".")):
        return None
    looks = (
        "the application's public key"
        if len(token) == 64 and all(c in "0123456789abcdef" for c in token)
        else "the application's client secret"
        if len(token) == 32
        else "no bot token"
    )
    return (
        f"token_env: ${name} should be the bot's token (Bot → Reset Token in the developer"
        f" portal); it looks like {looks}"
    )


def secrets_in_use(section: DiscordConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    return [(section.token_env, True)]


def environment_problems(
    section: DiscordConfig, environ: Mapping[str, str], state_dir: Path | None
) -> list[str]:
    problems = [_token_problem(environ.get(section.token_env, ""), section.token_env)]
    problems.append(ca_file_problem(section.ca_file))
    return [p for p in problems if p]


def summary(section: DiscordConfig) -> str:
    where = "any guild it is in" if section.guilds is None else f"{len(section.guilds)} guild(s)"
    content = ", Message Content intent" if section.message_content else ""
    via = f", through {without_login(section.proxy)}" if section.proxy else ""
    return f"on, the gateway (direct messages; mentions and replies in {where}){content}{via}"
