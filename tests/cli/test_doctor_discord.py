"""`echo-bot check-config` and `echo-bot doctor` for Discord as the user runs them (a
subprocess), against the fake Discord (tests/fakes/discord_api.py) reached through
``[discord] proxy``: whose token, the Message Content intent, the listed guilds; a
wrong token, an intent off, a guild the bot is not in, Discord away — each said."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cli.test_doctor_checks import check_config, doctor, line
from tests.fakes.discord_api import FakeDiscord

pytest.importorskip("discord")
GUILD, MISSING = "1300000000000000001", "1300000000000000009"


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as made:
        made.add_guild(GUILD, ["1300000000000000002"])
        yield made


def config(tmp_path: Path, fake: FakeDiscord, extra: str = "") -> tuple[str, ...]:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[discord]\nenabled = true\nproxy = "{fake.proxy_url}"\nca_file = "{fake.ca_file}"\n'
        f'allowed_users = ["1100000000000000001"]\n{extra}'
    )
    return ("--config", str(path), "--state-dir", str(tmp_path / "s"))


async def test_doctor_names_the_bot_its_intents_and_its_guilds(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    args = config(tmp_path, fake, f'guilds = ["{GUILD}"]\nmessage_content = true\n')
    code, out = await doctor(*args, DISCORD_BOT_TOKEN=fake.token)
    assert code == 0, out
    assert line(out, "discord token").startswith("[  ok]") and "1000000000000000001" in out
    assert line(out, "discord intents").startswith("[  ok]")
    assert line(out, "discord guilds").startswith("[  ok]") and GUILD in out
    assert fake.token not in out


async def test_doctor_fails_on_a_wrong_token_an_intent_off_and_a_missing_guild(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    code, out = await doctor(*config(tmp_path, fake), DISCORD_BOT_TOKEN="MTAx.wrong.token")
    assert code == 1 and "Reset Token" in line(out, "discord token"), out
    assert "MTAx.wrong.token" not in out
    fake.app_flags = 0
    args = config(tmp_path, fake, f'guilds = ["{GUILD}", "{MISSING}"]\nmessage_content = true\n')
    code, out = await doctor(*args, DISCORD_BOT_TOKEN=fake.token)
    assert code == 1, out
    assert line(out, "discord intents").startswith("[FAIL]") and "Privileged" in out
    guilds = line(out, "discord guilds")
    assert guilds.startswith("[FAIL]") and MISSING in guilds and "oauth2/authorize" in guilds


async def test_doctor_says_discord_cannot_be_reached(tmp_path: Path, fake: FakeDiscord) -> None:
    path = tmp_path / "away.toml"
    path.write_text(
        f'[discord]\nenabled = true\nproxy = "http://127.0.0.1:1"\nca_file = "{fake.ca_file}"\n'
    )
    code, out = await doctor("--config", str(path), "--state-dir", str(tmp_path / "s"),
                             DISCORD_BOT_TOKEN=fake.token)  # fmt: skip
    assert code == 1 and "cannot reach Discord" in line(out, "discord api"), out


def test_check_config_says_what_discord_needs(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[discord]\nenabled = true\nallowed_users = ["1100000000000000001"]\n')
    done = check_config(path)
    assert done.returncode == 2 and "DISCORD_BOT_TOKEN is not set" in done.stderr, done.stderr
    done = check_config(path, DISCORD_BOT_TOKEN="a" * 32)
    assert done.returncode == 2 and "client secret" in done.stderr, done.stderr
    done = check_config(path, DISCORD_BOT_TOKEN="MTAx.Gx.abc")
    assert done.returncode == 0, done.stderr
    assert "discord" in done.stdout and "the gateway" in done.stdout, done.stdout


async def test_doctor_with_a_ca_file_that_is_no_certificate_says_so_and_goes_on(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    """Doctor died with an SSLError traceback on a ca_file that is not PEM: each of its
    checks said nothing. It names the key, and a channel's check that fails is a failed
    check of that channel, the others still said."""
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    args = config(tmp_path, fake)
    path = Path(args[1])
    path.write_text(path.read_text().replace(str(fake.ca_file), str(garbage)))
    code, out = await doctor(*args, DISCORD_BOT_TOKEN=fake.token)
    assert code == 1 and "Traceback" not in out, out
    assert "holds no PEM certificate" in out and line(out, "discord").startswith("[FAIL]")
    assert "store" in out  # the core's checks are still said
