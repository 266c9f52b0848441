"""Reminders through the real core and real APScheduler: set in a chat (rules brain,
commands, tools), confirmed with the absolute time, delivered a few seconds later to the
chat they belong to — once — and refused clearly when the input is bad."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from echo_bot.events import (
    Address,
    MessageInbound,
    OutboundMessage,
    Sender,
    ToolCallInbound,
    ToolCallRequest,
    new_id,
)
from tests.conftest import Bot, running_bot

# Each test runs on SQLite and on a real PostgreSQL server.
pytestmark = pytest.mark.usefixtures("on_both_engines")


ID = re.compile(r"\(id ([0-9a-f]{8})\)")
# "Monday 30 November 2026 at 09:28 (UTC)"
ABSOLUTE = re.compile(r"(\w+day \d{1,2} \w+ \d{4}) at (\d{2}:\d{2}) \(([\w/]+)\)")


# -- helpers ------------------------------------------------------------------------------
async def ask(bot: Bot, text: str, chat: str = "local") -> str:
    inbound = await bot.channel.say(text, chat=chat)
    return (await bot.channel.reply_to(inbound)).text


def reminder_id(confirmation: str) -> str:
    match = ID.search(confirmation)
    assert match, confirmation
    return match.group(1)


def absolute(confirmation: str) -> tuple[datetime, str]:
    """The absolute time a confirmation names, and its timezone."""
    match = ABSOLUTE.search(confirmation)
    assert match, confirmation
    zone = match.group(3)
    moment = datetime.strptime(f"{match.group(1)} {match.group(2)}", "%A %d %B %Y %H:%M")
    return moment.replace(tzinfo=ZoneInfo(zone)), zone


def minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def reminders_for(bot: Bot, rid: str) -> list[OutboundMessage]:
    return [
        m for m in bot.channel.sent if m.kind == "reminder" and m.metadata["reminder_id"] == rid
    ]


async def arrival(bot: Bot, rid: str, timeout: float = 10.0) -> OutboundMessage:
    return await bot.channel.wait_for(
        lambda m: m.kind == "reminder" and m.metadata.get("reminder_id") == rid, timeout
    )


async def active_count(bot: Bot) -> int:
    return len(await bot.store.run(lambda tx: tx.reminders.active()))


async def create(bot: Bot, text: str, when: str, chat: str = "local", **extra: str) -> str:
    args = {"text": text, "when": when, **extra}
    return await ask(bot, f"/tool reminder_create {json.dumps(args)}", chat)


# -- delivery -----------------------------------------------------------------------------
async def test_reminder_is_confirmed_and_arrives_once_in_the_same_chat(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        before = datetime.now(UTC)
        confirmation = await ask(bot, "remind me in 2 seconds to stretch")
        after = datetime.now(UTC)
        assert confirmation.startswith("OK, I will remind you ")
        assert "“stretch”" in confirmation
        moment, zone = absolute(confirmation)
        assert zone == "UTC"
        assert minute(before + timedelta(seconds=2)) <= moment
        assert moment <= minute(after + timedelta(seconds=2))
        rid = reminder_id(confirmation)

        reminder = await arrival(bot, rid)
        assert reminder.text == "⏰ stretch"
        assert reminder.to == bot.channel.address("local")
        assert reminder.metadata["late_by"] >= 0  # never early

        # Once: a reminder set afterwards arrives later; the first has not come again.
        sentinel = reminder_id(await create(bot, "sentinel", "in 2 seconds"))
        await arrival(bot, sentinel)
        assert len(reminders_for(bot, rid)) == 1
        assert await ask(bot, "/reminders") == "No reminders are set here."


async def test_two_chats_get_their_own_reminders(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        tea = reminder_id(await ask(bot, "/remind in 2 seconds tea", chat="alice"))
        coffee = reminder_id(await ask(bot, "/remind in 2 seconds coffee", chat="bob"))
        got_tea, got_coffee = await arrival(bot, tea), await arrival(bot, coffee)
        assert (got_tea.to.chat_id, got_tea.text) == ("alice", "⏰ tea")
        assert (got_coffee.to.chat_id, got_coffee.text) == ("bob", "⏰ coffee")
        reminders = [m for m in bot.channel.sent if m.kind == "reminder"]
        assert sorted((m.to.chat_id, m.text) for m in reminders) == [
            ("alice", "⏰ tea"),
            ("bob", "⏰ coffee"),
        ]


async def test_reminder_keeps_the_thread_it_was_asked_in(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        assert bot.channel.bus is not None
        where = Address(channel="cli", chat_id="group", thread_id="42")
        published = await bot.channel.bus.publish(
            MessageInbound(
                address=where,
                sender=Sender(id="owner"),
                text="/remind in 2 seconds standup",
                external_id=new_id(),
            )
        )
        confirmation = await bot.channel.reply_to(published.inbound_id)
        reminder = await arrival(bot, reminder_id(confirmation.text))
        assert reminder.to == where
        assert reminder.text == "⏰ standup"


async def test_tool_call_with_reply_to_delivers_there(state_dir: Path) -> None:
    """As a webhook or cron job would: the reminder goes to the deliver_to chat."""
    async with running_bot(state_dir) as bot:
        assert bot.channel.bus is not None
        target = bot.channel.address("ops")
        published = await bot.channel.bus.publish(
            ToolCallInbound(
                tool_call=ToolCallRequest(
                    tool="reminder_create",
                    args={"text": "check the deploy", "when": "in 2 seconds"},
                ),
                address=Address(channel="webhook", chat_id="ci"),
                deliver_to=target,
                sender=Sender(id="ci", name="ci"),
                external_id=new_id(),
            )
        )
        confirmation = await bot.channel.reply_to(published.inbound_id)
        assert confirmation.to == target
        assert "OK, I will remind you" in confirmation.text
        reminder = await arrival(bot, reminder_id(confirmation.text))
        assert reminder.to == target
        assert reminder.text == "⏰ check the deploy"
        listed = await ask(bot, "/reminders", chat="ops")
        assert listed == "No reminders are set here."


# -- listing and cancelling ---------------------------------------------------------------
async def test_reminders_lists_ids_and_absolute_times(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        first = await ask(bot, "remind me tomorrow at 9am to call the bank")
        second = await ask(bot, "every day at 21:00 remind me to read")
        listing = await ask(bot, "/reminders")
        assert listing.startswith("2 reminder(s):")
        for confirmation, text in ((first, "call the bank"), (second, "read")):
            moment, _ = absolute(confirmation)
            line = next(x for x in listing.splitlines() if reminder_id(confirmation) in x)
            day = ABSOLUTE.search(confirmation).group(1)  # type: ignore[union-attr]
            assert f"{day} {moment:%H:%M} UTC" in line  # the day as the confirmation says it
            assert line.endswith(f": {text}")
        assert "repeats (0 21 * * *)" in listing
        assert "every day at 21:00 (UTC)" in second


async def test_cancelled_reminder_never_fires(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        rid = reminder_id(await create(bot, "tea", "in 2 seconds"))
        cancelled = await ask(bot, f"/cancel {rid}")
        assert cancelled == f"Cancelled reminder {rid}: “tea”."
        assert await ask(bot, "/reminders") == "No reminders are set here."
        # A reminder due after the cancelled one arrives; the cancelled one did not.
        sentinel = reminder_id(await create(bot, "sentinel", "in 3 seconds"))
        await arrival(bot, sentinel)
        assert reminders_for(bot, rid) == []
        again = await ask(bot, f"/cancel {rid}")
        assert f"Reminder {rid} is already cancelled" in again


async def test_cancelling_another_chats_reminder_is_refused_without_revealing_it(
    state_dir: Path,
) -> None:
    async with running_bot(state_dir) as bot:
        rid = reminder_id(await create(bot, "secret plan", "in 2 seconds", chat="alice"))
        refused = await ask(bot, f"/cancel {rid}", chat="mallory")
        assert f"There is no reminder {rid} in this chat" in refused
        assert "secret plan" not in refused
        assert "alice" not in refused
        assert await ask(bot, "/reminders", chat="mallory") == "No reminders are set here."
        reminder = await arrival(bot, rid)  # still alice's, still delivered
        assert reminder.to.chat_id == "alice"
        assert reminder.text == "⏰ secret plan"


async def test_cancel_without_an_id_explains_usage(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        assert "Usage: /cancel ID" in await ask(bot, "/cancel")
        assert "There is no reminder 12345678 in this chat" in await ask(bot, "/cancel 12345678")


# -- bad input ----------------------------------------------------------------------------
async def test_bad_input_gets_a_clear_answer_and_no_reminder(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        empty = await create(bot, "   ", "in 5 minutes")
        assert "The text is empty" in empty
        past = await create(bot, "tea", "yesterday at 9:00")
        assert "is in the past" in past
        unreadable = await create(bot, "tea", "blorp flarp")
        assert "I could not read a time in “blorp flarp”" in unreadable
        far = await create(bot, "tea", "in 10 years")
        assert "more than 5 years" in far
        no_time = await create(bot, "tea", "tomorrow")
        assert "At what time tomorrow?" in no_time
        command = await ask(bot, "/remind blorp flarp zork tea")
        assert "I could not read a time" in command
        assert "Usage: /remind WHEN TEXT" in await ask(bot, "/remind tea")
        bad_repeat = await ask(
            bot, '/tool reminder_create {"text": "tea", "recurrence": "every blue moon"}'
        )
        assert "could not read a repetition" in bad_repeat
        bad_cron = await ask(
            bot, '/tool reminder_create {"text": "tea", "recurrence": "61 * * * *"}'
        )
        assert "That schedule is not valid" in bad_cron
        for reply in (empty, past, unreadable, far, no_time, bad_repeat, bad_cron):
            assert "OK, I will remind you" not in reply
            assert reply.startswith("⚠️ INVALID_PARAMETER")
        assert await active_count(bot) == 0


async def test_unknown_timezones_are_refused(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        reply = await ask(bot, "/timezone Mars/Olympus")
        assert "Unknown timezone “Mars/Olympus”" in reply
        assert "This chat uses UTC" in await ask(bot, "/timezone")
        via_tool = await create(bot, "tea", "in 5 minutes", timezone="Mars/Olympus")
        assert "Unknown timezone “Mars/Olympus”" in via_tool
        for folder in ("Europe", "America/Argentina"):  # folders of the database, no zones
            assert f"Unknown timezone “{folder}”" in await ask(bot, f"/timezone {folder}")
            assert f"Unknown timezone “{folder}”" in await create(
                bot, "tea", "in 5 minutes", timezone=folder
            )
        assert await active_count(bot) == 0


async def test_chat_timezone_changes_the_confirmation(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        assert "now uses Europe/Berlin" in await ask(bot, "/timezone Europe/Berlin")
        before = datetime.now(UTC)
        confirmation = await ask(bot, "remind me in 10 minutes to stretch")
        after = datetime.now(UTC)
        moment, zone = absolute(confirmation)
        assert zone == "Europe/Berlin"
        assert minute(before + timedelta(minutes=10)) <= moment
        assert moment <= minute(after + timedelta(minutes=10))
        listing = await ask(bot, "/reminders")
        berlin = moment.astimezone(ZoneInfo("Europe/Berlin"))
        day = ABSOLUTE.search(confirmation).group(1)  # type: ignore[union-attr]
        assert f"{day} {berlin:%H:%M} Europe/Berlin" in listing
        # Another chat keeps the bot's timezone.
        other = await ask(bot, "remind me in 10 minutes to stretch", chat="other")
        assert absolute(other)[1] == "UTC"
        # The tool's own timezone argument wins for one reminder.
        tokyo = await create(bot, "sushi", "in 10 minutes", timezone="Asia/Tokyo")
        assert absolute(tokyo)[1] == "Asia/Tokyo"


async def test_the_per_chat_cap_gives_a_clear_message(state_dir: Path) -> None:
    async with running_bot(state_dir, "[scheduler]\nmax_active_per_chat = 3\n") as bot:
        ids = [reminder_id(await create(bot, f"r{n}", "in 1 hour")) for n in range(3)]
        fourth = await create(bot, "r3", "in 1 hour")
        assert "already has 3 active reminders" in fourth
        assert "/cancel" in fourth
        assert (await ask(bot, "/reminders")).startswith("3 reminder(s):")
        # Other chats have their own cap; a cancelled reminder frees a place.
        assert "OK, I will remind you" in await create(bot, "mine", "in 1 hour", chat="other")
        await ask(bot, f"/cancel {ids[0]}")
        assert "OK, I will remind you" in await create(bot, "r3", "in 1 hour")


# -- the rules brain understands the issue's phrases --------------------------------------
async def test_rules_brain_reads_each_phrase_of_the_issue(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        now = datetime.now(UTC)

        reply = await ask(bot, "remind me in 10 minutes to stretch")
        moment, zone = absolute(reply)
        assert zone == "UTC" and "“stretch”" in reply
        assert minute(now + timedelta(minutes=10)) <= moment
        assert moment <= minute(datetime.now(UTC) + timedelta(minutes=10))

        reply = await ask(bot, "remind me at 17:30 to leave")
        today = datetime.now(UTC)
        if (today.hour, today.minute) < (17, 30):
            moment, _ = absolute(reply)
            assert (moment.date(), moment.hour, moment.minute) == (today.date(), 17, 30)
            assert "“leave”" in reply
        else:  # already past today: a question, never a silent guess
            assert "17:30 has already passed today. Did you mean tomorrow?" in reply

        reply = await ask(bot, "remind me tomorrow at 9am to call the bank")
        moment, _ = absolute(reply)
        tomorrow = {
            (now + timedelta(days=1)).date(),
            (datetime.now(UTC) + timedelta(days=1)).date(),
        }
        assert moment.date() in tomorrow and (moment.hour, moment.minute) == (9, 0)
        assert "“call the bank”" in reply

        reply = await ask(bot, "remind me on friday at noon to pay the rent")
        moment, _ = absolute(reply)
        assert moment.strftime("%A") == "Friday" and (moment.hour, moment.minute) == (12, 0)
        assert now < moment <= now + timedelta(days=7, hours=12)
        assert "“pay the rent”" in reply

        reply = await ask(bot, "every weekday at 8:30 remind me to stand up")
        assert "every weekday at 08:30 (UTC); first on" in reply
        first, _ = absolute(reply)
        assert first.weekday() < 5 and (first.hour, first.minute) == (8, 30)
        assert now < first <= now + timedelta(days=3, hours=9)
        assert "“stand up”" in reply

        reply = await ask(bot, "every day at 21:00 remind me to take the pills")
        assert "every day at 21:00 (UTC); first on" in reply
        first, _ = absolute(reply)
        assert now < first <= now + timedelta(days=1)
        assert "“take the pills”" in reply

        listing = await ask(bot, "/reminders")
        assert "repeats (30 8 * * 1-5)" in listing and "repeats (0 21 * * *)" in listing


async def test_remind_command_reads_when_then_text(state_dir: Path) -> None:
    async with running_bot(state_dir) as bot:
        before = datetime.now(UTC)
        reply = await ask(bot, "/remind tomorrow 9:00 call the bank")
        moment, _ = absolute(reply)
        assert (moment.hour, moment.minute) == (9, 0)
        tomorrow = {(t + timedelta(days=1)).date() for t in (before, datetime.now(UTC))}
        assert moment.date() in tomorrow
        assert "“call the bank”" in reply
        recurring = await ask(bot, "/remind every weekday at 8:30 stand up")
        assert "every weekday at 08:30" in recurring and "“stand up”" in recurring
