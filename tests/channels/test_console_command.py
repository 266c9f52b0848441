"""/console: an approver asks for a console sign-in link in their own chat with the bot.

The link is a bearer secret, so the tests check where it goes (only that chat) and
where it never goes (the history the model reads, the audit log, the inbox's result),
and that it signs in once, as the one who asked."""

from __future__ import annotations

import getpass
import json
import re
from pathlib import Path

import pytest

from echo_bot.console.auth import sign_in
from echo_bot.events import Address
from echo_bot.store import Tx
from tests.channels.test_telegram import FRIEND, OWNER, reply_to, say, telegram_bot, text_of
from tests.conftest import Bot, running_bot
from tests.fakes.channel import RecordingChannel
from tests.fakes.telegram_api import FakeTelegramAPI

CONSOLE = "[console]\nenabled = true\n"
# The console opens the HTTP server: on any free port where a test sets no [http].
ANY_PORT = "[http]\nport = 0\n"
LINK = re.compile(r"http://127\.0\.0\.1:\d+/console/login\?t=([A-Za-z0-9_-]+)")
# What the history keeps of it (the link itself is kept nowhere).
KEPT = re.compile(r"\(A one-time sign-in link for the console was sent, until \d\d:\d\d UTC\.\)")
HOUR = 3600.0


def kept_text(tx: Tx) -> str:
    """Everything the store keeps of conversations: the history (what the model reads),
    the audit log, and the inbox's results."""
    history = [repr(message) for message in tx.turns.every_message()]
    audit = [json.dumps(row.data, default=str) for row in tx.audit.read(tail=100_000)]
    results = [
        str(tx.inbox.describe(row.id))
        for channel in ("cli", "telegram")
        for row in tx.inbox.recent(channel, limit=10_000)
    ]
    return "\n".join(history + audit + results)


async def assert_kept_nowhere(bot: Bot, secret: str) -> None:
    kept = await bot.store.run(kept_text)
    assert KEPT.search(kept), kept  # the right place
    assert secret not in kept


async def test_in_the_terminal_the_link_is_the_owners_and_kept_only_in_the_outbox(
    state_dir: Path, on_both_engines: str
) -> None:
    async with running_bot(state_dir, CONSOLE + ANY_PORT) as bot:
        helped = await bot.channel.reply_to(await bot.channel.say("/help"))
        assert "/console — a one-time sign-in link to the web console" in helped.text

        before = len(bot.channel.sent)
        await bot.channel.say("/console")
        link = await bot.channel.wait_for(lambda m: LINK.search(m.text) is not None)
        assert link.to == Address(channel="cli", chat_id="local")
        assert "works once" in link.text
        await bot.channel.reply_to(await bot.channel.say("/help"))  # after any other reply
        # One message says it: the link (no second one announcing it).
        said = [m.text for m in bot.channel.sent[before:] if "link for the console" in m.text]
        assert said == [link.text], said
        match = LINK.search(link.text)
        assert match is not None
        secret = match.group(1)
        await assert_kept_nowhere(bot, secret)

        first = await bot.store.run(lambda tx: sign_in(tx, secret, HOUR, "browser"))
        assert first is not None
        owner = getpass.getuser()  # the daemon's login name, not the chat's sender id
        assert first.row.approver == {"channel": "echo-bot", "id": owner, "name": owner}
        assert await bot.store.run(lambda tx: sign_in(tx, secret, HOUR, "again")) is None


@pytest.mark.parametrize("origin", ["webhook", "cron"])
async def test_a_webhook_or_a_job_is_given_no_link(state_dir: Path, origin: str) -> None:
    channel = RecordingChannel(origin)
    async with running_bot(state_dir, CONSOLE + ANY_PORT, channel=channel) as bot:
        reply = await channel.reply_to(await channel.say("/console", sender=f"{origin}:x"))
        assert reply.text.startswith("Console links are given only in a chat with a person")
        assert not [m for m in channel.sent if LINK.search(m.text)]
        assert not [m for m in bot.channel.sent if LINK.search(m.text)]


def links_sent(api: FakeTelegramAPI) -> list[str]:
    return [m.group(1) for text in api.sent_texts() if (m := LINK.search(text))]


async def test_a_telegram_approver_gets_the_link_only_in_their_private_chat(
    state_dir: Path,
) -> None:
    group = -(10**12 + OWNER)
    async with telegram_bot(
        state_dir, CONSOLE, allowed=(OWNER, FRIEND), telegram=f"approvers = [{OWNER}]"
    ) as (bot, api):
        commands = await api.wait_for_call("setMyCommands")
        assert commands.ok
        assert "console" in {c["command"] for c in commands.params["commands"]}

        in_group = say(api, "/console", chat_type="group", chat_id=group)
        refused = await reply_to(api, in_group, "private chat", chat_id=group)
        assert LINK.search(text_of(refused)) is None
        friend = say(api, "/console", user_id=FRIEND)
        await reply_to(api, friend, "Only approvers sign in to the console.", chat_id=FRIEND)
        assert links_sent(api) == []

        say(api, "/console", first_name="Ann", username="ann")
        link = await api.wait_for_call(
            "sendMessage", lambda c: c.ok and LINK.search(text_of(c)) is not None
        )
        assert int(link.params["chat_id"]) == OWNER  # the approver's own chat, nowhere else
        [secret] = links_sent(api)
        await assert_kept_nowhere(bot, secret)

        signed = await bot.store.run(lambda tx: sign_in(tx, secret, HOUR, "browser"))
        assert signed is not None
        assert signed.row.approver == {"channel": "telegram", "id": str(OWNER), "name": "ann"}
        assert await bot.store.run(lambda tx: sign_in(tx, secret, HOUR, "browser")) is None


async def test_no_link_while_the_console_is_off(state_dir: Path) -> None:
    async with telegram_bot(state_dir, telegram=f"approvers = [{OWNER}]") as (_bot, api):
        asked = say(api, "/console")
        await reply_to(api, asked, "The console is off")
        assert links_sent(api) == []


async def test_a_reload_changes_who_gets_a_link_not_whether_the_console_is_served(
    state_dir: Path,
) -> None:
    """The approvers are live; [console] needs a restart, so /console keeps following
    the console the daemon serves: the one it started with."""
    chat = RecordingChannel("telegram")  # Telegram's approvers, without the Bot API
    async with running_bot(
        state_dir, CONSOLE + ANY_PORT + "[telegram]\nallowed_users = [42]\n", channel=chat
    ) as bot:
        await chat.say("/console", chat="42", sender="42")
        link = await chat.wait_for(lambda m: LINK.search(m.text) is not None)
        assert link.to == Address(channel="telegram", chat_id="42")

        (state_dir / "test.toml").write_text(
            "[console]\nenabled = false\n[telegram]\nallowed_users = [7]\n"
        )
        restart = await bot.daemon.reload()
        assert any("console" in change for change in restart), restart
        after = await chat.reply_to(await chat.say("/console", chat="42", sender="42"))
        assert after.text == "Only approvers sign in to the console."
        await chat.say("/console", chat="7", sender="7")
        await chat.wait_for(lambda m: m.to.chat_id == "7" and LINK.search(m.text) is not None)
