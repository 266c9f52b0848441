"""A daemon with the console on, sign-in links, and a signed-in HTTP client: what the
console's tests share (the browser tests drive the same daemon with Chromium)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from echo_bot.console.auth import ConsoleUser, link_url, new_link
from tests.conftest import Bot, running_bot

CONSOLE = """
[http]
port = 0
[console]
enabled = true
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""

TELEGRAM_APPROVERS = """
[telegram]
allowed_users = [1, 2, 3]
approvers = [1, 3]
"""

APPEND_X = '/tool file_write {"path": "count.txt", "content": "x", "append": true}'
OWNER = ConsoleUser(channel="echo-bot", id="alice", name="alice")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@asynccontextmanager
async def console_bot(state_dir: Path, extra: str = "") -> AsyncIterator[Bot]:
    """A running daemon with the console on (and the CLI chat as its channel)."""
    async with running_bot(state_dir, CONSOLE + extra) as bot:
        yield bot


def base_url(bot: Bot) -> str:
    http = bot.daemon.http
    assert http is not None and http.port
    return f"http://127.0.0.1:{http.port}"


async def sign_in_link(bot: Bot, user: ConsoleUser = OWNER, ttl: float = 600) -> str:
    """A one-time sign-in URL for ``user``, made as ``echo-bot console link`` makes it."""
    secret = await bot.store.run(lambda tx: new_link(tx, user, ttl))
    return link_url(base_url(bot), secret)


def link_secret(url: str) -> str:
    return url.split("?t=", 1)[1]


@asynccontextmanager
async def client(bot: Bot) -> AsyncIterator[aiohttp.ClientSession]:
    """A browser-like HTTP client of the console (its own cookie jar, no redirects
    followed unless asked)."""
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1
    async with aiohttp.ClientSession(base_url(bot), cookie_jar=jar) as session:
        yield session


async def sign_in(session: aiohttp.ClientSession, link: str) -> aiohttp.ClientResponse:
    """Open the link's page and press its Sign in button, as a browser does."""
    secret = link_secret(link)
    async with session.get(f"/console/login?t={secret}") as page:
        assert page.status == 200
    return await session.post(
        "/console/login",
        data={"t": secret, "next": "/console/"},
        headers={"Origin": str(session._base_url)},
        allow_redirects=False,
    )


async def signed_in(bot: Bot, session: aiohttp.ClientSession, user: ConsoleUser = OWNER) -> str:
    """Sign ``session`` in as ``user``; the CSRF token of its forms."""
    response = await sign_in(session, await sign_in_link(bot, user))
    assert response.status == 303, await response.text()
    async with session.get("/console/") as page:
        assert page.status == 200
        found = CSRF.search(await page.text())
    assert found is not None
    return found.group(1)


async def decide(
    session: aiohttp.ClientSession, request_id: str, verb: str, csrf: str
) -> aiohttp.ClientResponse:
    return await session.post(
        f"/console/approvals/{request_id}",
        data={"csrf": csrf, "verb": verb},
        headers={"Origin": str(session._base_url)},
        allow_redirects=True,
    )


async def queue_event(stream: aiohttp.ClientResponse) -> str:
    """The data of the next ``queue`` event."""
    data: list[str] = []
    kind = ""
    while True:
        line = (await stream.content.readline()).decode()
        if line.startswith("event: "):
            kind = line[7:].strip()
        elif line.startswith("data: "):
            data.append(line[6:].rstrip("\n"))
        elif line == "\n" and kind == "queue":
            return "\n".join(data)
        elif line == "\n":
            data, kind = [], ""
        elif not line:
            raise AssertionError("the stream ended")
