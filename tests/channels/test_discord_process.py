"""`echo-bot run` as a real process on Discord (the fake Discord in this test's loop,
reached through the daemon's configured proxy): killed seconds after a first message in
a new DM, the next start still reads that DM back — a message sent there while the
daemon was down is answered once."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_bot.brains.rules import no_match_hint
from tests.conftest import echo_bot_env
from tests.fakes.discord_api import OWNER_ID, FakeDiscord, dm_of, user
from tests.proc import Daemon
from tests.waiting import eventually

pytest.importorskip("discord")
pytestmark = pytest.mark.slow

OWNER = user(OWNER_ID, "owner")
DM = dm_of(OWNER_ID)


def config_text(discord: FakeDiscord) -> str:
    return f"""
[discord]
enabled = true
proxy = "{discord.proxy_url}"
ca_file = "{discord.ca_file}"
allowed_users = ["{OWNER_ID}"]
"""


async def test_a_new_dm_is_read_back_after_a_kill_seconds_after_its_first_message(
    tmp_path: Path,
) -> None:
    state, config = tmp_path / "state", tmp_path / "config.toml"
    hint = no_match_hint("!")  # the rules brain's answer to what it does not understand

    def answers() -> list[str]:
        return [s.content for s in discord.sent if s.channel_id == DM and s.content == hint]

    async with FakeDiscord() as discord:
        config.write_text(config_text(discord))
        env = echo_bot_env(DISCORD_BOT_TOKEN=discord.token)
        daemon = Daemon(config, state, env)
        await daemon.start()
        try:
            await eventually(discord.connected.is_set, timeout=30, what="connected")
            await discord.push_message("zz first words", author=OWNER, channel_id=DM)
            await eventually(lambda: len(answers()) == 1, timeout=30, what="the first answer")
            await daemon.kill()  # well within the positions' periodic save
            await discord.push_message("zz while it was down", author=OWNER, channel_id=DM,
                                       dispatch=False)  # fmt: skip
            discord.connected.clear()
            daemon = Daemon(config, state, env)
            await daemon.start()
            await eventually(lambda: len(answers()) == 2, timeout=30, what="the read-back answer")
            await discord.push_message("zz and after", author=OWNER, channel_id=DM)
            await eventually(lambda: len(answers()) == 3, timeout=30, what="the last answer")
        finally:
            assert await daemon.stop() == 0
    assert len(answers()) == 3
