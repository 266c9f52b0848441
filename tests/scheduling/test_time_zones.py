""" "What time is it?" answers in the zone asked for: the chat's own (``/timezone``) by
default, or the city or zone named in the question; an unknown place is said so."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from echo_bot.events import Address
from echo_bot.scheduling.reminders import ReminderService
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store
from tests.brains.test_llm_brain import ask, llm_bot, tool_messages
from tests.conftest import run_echo_bot

ANSWER = re.compile(
    r"^It is \w+ \d+ \w+ \d{4}, \d\d:\d\d \((?P<zone>[\w/+-]+), UTC[+-]\d\d:\d\d\)\.$"
)


def chat(tmp_path: Path, *lines: str) -> list[str]:
    """``echo-bot chat`` with piped lines, as a user scripts it; its stdout lines."""
    result = run_echo_bot(
        "chat", "--state-dir", str(tmp_path / "st"), input="".join(f"{line}\n" for line in lines)
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def zone_of(line: str) -> str:
    match = ANSWER.match(line)
    assert match, line
    return match.group("zone")


def test_what_time_is_it_answers_in_the_timezone_the_chat_set(tmp_path: Path) -> None:
    out = chat(tmp_path, "/timezone Asia/Tokyo", "what time is it?")
    assert out[0] == "This chat now uses Asia/Tokyo for times."
    assert zone_of(out[1]) == "Asia/Tokyo"
    assert out[1].endswith("(Asia/Tokyo, UTC+09:00).")


def test_a_chat_that_changes_its_timezone_gets_the_new_one_at_once(tmp_path: Path) -> None:
    out = chat(
        tmp_path,
        "what time is it?",
        "/timezone Asia/Tokyo",
        "what time is it?",
        "/timezone America/New_York",
        "what time is it?",
    )
    assert [zone_of(out[0]), zone_of(out[2]), zone_of(out[4])] == [
        "UTC",
        "Asia/Tokyo",
        "America/New_York",
    ]


async def test_a_zone_read_under_way_when_the_chat_changes_zone_does_not_bring_back_the_old(
    tmp_path: Path,
) -> None:
    store = Store(Database(tmp_path / "s.sqlite3"), Masker())
    await store.open()
    try:
        service = ReminderService(store, timezone="UTC", languages=["en"], max_active=10)
        chat_ = Address(channel="cli", chat_id="local")
        reading = asyncio.create_task(service.timezone_for(chat_))
        await asyncio.sleep(0)  # the read is queued ahead of the change, in one commit
        assert (await service.set_timezone(chat_, "Asia/Tokyo")).ok
        assert await reading == "UTC"
        assert await service.timezone_for(chat_) == "Asia/Tokyo"
    finally:
        await store.close()


def test_what_time_is_it_in_a_named_city_answers_in_that_citys_zone(tmp_path: Path) -> None:
    out = chat(
        tmp_path,
        "what time is it in Tokyo?",
        "What's the time in New York right now?",
        "what time is it in sao paulo",
        "what time is it in Europe/Berlin?",
    )
    assert [zone_of(line) for line in out[:4]] == [
        "Asia/Tokyo",
        "America/New_York",
        "America/Sao_Paulo",
        "Europe/Berlin",
    ]


def test_a_named_city_wins_over_the_chats_timezone(tmp_path: Path) -> None:
    out = chat(tmp_path, "/timezone Europe/Berlin", "what time is it in Tokyo?", "what time is it?")
    assert zone_of(out[1]) == "Asia/Tokyo"
    assert zone_of(out[2]) == "Europe/Berlin"


def test_what_time_is_it_in_an_unknown_place_says_so_instead_of_answering_utc(
    tmp_path: Path,
) -> None:
    out = chat(tmp_path, "what time is it in Atlantis?")
    assert not ANSWER.match(out[0]), out
    assert "Atlantis" in out[0] and "unknown" in out[0], out


async def test_the_llms_current_time_call_without_a_zone_uses_the_chats_timezone(
    state_dir: Path,
) -> None:
    async with llm_bot(state_dir) as (llm, bot):
        assert (await ask(bot, "/timezone Asia/Tokyo")).text.endswith("Asia/Tokyo for times.")
        llm.tool_calls([("current_time", {}, "call_clock")])
        llm.reply("done")
        assert (await ask(bot, "what time is it?")).text == "done"
        [result] = tool_messages(llm.chat_requests()[-1])
        assert "(Asia/Tokyo, UTC+09:00)" in result["content"]


async def test_the_llm_may_name_a_city_for_current_time(state_dir: Path) -> None:
    async with llm_bot(state_dir) as (llm, bot):
        llm.tool_calls([("current_time", {"timezone": "New York"}, "call_clock")])
        llm.reply("done")
        assert (await ask(bot, "what time is it in New York?")).text == "done"
        [result] = tool_messages(llm.chat_requests()[-1])
        assert "(America/New_York, UTC-0" in result["content"]
