"""The fake Discord (tests/fakes/discord_api.py) against the real discord.py: the client
reaches it as it reaches Discord, through a proxy that ends TLS with a certificate the
client's connector trusts, and the gateway and REST calls behave as Discord documents
them — so that the channel's tests rest on a peer that is right."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakes.discord_api import BOT_ID, FakeDiscord, dm_of, user
from tests.waiting import eventually

discord = pytest.importorskip("discord")

OWNER = user("1100000000000000001", "owner")


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as made:
        yield made


class Client:
    """A discord.py client on the fake, its messages in a queue."""

    def __init__(self, fake: FakeDiscord, token: str | None = None) -> None:
        self.token = token or fake.token
        intents = discord.Intents(guilds=True, dm_messages=True, guild_messages=True,
                                  message_content=True)  # fmt: skip
        context = ssl.create_default_context(cafile=str(fake.ca_file))
        self.client = discord.Client(
            intents=intents, proxy=fake.proxy_url,
            connector=aiohttp.TCPConnector(ssl=context), guild_ready_timeout=0.1,
        )  # fmt: skip
        self.messages: asyncio.Queue[Any] = asyncio.Queue()
        self.ready = asyncio.Event()
        self.client.event(self.on_message)
        self.client.event(self.on_ready)
        self.task: asyncio.Task[None] | None = None

    async def on_message(self, message: Any) -> None:
        await self.messages.put(message)

    async def on_ready(self) -> None:
        self.ready.set()

    async def __aenter__(self) -> Client:
        self.task = asyncio.create_task(self.client.start(self.token))
        await asyncio.wait_for(self.ready.wait(), 15)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


async def test_discord_py_identifies_receives_and_sends_through_the_fake(
    fake: FakeDiscord,
) -> None:
    async with Client(fake) as bot:
        assert bot.client.user.id == int(BOT_ID)
        assert fake.identified == 1 and fake.session is not None
        assert fake.session.intents == bot.client.intents.value
        await fake.push_message("hello", author=OWNER, channel_id=dm_of(OWNER["id"]))
        message = await asyncio.wait_for(bot.messages.get(), 10)
        assert message.content == "hello" and message.author.id == int(OWNER["id"])
        await message.channel.send("hi back")
        [sent] = fake.sent
        assert sent.content == "hi back" and sent.channel_id == dm_of(OWNER["id"])


async def test_a_dropped_gateway_is_resumed_and_what_came_meanwhile_arrives_once(
    fake: FakeDiscord,
) -> None:
    async with Client(fake) as bot:
        await fake.drop_gateway()
        await fake.push_message("while away", author=OWNER, channel_id=dm_of(OWNER["id"]))
        message = await asyncio.wait_for(bot.messages.get(), 20)
        assert message.content == "while away"
        assert fake.resumed == 1 and fake.identified == 1
        await asyncio.sleep(0.5)
        assert bot.messages.empty()


async def test_an_invalidated_session_identifies_anew(fake: FakeDiscord) -> None:
    async with Client(fake) as bot:
        await fake.invalidate()
        await eventually(lambda: fake.identified == 2, timeout=20, what="a new IDENTIFY")
        await fake.connected.wait()
        await fake.push_message("again", author=OWNER, channel_id=dm_of(OWNER["id"]))
        message = await asyncio.wait_for(bot.messages.get(), 10)
        assert message.content == "again"


async def test_a_429_is_waited_out_by_the_client_and_the_message_sent_once(
    fake: FakeDiscord,
) -> None:
    async with Client(fake) as bot:
        fake.rate_limit_next("POST /channels/{id}/messages", retry_after=0.5)
        dm = bot.client.get_partial_messageable(int(dm_of(OWNER["id"])))
        await dm.send("once")
    statuses = [c.status for c in fake.calls_to("POST /channels/{id}/messages")]
    assert statuses == [429, 200]
    assert [s.content for s in fake.sent] == ["once"]


async def test_a_wrong_token_is_refused(fake: FakeDiscord) -> None:
    made = Client(fake, "not-the-token")
    with pytest.raises(discord.LoginFailure):
        await made.client.start(made.token)
    await made.client.close()
