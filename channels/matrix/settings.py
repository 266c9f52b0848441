"""``[matrix]``: the channel's config section and what its environment must hold.
Pure pydantic: imported to read a config file, without matrix-nio."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, StrictBool, model_validator

from echo_bot.sections import ChatSection, Duration, EnvName, FilesSection, http_url, shaped

MatrixUser = Annotated[
    str, AfterValidator(shaped(r"@[^:\s]+:[^\s]+", "a Matrix user ID (@name:server)"))
]
MatrixRoom = Annotated[
    str, AfterValidator(shaped(r"![^:\s]+:[^\s]+", "a Matrix room ID (!id:server)"))
]


class MatrixConfig(ChatSection[MatrixUser], FilesSection):
    homeserver: Annotated[str, AfterValidator(http_url)] = "https://matrix.org"
    user_id: MatrixUser | None = None
    # The bot account's access token; or, for a first login, its password (the device
    # and token that login gives are then kept in the store and used from then on).
    access_token_env: EnvName = "MATRIX_ACCESS_TOKEN"
    password_env: EnvName | None = None
    device_name: str = Field("echo-bot", min_length=1, max_length=100)
    rooms: list[MatrixRoom] | None = None  # None: any room an allowed user invites it to
    encryption: StrictBool = True
    # Several daemons on one PostgreSQL store: one syncs; when it dies, another takes
    # over once it has been unseen this long (at least 10 s: daemons are seen every 5).
    lease: Duration = Field(timedelta(seconds=15), ge=timedelta(seconds=10))

    @model_validator(mode="after")
    def _needs_user(self) -> MatrixConfig:
        if self.enabled and not self.user_id:
            raise ValueError("user_id is needed (the bot account, @name:server)")
        return self


def secrets_in_use(section: MatrixConfig, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    # The token, or for a first login the password (then the kept token is used).
    found = [(section.access_token_env, section.password_env is None)]
    if section.password_env:
        found.append((section.password_env, False))
    return found


def environment_problems(
    section: MatrixConfig, environ: Mapping[str, str], state_dir: Path | None
) -> list[str]:
    """Neither the token, nor a password for a first login, nor a login kept from one
    (``state_dir``'s ``matrix/login.json``)."""
    kept = state_dir is not None and (state_dir / "matrix" / "login.json").exists()
    password = bool(section.password_env and environ.get(section.password_env))
    if environ.get(section.access_token_env) or password or kept:
        return []
    also = f", nor {section.password_env} for a first login" if section.password_env else ""
    return [
        f"access_token_env: environment variable {section.access_token_env} is not set"
        f" (the bot's access token{also}; or set matrix.password_env and the variable it"
        " names to log in with a password)"
    ]


def summary(section: MatrixConfig) -> str:
    e2ee = "end-to-end encryption on" if section.encryption else "unencrypted rooms only"
    return f"on as {section.user_id} at {section.homeserver} ({e2ee})"
