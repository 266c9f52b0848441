"""`echo-bot run` as a real process outliving its peers' bad minutes: the network to the
homeserver (a real Synapse) or to Slack (the fake) is taken away by a TCP proxy in front
of it and brought back. The daemon keeps running, /healthz says what is away, the
channel reconnects by itself, and what people sent meanwhile is answered once. A start
while the peer cannot be reached, or answers 503, runs too (exit status 2 is for what
the user must fix, which systemd's unit does not restart)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from echo_bot.brains.rules import no_match_hint
from tests.channels.contract.drivers import SLACK_DM, SLACK_OWNER
from tests.channels.test_matrix_process import people
from tests.conftest import echo_bot_env
from tests.fakes.slack_api import FakeSlack
from tests.fakes.tcp_proxy import TcpProxy
from tests.matrix_people import Person
from tests.matrix_server import Synapse
from tests.ports import free_port
from tests.proc import Daemon
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # echo-bot processes

AWAY = 8.0  # seconds the peer is away: past nio's own retries and the first backoffs


async def health(port: int, channel: str) -> str:
    """The channel's status on the daemon's /healthz."""
    url = f"http://127.0.0.1:{port}/healthz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body = await response.json()
    return str(body["components"][channel]["status"])


async def until_health(port: int, channel: str, healthy: bool) -> None:
    async def reached() -> bool:
        return (await health(port, channel) == "ok") == healthy

    what = f"{channel} {'ok' if healthy else 'not ok'} on /healthz"
    await eventually(reached, timeout=90, what=what)


# -- Matrix ---------------------------------------------------------------------------------
@pytest.fixture
async def room(synapse: Synapse, tmp_path: Path) -> AsyncIterator[tuple[Person, str, str]]:
    """The owner, an encrypted room the bot's account is invited to, and that account."""
    async with people(synapse, tmp_path) as (bot, owner, room_id):
        yield owner, room_id, bot.user_id


def matrix_config(tmp_path: Path, homeserver: str, bot: str, owner: Person, port: int) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(f"""
[matrix]
enabled = true
homeserver = "{homeserver}"
user_id = "{bot}"
password_env = "MATRIX_PASSWORD"
allowed_users = ["{owner.user_id}"]
[http]
enabled = true
port = {port}
""")
    return config


def answers(owner: Person, room_id: str, bot: str) -> int:
    return sum(1 for t in owner.received(room_id, bot) if t == no_match_hint("!"))


async def bot_ready(owner: Person, room_id: str, bot: str) -> None:
    def joined_and_known() -> bool:
        joined = owner.client.rooms.get(room_id)
        devices = list(owner.client.device_store.active_user_devices(bot))
        return bool(joined and bot in joined.users and devices)

    await eventually(joined_and_known, timeout=60, what="the bot joined, its device known")


async def test_matrix_first_login_with_the_homeserver_away_then_an_outage_answers_all_once(
    synapse: Synapse, room: tuple[Person, str, str], tmp_path: Path
) -> None:
    """The first start logs in with a password while the homeserver cannot be reached
    (the daemon runs and logs in once it answers); later the homeserver goes away for a
    while, and what the owner said meanwhile is answered once when it is back."""
    owner, room_id, bot = room
    port = free_port()
    async with TcpProxy(int(synapse.url.rsplit(":", 1)[1])) as proxy:
        await proxy.cut()
        config = matrix_config(tmp_path, f"http://{proxy.origin}", bot, owner, port)
        env = echo_bot_env(MATRIX_PASSWORD="bot-password")
        daemon = Daemon(config, tmp_path / "state", env)
        await daemon.start()
        try:
            await until_health(port, "matrix", False)
            await asyncio.sleep(AWAY)
            assert daemon.proc is not None and daemon.proc.returncode is None
            assert not (tmp_path / "state" / "matrix" / "login.json").exists()
            await proxy.restore()
            await until_health(port, "matrix", True)
            assert (tmp_path / "state" / "matrix" / "login.json").exists()
            await bot_ready(owner, room_id, bot)
            await owner.say(room_id, "first words")
            await eventually(lambda: answers(owner, room_id, bot) == 1, timeout=60,
                             what="the first answer")  # fmt: skip

            await proxy.cut()
            await until_health(port, "matrix", False)
            await owner.say(room_id, "said while the bot is away")
            await asyncio.sleep(AWAY)
            await proxy.restore()
            await eventually(lambda: answers(owner, room_id, bot) == 2, timeout=90,
                             what="the answer to what was said meanwhile")  # fmt: skip
            await until_health(port, "matrix", True)
            await owner.say(room_id, "and after")
            await eventually(lambda: answers(owner, room_id, bot) == 3, timeout=60,
                             what="the last answer")  # fmt: skip
            assert daemon.said("matrix: cannot reach")
            assert not daemon.said("Traceback")
            # nio's line per event is debug detail (README: routine library lines).
            chatty = [line for line in daemon.lines if " INFO nio" in line]
            assert not chatty, chatty[:3]
        finally:
            assert await daemon.stop() == 0
    assert answers(owner, room_id, bot) == 3


# -- Slack ----------------------------------------------------------------------------------
@pytest.mark.parametrize("failure", ["unreachable", "503"])
async def test_slack_away_at_start_runs_and_connects_when_slack_answers(
    failure: str, tmp_path: Path
) -> None:
    port = free_port()
    async with FakeSlack() as slack, TcpProxy(int(slack.origin.rsplit(":", 1)[1])) as proxy:
        slack.socket_origin = proxy.origin
        if failure == "unreachable":
            await proxy.cut()
        else:
            slack.fail_next("auth.test", status=503, error="service_unavailable", count=3)
        config = tmp_path / "config.toml"
        config.write_text(f"""
[slack]
enabled = true
api_base = "http://{proxy.origin}/api/"
allowed_users = ["{SLACK_OWNER}"]
[http]
enabled = true
port = {port}
""")
        env = echo_bot_env(SLACK_BOT_TOKEN=slack.bot_token, SLACK_APP_TOKEN=slack.app_token)
        daemon = Daemon(config, tmp_path / "state", env)
        await daemon.start()
        try:
            assert await health(port, "slack") != "ok"
            await proxy.restore()
            await eventually(lambda: slack.connections == 1, timeout=60, what="connected")
            await until_health(port, "slack", True)
            said = await slack.push_message("zz hello", user=SLACK_OWNER)
            await slack.wait_acked(said, timeout=30)

            def answered() -> int:
                return sum(1 for m in slack.messages.get(SLACK_DM, [])
                           if m.get("text") == no_match_hint("!"))  # fmt: skip

            await eventually(lambda: answered() == 1, timeout=30, what="the answer")
            assert daemon.proc is not None and daemon.proc.returncode is None
            assert daemon.said("slack: cannot reach") or daemon.said("failed on its side")
            assert not daemon.said("Traceback")
        finally:
            assert await daemon.stop() == 0
