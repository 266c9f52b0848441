"""The Pigeon channel plugin: its config section and its spec. The channel itself
(``pigeon.channel``) is imported only when it runs."""

from __future__ import annotations

from echo_bot.plugins import ChannelSpec
from echo_bot.sections import ChatSection


class PigeonConfig(ChatSection[str]):
    """``[pigeon]``: where its server is and where its token is; who may chat and
    approve and ``enabled`` are every chat section's (``ChatSection``)."""

    api_base: str = "http://127.0.0.1:9"
    token_env: str = "PIGEON_TOKEN"
    poll_wait: float = 1.0  # seconds the server holds a poll open when nothing is new


SPEC = ChannelSpec(
    name="pigeon",
    target="pigeon.channel:PigeonChannel",
    install="echo-bot-pigeon",
    pair_hint="on Pigeon: pair {code}",
    secrets_in_use=lambda section, environ: [(section.token_env, True)],
    secret_names=lambda section: [section.token_env],
    config_model=PigeonConfig,
)
