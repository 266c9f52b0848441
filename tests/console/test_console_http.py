"""The console over real HTTP (aiohttp as the browser): sign in, see the queue, decide."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from echo_bot.events import new_id
from echo_bot.statuses import ApprovalStatus
from echo_bot.store.approvals import NewApproval
from tests.conftest import Bot, running_bot
from tests.console.helpers import (
    APPEND_X,
    client,
    console_bot,
    decide,
    queue_event,
    sign_in,
    sign_in_link,
    signed_in,
)
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("on_both_engines")


def count_file(bot: Bot) -> Path:
    return bot.state_dir / "workspace" / "count.txt"


async def test_the_console_is_off_by_default(state_dir: Path) -> None:
    async with running_bot(state_dir, "[http]\nenabled = true\nport = 0\n") as bot:
        assert bot.daemon.http is not None
        port = bot.daemon.http.port
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/console/") as page,
        ):
            assert page.status == 404


async def test_the_server_root_leads_to_the_console(state_dir: Path) -> None:
    config = "[http]\nenabled = true\nport = 0\n[console]\nenabled = true\n"
    async with running_bot(state_dir, config) as bot:
        assert bot.daemon.http is not None
        root = f"http://127.0.0.1:{bot.daemon.http.port}/"
        async with (
            aiohttp.ClientSession() as session,
            session.get(root, allow_redirects=False) as answer,
        ):
            assert answer.status == 303 and answer.headers["Location"] == "/console/"


async def test_an_owner_signs_in_sees_a_pending_call_and_approves_it_once(
    state_dir: Path,
) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        async with session.get("/console/", allow_redirects=False) as page:
            assert page.status == 303
            assert page.headers["Location"].startswith("/console/login")
        csrf = await signed_in(bot, session)

        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        async with session.get("/console/") as page:
            html = await page.text()
        assert request_id in html and "file_write" in html and "Approve once" in html

        async with await decide(session, request_id, "approve", csrf) as result:
            assert result.status == 200
            assert "Approved" in await result.text()
            decision_page = str(result.url)

        async def ran() -> str | None:  # the page shows the call's result once it is done
            async with session.get(decision_page) as page:
                text = await page.text()
            return text if "The call ran" in text else None

        shown = await eventually(ran, timeout=15, what="the call's result on the decision page")
        assert "Appended 1 bytes" in shown and 'http-equiv="refresh"' not in shown
        async with session.get("/console/audit?tool=file_write") as audit:
            filtered = await audit.text()
        assert "approval.decided" in filtered  # who decided, under the tool's filter too
        async with session.get("/console/history") as history:
            listed = await history.text()
        assert '<span class="result ok">ran</span>' in listed  # the outcome, in History too
        reply = await bot.channel.reply_to(inbound)
        assert "Appended 1 bytes" in reply.text
        assert count_file(bot).read_text() == "x"
        row = await bot.store.run(lambda tx: tx.approvals.get(request_id))
        assert row is not None and row.status == ApprovalStatus.APPROVED
        assert row.decided_by is not None and row.decided_by["via"] == "console"
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert "alice (console)" in edit.text

        async with await decide(session, request_id, "approve", csrf) as again:
            text = await again.text()
        assert "Already decided" in text and "alice (console)" in text
        assert count_file(bot).read_text() == "x"


async def test_a_link_works_once(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot:
        link = await sign_in_link(bot)
        async with client(bot) as first:
            assert (await sign_in(first, link)).status == 303
        async with client(bot) as second:
            again = await sign_in(second, link)
            assert again.status == 403
            text = await again.text()
            assert "does not work" in text
            # The commands it names are code, not Markdown's backquotes shown as they are.
            assert "<code>echo-bot console link</code>" in text and "`" not in text


async def test_deny_from_the_console(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        csrf = await signed_in(bot, session)
        inbound = await bot.channel.say("/run touch denied.txt")
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        async with await decide(session, prompt.approval.request_id, "deny", csrf) as result:
            assert "Denied" in await result.text()
        reply = await bot.channel.reply_to(inbound)
        assert "APPROVAL_DENIED" in reply.text
        assert not (bot.state_dir / "workspace" / "denied.txt").exists()


async def test_the_live_queue_shows_a_new_request(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        await signed_in(bot, session)
        async with session.get("/console/events") as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            first = await queue_event(stream)
            assert "Nothing is waiting" in first
            inbound = await bot.channel.say(APPEND_X)
            prompt = await bot.channel.prompt_for(inbound)
            shown = await queue_event(stream)
            assert prompt.approval is not None
            assert prompt.approval.request_id in shown


async def test_every_console_answer_carries_the_strict_headers(state_dir: Path) -> None:
    """Pages, refusals, the sign-in redirect, assets and unknown paths alike."""
    async with console_bot(state_dir) as bot, client(bot) as session:
        for path in ("/console/", "/console/login", "/console/nothing-here", "/console/static/x"):
            async with session.get(path, allow_redirects=False) as answer:
                assert answer.status in (200, 303, 404), (path, answer.status)
                headers = answer.headers
                assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
                assert "'unsafe-inline'" not in headers["Content-Security-Policy"], path
                assert headers["X-Frame-Options"] == "DENY", path
                assert headers["Referrer-Policy"] == "same-origin", path
                assert headers["X-Content-Type-Options"] == "nosniff", path


async def test_a_decision_page_stops_looking_for_a_result_that_never_comes(
    state_dir: Path,
) -> None:
    """An approved call whose turn is gone never has a result: its page looks again for
    a few minutes, then says so instead of reloading every 2 s for as long as it is open."""
    async with console_bot(state_dir) as bot, client(bot) as session:
        csrf = await signed_in(bot, session)
        request = new_id()
        await bot.store.run(lambda tx: tx.approvals.insert(NewApproval(
            id=request, turn_id="gone", session_key="cli:local", trace_id="tr",
            tool="file_write", args={"path": "a.txt", "content": "A"}, args_hash="h",
            risk="write", requested_by={"id": "alice"}, origin="cli:local",
            prompt_to="cli:local", prompt_outbound_id=None, expires_at=time.time() + 600,
        )))  # fmt: skip
        async with await decide(session, request, "approve", csrf) as result:
            page = str(result.url)
            assert 'http-equiv="refresh"' in await result.text()  # the call may run yet
        await bot.store.run(lambda tx: tx._db.execute(
            "UPDATE approvals SET decided_at = ? WHERE id = ?", [time.time() - 600, request]
        ))  # fmt: skip  # ten minutes on
        async with session.get(page) as later:
            text = await later.text()
        assert 'http-equiv="refresh"' not in text and "no result of the call" in text


async def test_a_sessions_newest_live_page_takes_the_place_of_its_oldest(
    state_dir: Path,
) -> None:
    """A phone that changed networks leaves its old streams open on the server for
    minutes: past four, the newest page of a sign-in is live and the oldest is told it
    was replaced (it was refused 429, and a browser never tries such an answer again)."""
    async with console_bot(state_dir) as bot, client(bot) as session:
        await signed_in(bot, session)
        streams = [await session.get("/console/events") for _ in range(4)]
        try:
            for stream in streams:
                assert "Nothing is waiting" in await queue_event(stream)
            newest = await session.get("/console/events")
            streams.append(newest)
            assert newest.status == 200 and "Nothing is waiting" in await queue_event(newest)
            await bot.channel.say(APPEND_X)  # a change: every stream looks again

            async def said(stream: aiohttp.ClientResponse) -> list[str]:
                kinds = []
                while line := (await stream.content.readline()).decode():
                    if line.startswith("event: "):
                        kinds.append(line[7:].strip())
                    if kinds and kinds[-1] == "replaced":
                        break
                return kinds

            oldest = await asyncio.wait_for(said(streams[0]), 30)
            assert oldest[-1] == "replaced", oldest
            assert "queue" in [line async for line in _kinds(newest, "queue")]
        finally:
            for stream in streams:
                stream.close()


async def _kinds(stream: aiohttp.ClientResponse, until: str) -> AsyncIterator[str]:
    while line := (await asyncio.wait_for(stream.content.readline(), 30)).decode():
        if line.startswith("event: "):
            yield line[7:].strip()
            if line[7:].strip() == until:
                return
