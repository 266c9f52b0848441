"""The Pigeon channel plugin: its config section and its spec. The channel itself
(``pigeon.channel``) is imported only when it runs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from echo_bot.plugins import ChannelSpec


class PigeonConfig(BaseModel):
    """``[pigeon]``: where its server is, who may chat and approve, where its token is."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    api_base: str = "http://127.0.0.1:9"
    allowed_users: list[str] = Field(default_factory=list)
    approvers: list[str] | None = None  # unset: the allowed users
    token_env: str = "PIGEON_TOKEN"
    poll_wait: float = 1.0  # seconds the server holds a poll open when nothing is new


SPEC = ChannelSpec(
    name="pigeon",
    target="pigeon.channel:PigeonChannel",
    install="echo-bot-pigeon",
    pair_hint="on Pigeon: pair {code}",
    enabled=lambda section, environ, from_file: section.enabled,
    allowed_users=lambda section: section.allowed_users,
    approvers=lambda section: (
        section.allowed_users if section.approvers is None else section.approvers
    ),
    secrets_in_use=lambda section, environ: [(section.token_env, True)],
    secret_names=lambda section: [section.token_env],
    live_keys=frozenset({"allowed_users", "approvers"}),
    config_model=PigeonConfig,
)
