"""Budgets for the files people send: a daily budget per sender, a cap on the inbox, the
inbox pruned by retention; through the running daemon with the real aiogram client
against the fake Bot API, and the parts on their own with real files."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from echo_bot.media.budget import MediaBudget, OverBudget, prune_inbox
from tests.channels.test_telegram import OWNER, STRANGER, reply_to, say, telegram_bot, text_of
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.waiting import eventually

KB990 = 990_000  # just under max_download = "1MB"


def media(daily: str = "50MB", inbox_max: str = "1GB") -> str:
    return f'[media]\ndaily_bytes_per_sender = "{daily}"\ninbox_max = "{inbox_max}"\n'


def document(
    api: FakeTelegramAPI, n: int, size: int = KB990, *, announced: int | None = None
) -> dict[str, Any]:
    """A document of ``size`` bytes whose size Telegram announces as ``announced``."""
    data = bytes([n % 256]) * size
    named = f"junk{n}.bin"
    return {**api.add_file(data, named, size=announced), "file_name": named}


def files_of(state_dir: Path, user: int) -> list[Path]:
    folder = state_dir / "workspace" / "inbox" / f"telegram-{user}"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def send_document(api: FakeTelegramAPI, user: int, doc: dict[str, Any], caption: str = "") -> int:
    content: dict[str, Any] = {"document": doc}
    if caption:
        content["caption"] = caption
    return say(api, "", user_id=user, content=content)


# -- the attack ---------------------------------------------------------------------------
async def test_attack_non_approver_floods_the_inbox_and_is_refused_past_the_daily_budget(
    state_dir: Path,
) -> None:
    """Issue 27, finding 4: with max_download = "1MB" a non-approver sent 15 documents of
    990 kB and every one was saved; nothing bounded a sender's bytes."""
    async with telegram_bot(
        state_dir,
        media(daily="5MB"),
        allowed=(OWNER, STRANGER),
        telegram=f'approvers = [{OWNER}]\nmax_download = "1MB"',
    ) as (_bot, api):
        sent = [send_document(api, STRANGER, document(api, n)) for n in range(5)]
        for message_id in sent:
            await reply_to(api, message_id, "saved in the workspace", chat_id=STRANGER)
        # Past the budget: each refused with a clear answer; the words still reach the agent.
        refused = [
            send_document(api, STRANGER, document(api, n), caption="what time is it?")
            for n in range(5, 15)
        ]
        for message_id in refused:
            notice = await reply_to(
                api, message_id, "I did not save your document", chat_id=STRANGER
            )
            assert "you may send 5.0 MB of files a day" in text_of(notice)
            assert "50.0 KB of that is left today" in text_of(notice)
            assert "It starts again at 00:00 UTC (in " in text_of(notice)
            await reply_to(api, message_id, "It is", chat_id=STRANGER)
        assert len(api.downloads) == 5  # a refused file is not even fetched
        # The owner, an approver, is held to the inbox's cap only.
        mine = send_document(api, OWNER, document(api, 99))
        await reply_to(api, mine, "saved in the workspace")
    saved = files_of(state_dir, STRANGER)
    assert len(saved) == 5 and all(p.stat().st_size == KB990 for p in saved)
    assert len(files_of(state_dir, OWNER)) == 1


# -- the inbox's cap ----------------------------------------------------------------------
async def test_the_inbox_cap_refuses_everyone_once_the_inbox_is_full(state_dir: Path) -> None:
    async with telegram_bot(
        state_dir,
        media(inbox_max="3MB"),
        allowed=(OWNER, STRANGER),
        telegram=f'approvers = [{OWNER}]\nmax_download = "1MB"',
    ) as (_bot, api):
        for n in range(3):
            message_id = send_document(api, OWNER, document(api, n))
            await reply_to(api, message_id, "saved in the workspace")
        message_id = send_document(api, OWNER, document(api, 3))
        notice = await reply_to(api, message_id, "I did not save your document")
        assert "only 30.0 KB of the room for files (3.0 MB in all) is left" in text_of(notice)
        answer = await reply_to(api, message_id, "could not download your document")
        assert "inbox_max = 3.0 MB" in text_of(answer)
        theirs = send_document(api, STRANGER, document(api, 4, size=40_000))
        notice = await reply_to(api, theirs, "room for files", chat_id=STRANGER)
        assert "until the owner makes room" in text_of(notice)
        assert len(api.downloads) == 3
    assert len(files_of(state_dir, OWNER)) == 3 and files_of(state_dir, STRANGER) == []


async def test_a_file_larger_than_announced_stops_at_the_budget_and_is_not_kept(
    state_dir: Path,
) -> None:
    async with telegram_bot(
        state_dir,
        media(daily="1500KB"),
        allowed=(OWNER, STRANGER),
        telegram=f'approvers = [{OWNER}]\nmax_download = "1MB"',
    ) as (_bot, api):
        first = send_document(api, STRANGER, document(api, 1))
        await reply_to(api, first, "saved in the workspace", chat_id=STRANGER)
        liar = send_document(api, STRANGER, document(api, 2, announced=100))
        notice = await reply_to(api, liar, "I did not save your document", chat_id=STRANGER)
        assert "510.0 KB of that is left today" in text_of(notice)
        assert len(api.downloads) == 2  # fetched, and stopped at what the budget leaves
    [kept] = files_of(state_dir, STRANGER)
    assert kept.stat().st_size == KB990
    assert not [p for p in kept.parent.iterdir() if p.name.startswith(".")]  # no partial left


async def test_files_being_fetched_count_against_the_budgets_until_released(
    tmp_path: Path,
) -> None:
    budget = MediaBudget(tmp_path / "inbox", daily_per_sender=1_000_000, inbox_max=1_500_000)
    day = date(2026, 12, 3)
    saved = tmp_path / "inbox" / "telegram-77" / day.isoformat()
    saved.mkdir(parents=True)
    (saved / "a-1-old.bin").write_bytes(b"x" * 300_000)
    first = await budget.admit("telegram-77", day, 600_000, exempt=False)
    assert first.limit == 700_000 and first.bound.budget == "daily"
    with pytest.raises(OverBudget) as refused:  # the first is still on its way
        await budget.admit("telegram-77", day, 200_000, exempt=False)
    assert refused.value.refusal.left == 100_000
    other = await budget.admit("telegram-42", day, 500_000, exempt=False)  # another sender
    assert other.limit == 600_000 and other.bound.budget == "inbox"
    budget.release(first)
    again = await budget.admit("telegram-77", day, 200_000, exempt=False)
    assert again.limit == 700_000  # both budgets leave 700 kB now
    budget.release(other)
    budget.release(again)
    exempt = await budget.admit("telegram-77", day, 1_100_000, exempt=True)
    assert exempt.limit == 1_200_000 and exempt.bound.budget == "inbox"


# -- retention ----------------------------------------------------------------------------
def old_and_new_inbox(workspace: Path, today: date) -> dict[str, Path]:
    """Date folders of two senders and of the older layout, with real files in them."""
    inbox = workspace / "inbox"
    folders = {
        "old": inbox / "telegram-77" / (today - timedelta(days=40)).isoformat(),
        "old-layout": inbox / (today - timedelta(days=31)).isoformat(),
        "recent": inbox / "telegram-77" / (today - timedelta(days=3)).isoformat(),
        "today": inbox / "telegram-42" / today.isoformat(),
        "not-a-date": inbox / "telegram-42" / "notes",
    }
    for folder in folders.values():
        folder.mkdir(parents=True)
        (folder / "abcd1234-1-file.bin").write_bytes(b"x" * 1000)
    return folders


def test_retention_prunes_whole_old_date_folders_and_keeps_recent_ones(tmp_path: Path) -> None:
    today = date(2026, 12, 3)
    folders = old_and_new_inbox(tmp_path, today)
    outside = tmp_path / "elsewhere" / "2020-01-01"
    outside.mkdir(parents=True)
    (tmp_path / "inbox" / "telegram-99").mkdir()
    (tmp_path / "inbox" / "telegram-99" / "2020-01-01").symlink_to(outside)
    removed = prune_inbox(tmp_path / "inbox", today - timedelta(days=30), today)
    assert sorted(removed) == sorted(
        [f"telegram-77/{folders['old'].name}", folders["old-layout"].name]
    )
    assert not folders["old"].exists() and not folders["old-layout"].exists()
    for kept in ("recent", "today", "not-a-date"):
        assert (folders[kept] / "abcd1234-1-file.bin").is_file(), kept
    assert outside.is_dir()  # a link is never followed
    # Never the day in use, whatever the cut-off says.
    assert prune_inbox(tmp_path / "inbox", today + timedelta(days=5), today) == [
        f"telegram-77/{folders['recent'].name}"
    ]
    assert folders["today"].is_dir()


async def test_the_daemon_prunes_the_inbox_by_the_retention_when_it_starts(
    state_dir: Path,
) -> None:
    today = datetime.now(UTC).date()
    folders = old_and_new_inbox(state_dir / "workspace", today)
    async with telegram_bot(state_dir, '[storage]\nretention = "30d"\n') as (_bot, _api):
        await eventually(lambda: not folders["old"].exists(), what="the old day pruned")
        await eventually(lambda: not folders["old-layout"].exists(), what="old layout pruned")
        assert folders["recent"].is_dir() and folders["today"].is_dir()
