"""What ``echo-bot doctor`` checks of Discord, over REST only (no gateway session is
opened): the token is a bot's (whose), the Message Content intent is on for the
application when ``[discord] message_content`` asks for it, and the bot is in each
listed guild. Every request bounded; the token goes in a header only."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import discord

from channels.parts import tls_context
from echo_bot.bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnosis

from .client import intents_of
from .settings import DiscordConfig

TIMEOUT = 15.0
# Read messages, send them, in threads too, attach files, read history (the catch-up).
PERMISSIONS = 1024 + 2048 + 274877906944 + 32768 + 65536


async def diagnose(
    section: DiscordConfig, environ: Mapping[str, str], state_dir: Path
) -> list[Diagnosis]:
    token = environ.get(section.token_env, "")
    if not token:
        return [Diagnosis("discord token", DIAGNOSIS_FAIL, f"${section.token_env} is not set")]
    client = discord.Client(
        intents=intents_of(section), proxy=section.proxy,
        connector=aiohttp.TCPConnector(ssl=tls_context(section.ca_file)),
    )  # fmt: skip
    try:
        async with asyncio.timeout(TIMEOUT):
            return await _checks(section, client, token)
    except discord.LoginFailure:
        text = (
            f"Discord refused ${section.token_env}: copy the bot's token again (developer"
            " portal → Bot → Reset Token)"
        )
        return [Diagnosis("discord token", DIAGNOSIS_FAIL, text)]
    except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
        text = (
            f"cannot reach Discord ({type(exc).__name__} {exc}); `echo-bot run` keeps trying"
            " until it answers"
        )
        return [Diagnosis("discord api", DIAGNOSIS_FAIL, text.replace(token, "***"))]
    finally:
        await client.close()


async def _checks(section: DiscordConfig, client: discord.Client, token: str) -> list[Diagnosis]:
    await client.login(token)
    user = client.user
    assert user is not None
    found = [Diagnosis("discord token", DIAGNOSIS_OK, f"the bot is {user} ({user.id})")]
    app = await client.application_info()
    flags = app.flags
    has_content = flags.gateway_message_content or flags.gateway_message_content_limited
    if section.message_content and not has_content:
        text = (
            "[discord] message_content is on, but the application's Message Content intent"
            " is off: turn it on (developer portal → Bot → Privileged Gateway Intents)"
        )
        found.append(Diagnosis("discord intents", DIAGNOSIS_FAIL, text))
    elif section.message_content:
        found.append(Diagnosis("discord intents", DIAGNOSIS_OK, "Message Content is on"))
    else:
        text = (
            "Message Content off: direct messages, mentions and replies that ping the bot are read"
        )
        found.append(Diagnosis("discord intents", DIAGNOSIS_OK, text))
    guilds = {str(g.id): g.name async for g in client.fetch_guilds(limit=None)}  # all pages
    invite = (
        f"https://discord.com/oauth2/authorize?client_id={app.id}&scope=bot"
        f"&permissions={PERMISSIONS}"
    )
    missing = [g for g in section.guilds or [] if g not in guilds]
    if missing:
        text = f"the bot is not in guild(s) {', '.join(missing)}: invite it with {invite}"
        found.append(Diagnosis("discord guilds", DIAGNOSIS_FAIL, text))
    elif not guilds:
        text = f"the bot is in no guild (direct messages only); to add it to one: {invite}"
        found.append(Diagnosis("discord guilds", DIAGNOSIS_WARN, text))
    else:
        names = ", ".join(f"{name} ({gid})" for gid, name in list(guilds.items())[:10])
        found.append(Diagnosis("discord guilds", DIAGNOSIS_OK, f"in {names}"))
    return found
