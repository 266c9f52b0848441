"""The console's Audit and Status pages over real HTTP: what they list, their filters and
pages, who sees what, cancelling a reminder, and that nothing secret or hostile leaks."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from echo_bot.console import requests
from echo_bot.console.auth import ConsoleUser
from echo_bot.events import Address, MessageInbound, Sender, new_id
from echo_bot.statuses import ApprovalStatus, ReminderStatus
from echo_bot.store import Tx
from echo_bot.store.approvals import NewApproval
from echo_bot.store.reminders import ReminderRow
from tests.conftest import Bot, running_bot
from tests.console.helpers import (
    CONSOLE,
    TELEGRAM_APPROVERS,
    client,
    console_bot,
    signed_in,
)
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("on_both_engines")

SEQ = re.compile(r'id="seq-(\d+)"')
LINK = re.compile(r'<a href="([^"]+)" rel="(prev|next)">')
APPROVER = ConsoleUser(channel="telegram", id="1", name="one")


async def write_rows(
    bot: Bot, rows: list[tuple[str | None, str | None, dict[str, object]]]
) -> None:
    """Audit rows (session key, trace id, data) as the daemon writes them."""

    def write(tx: Tx) -> None:
        for session_key, trace_id, data in rows:
            tx.audit.write("test.row", trace_id=trace_id, session_key=session_key, **data)

    await bot.store.run(write)


async def page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.text()


def seqs(text: str) -> list[int]:
    return [int(s) for s in SEQ.findall(text)]


def markers(text: str) -> set[str]:
    return set(re.findall(r'"marker": "(\w+)"', html.unescape(text)))


def links(text: str) -> dict[str, str]:
    return {rel: html.unescape(href) for href, rel in LINK.findall(text)}


async def all_seqs(bot: Bot) -> list[int]:
    rows = await bot.store.run(lambda tx: tx.audit.read(tail=100_000))
    return sorted((row.seq for row in rows), reverse=True)


async def test_audit_pages_cover_every_row_once_both_ways(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        await signed_in(bot, session)
        await write_rows(bot, [("telegram:-5", None, {"n": i}) for i in range(123)])
        expected = await all_seqs(bot)
        assert len(expected) >= 123

        pages: list[list[int]] = []
        url: str | None = "/console/audit"
        while url:
            text = await page(session, url)
            pages.append(seqs(text))
            url = links(text).get("next")
        assert all(len(p) == 50 for p in pages[:-1]) and 0 < len(pages[-1]) <= 50
        assert [s for p in pages for s in p] == expected  # newest first, no gap, no repeat
        assert "prev" not in links(await page(session, "/console/audit"))

        back: list[list[int]] = [seqs(text)]
        while prev := links(text).get("prev"):
            text = await page(session, prev)
            back.append(seqs(text))
        assert back == pages[::-1]  # "Newer" walks the same pages back


async def test_audit_filters_by_chat_tool_trace_and_time(state_dir: Path) -> None:
    trace = "a" * 32
    # UTC+14: its day is not UTC's for most of the day, so the zone must be the bot's.
    async with (
        console_bot(state_dir, '[bot]\ntimezone = "Pacific/Kiritimati"\n') as bot,
        client(bot) as session,
    ):
        await signed_in(bot, session)
        await write_rows(
            bot,
            [
                ("telegram:-7", trace, {"tool": "file_write", "marker": "one"}),
                (
                    "telegram:-8",
                    None,
                    {"tool_calls": [{"id": "c", "name": "file_write"}], "marker": "two"},
                ),
                ("telegram:-8", None, {"tool": "shell_exec", "marker": "three"}),
            ],
        )

        by_chat = await page(session, "/console/audit?chat=telegram:-8")
        assert markers(by_chat) == {"two", "three"}
        by_tool = await page(session, "/console/audit?tool=file_write")
        assert markers(by_tool) == {"one", "two"}
        by_trace = await page(session, f"/console/audit?trace={trace}")
        assert markers(by_trace) == {"one"}
        assert f'href="/console/audit?trace={trace}"' in await page(session, "/console/audit")

        zone = ZoneInfo(bot.daemon.runtime.loaded.config.bot.timezone)
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=3))
        day = datetime.fromtimestamp(rows[-1].ts, zone)
        today = day.strftime("%Y-%m-%d")
        yesterday = (day - timedelta(days=1)).strftime("%Y-%m-%d")
        tomorrow = (day + timedelta(days=1)).strftime("%Y-%m-%d")
        minute = day.strftime("%Y-%m-%d %H:%M")
        whole_day = await page(session, f"/console/audit?from={today}&to={today}")
        assert markers(whole_day) == {"one", "two", "three"}
        assert markers(await page(session, f"/console/audit?to={yesterday}")) == set()
        assert markers(await page(session, f"/console/audit?from={tomorrow}")) == set()
        at_minute = await page(session, "/console/audit?" + urlencode({"from": minute}))
        assert markers(at_minute) == {"one", "two", "three"}
        to_minute = await page(session, "/console/audit?" + urlencode({"to": minute}))
        assert markers(to_minute) == {"one", "two", "three"}  # its end is inclusive
        before = (day - timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M")
        assert markers(await page(session, "/console/audit?" + urlencode({"to": before}))) == set()
        combined = await page(
            session, f"/console/audit?chat=telegram:-8&tool=shell_exec&from={today}"
        )
        assert markers(combined) == {"three"}


async def test_a_bad_date_says_so_on_the_page(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        await signed_in(bot, session)
        for bad in ("2026-13-45", "yesterday", "9999-12-31", "2026-01-01 25:00"):
            async with session.get("/console/audit?" + urlencode({"from": bad, "to": bad})) as r:
                text = await r.text()
                assert r.status == 200, text
            assert "is not a date like 2026-03-01" in text
        backwards = urlencode({"from": "2026-03-02", "to": "2026-03-01"})
        async with session.get(f"/console/audit?{backwards}") as r:
            text = await r.text()
        assert "The &#39;from&#39; time is after the &#39;to&#39; time" in text, text


async def test_hostile_filters_are_refused_or_inert_and_escaped(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        await signed_in(bot, session)
        await write_rows(bot, [("<b>chat</b>", "t-1", {"note": "<script>alert(1)</script>"})])
        before = await all_seqs(bot)
        long = await page(session, "/console/audit?" + urlencode({"chat": "x" * 5000}))
        assert "longer than 200 characters" in long and "x" * 300 not in long
        for value in ("'; DROP TABLE audit; --", "<script>alert(2)</script>", "\u202e\x00%"):
            for name in ("chat", "tool", "trace", "from"):
                text = await page(session, "/console/audit?" + urlencode({name: value}))
                assert "<script>alert" not in text
        shown = await page(session, "/console/audit")
        assert "<script>alert(1)" not in shown and "&lt;script&gt;alert(1)" in shown
        assert "<b>chat</b>" not in shown and "&lt;b&gt;chat&lt;/b&gt;" in shown
        assert await all_seqs(bot) == before  # the table is there, unchanged
        trace_bad = await page(session, "/console/audit?trace=" + "z" * 65)
        assert "A trace id is letters" in trace_bad


async def test_an_approver_sees_only_their_channel_and_never_another_persons_chat(
    state_dir: Path,
) -> None:
    async with console_bot(state_dir, TELEGRAM_APPROVERS) as bot, client(bot) as session:
        await signed_in(bot, session, APPROVER)
        await write_rows(
            bot,
            [
                ("telegram:1", None, {"marker": "own"}),
                ("telegram:-100", None, {"marker": "group"}),
                ("telegram:2", None, {"marker": "otherperson"}),
                ("cli:local", None, {"marker": "terminal"}),
                (None, None, {"marker": "daemon"}),
            ],
        )
        assert markers(await page(session, "/console/audit")) == {"own", "group"}
        assert markers(await page(session, "/console/audit?chat=telegram:2")) == set()
        async with client(bot) as owner:
            await signed_in(bot, owner)
            everything = await page(owner, "/console/audit")
        assert markers(everything) == {"own", "group", "otherperson", "terminal", "daemon"}


MATRIX_APPROVERS = """
[matrix]
user_id = "@bot:example.org"
allowed_users = ["@ann:example.org", "@bob:example.org"]
approvers = ["@ann:example.org", "@bob:example.org"]
"""
ANN = ConsoleUser(channel="matrix", id="@ann:example.org", name="ann")


async def test_a_matrix_approver_sees_the_rooms_they_wrote_in_and_no_other(
    state_dir: Path,
) -> None:
    """A Matrix room's id says neither whose it is nor whether it is direct: Ann sees
    the rooms she wrote in (her direct chat with the bot, a group), never Bob's direct
    chat; an empty page says what she is shown."""
    own, group, bobs = "!annsroom:example.org", "!group:example.org", "!bobsroom:example.org"

    def wrote(room: str, user: str) -> MessageInbound:
        return MessageInbound(
            address=Address(channel="matrix", chat_id=room),
            sender=Sender(id=user, name=user),
            text="hello",
            external_id=f"${room}{user}",
        )

    async with console_bot(state_dir, MATRIX_APPROVERS) as bot, client(bot) as session:
        await signed_in(bot, session, ANN)
        empty = await page(session, "/console/audit")
        assert "No audit rows" in empty and "the matrix chats you have written in" in empty
        messages = [wrote(own, ANN.id), wrote(group, ANN.id), wrote(group, "@bob:example.org"),
                    wrote(bobs, "@bob:example.org")]  # fmt: skip

        def add_all(tx: Tx) -> None:
            for message in messages:
                tx.inbox.add(message)

        await bot.store.run(add_all)
        await write_rows(
            bot,
            [
                (f"matrix:{own}", None, {"marker": "own"}),
                (f"matrix:{group}", None, {"marker": "group"}),
                (f"matrix:{bobs}", None, {"marker": "otherperson"}),
                ("telegram:1", None, {"marker": "telegram"}),
                (None, None, {"marker": "daemon"}),
            ],
        )
        assert markers(await page(session, "/console/audit")) == {"own", "group"}
        assert markers(await page(session, f"/console/audit?chat=matrix:{bobs}")) == set()


async def test_sign_ins_sign_outs_and_revocations_are_in_the_audit_log(state_dir: Path) -> None:
    async with console_bot(state_dir, TELEGRAM_APPROVERS) as bot, client(bot) as session:
        csrf = await signed_in(bot, session, APPROVER)
        async with session.post(
            "/console/logout", data={"csrf": csrf}, headers={"Origin": str(session._base_url)},
            allow_redirects=False,
        ) as out:  # fmt: skip
            assert out.status == 303
        rows = await bot.store.run(lambda tx: tx.audit.read(tail=100))
        kinds = [
            (row.kind, row.data.get("approver")) for row in rows if row.kind.startswith("console.")
        ]
        assert kinds == [("console.signed_in", "telegram:1"), ("console.signed_out", "telegram:1")]
        signed = next(row for row in rows if row.kind == "console.signed_in")
        assert signed.data["address"] == "127.0.0.1" and signed.data["session"]
        async with client(bot) as owner:
            await signed_in(bot, owner)
            shown = await page(owner, "/console/audit")
        assert "console.signed_in" in shown and "console.signed_out" in shown


def reminder(reminder_id: str, chat: str, text: str, hours: float = 2) -> ReminderRow:
    now = time.time()
    return ReminderRow(
        id=reminder_id, chat=chat, owner="1", text=text, timezone="UTC", recurrence=None,
        next_at=now + hours * 3600, status=ReminderStatus.ACTIVE, created_at=now,
        fired_count=0, last_fired_at=None, trace_id=None,
    )  # fmt: skip


async def test_the_status_page_shows_instances_queues_and_reminders(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        await signed_in(bot, session)
        await bot.store.run(
            lambda tx: tx.reminders.insert(reminder("0a1b2c3d", "cli:local", "<i>tea</i>"))
        )
        text = await page(session, "/console/status")
        counts = await bot.store.run(lambda tx: tx.meta.queue_counts())
        instances = await bot.store.run(lambda tx: tx.meta.instances())
        assert "1 live" in text
        assert html.escape(instances[0].label) in text
        assert f'<span class="outbox-queued">{counts["outbox_queued"]}</span>' in text
        assert f'<span class="outbox-failed">{counts["outbox_failed"]}</span>' in text
        assert "&lt;i&gt;tea&lt;/i&gt;" in text and "<i>tea</i>" not in text
        assert "Cancel 0a1b2c3d" in text
        assert 'class="component"' in text  # this daemon's health checks


async def test_cancelling_a_reminder_needs_the_token_and_works_once(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as session:
        csrf = await signed_in(bot, session)
        await bot.store.run(lambda tx: tx.reminders.insert(reminder("0f0f0f0f", "cli:x", "call")))
        origin = {"Origin": str(session._base_url)}

        async def status() -> ReminderStatus:
            row = await bot.store.run(lambda tx: tx.reminders.get("0f0f0f0f"))
            assert row is not None
            return row.status

        url = "/console/reminders/0f0f0f0f/cancel"
        async with session.post(url, data={}, headers=origin, allow_redirects=False) as forged:
            assert forged.status == 403
        async with session.post(
            url, data={"csrf": "wrong"}, headers=origin, allow_redirects=False
        ) as wrong:
            assert wrong.status == 403
        assert await status() == ReminderStatus.ACTIVE

        # The first press asks to confirm, and changes nothing.
        async with session.post(url, data={"csrf": csrf}, headers=origin) as asked:
            text = await asked.text()
        assert asked.status == 200 and "Cancel reminder 0f0f0f0f?" in text and "call" in text
        assert await status() == ReminderStatus.ACTIVE
        confirm = {"csrf": csrf, "confirm": "yes"}
        async with session.post(url, data=confirm, headers=origin) as done:
            text = await done.text()
        assert done.status == 200 and "Reminder 0f0f0f0f is cancelled." in text
        assert await status() == ReminderStatus.CANCELLED
        assert "Cancel 0f0f0f0f" not in text
        told = await bot.channel.wait_for(lambda m: "Reminder 0f0f0f0f" in m.text)
        assert told.to.chat_id == "x" and "was cancelled by alice (console)" in told.text
        async with session.post(url, data=confirm, headers=origin) as again:
            assert "no active reminder 0f0f0f0f" in await again.text()


async def test_an_approver_sees_and_cancels_only_reminders_of_chats_they_see(
    state_dir: Path,
) -> None:
    async with console_bot(state_dir, TELEGRAM_APPROVERS) as bot, client(bot) as session:
        csrf = await signed_in(bot, session, APPROVER)
        await bot.store.run(
            lambda tx: tx.reminders.insert(reminder("aaaa0001", "telegram:-9", "grp"))
        )
        await bot.store.run(
            lambda tx: tx.reminders.insert(reminder("aaaa0002", "telegram:2", "priv"))
        )
        text = await page(session, "/console/status")
        assert "Cancel aaaa0001" in text and "aaaa0002" not in text
        origin = {"Origin": str(session._base_url)}
        async with session.post(
            "/console/reminders/aaaa0002/cancel", data={"csrf": csrf}, headers=origin
        ) as refused:
            assert "no active reminder aaaa0002" in await refused.text()
        row = await bot.store.run(lambda tx: tx.reminders.get("aaaa0002"))
        assert row is not None and row.status == ReminderStatus.ACTIVE


async def test_secrets_never_reach_the_audit_page(state_dir: Path) -> None:
    secret = "s3cr3t-admin-token-value-42"
    extra = '[webhook]\nadmin_token_env = "ECHO_BOT_ADMIN_TOKEN"\n'
    async with (
        running_bot(state_dir, CONSOLE + extra, environ={"ECHO_BOT_ADMIN_TOKEN": secret}) as bot,
        client(bot) as session,
    ):
        await signed_in(bot, session)
        inbound = await bot.channel.say(f"/run echo {secret}")
        await bot.channel.prompt_for(inbound)
        await eventually(
            lambda: bot.store.run(
                lambda tx: [r for r in tx.audit.read(tail=50) if r.kind == "approval.requested"]
            ),
            what="the request's audit row",
        )
        text = await page(session, "/console/audit?tool=shell_exec")
        assert "approval.requested" in text
        assert secret not in text
        status = await page(session, "/console/status")
        assert secret not in status


async def test_an_approved_calls_outcome_is_its_own_not_a_later_calls_of_its_tool(
    state_dir: Path,
) -> None:
    """A turn that calls the same tool again after the approved call: the decision page
    and History show the approved call's result (the later one's was shown: "failed,
    APPROVAL_DENIED" for a write that was done). Rows written before results named their
    request are read by time: the first after the decision."""
    async with console_bot(state_dir) as bot:
        ids = [new_id(), new_id()]

        def approved_then_another_call(tx: Tx) -> None:
            for number, request in enumerate(ids):
                trace = f"trace-{number}"
                tx.approvals.insert(NewApproval(
                    id=request, turn_id="t", session_key="cli:local", trace_id=trace,
                    tool="file_write", args={"path": "a.txt", "content": "A"}, args_hash="h",
                    risk="write", requested_by={"id": "alice"}, origin="cli:local",
                    prompt_to="cli:local", prompt_outbound_id=None, expires_at=time.time() + 600,
                ))  # fmt: skip
                tx.approvals.decide(request, ApprovalStatus.APPROVED, verb="approve_once",
                                    decided_by={"address": "echo-bot:alice"})  # fmt: skip
                named = {"approval_id": request} if number == 0 else {}  # 1: an older row
                tx.audit.write("tool.result", trace_id=trace, session_key="cli:local",
                               call_id="c1", tool="file_write", ok=True, error_code=None,
                               output="Wrote 1 bytes to a.txt", **named)  # fmt: skip
                later = {"approval_id": None} if number == 0 else {}
                tx.audit.write("tool.result", trace_id=trace, session_key="cli:local",
                               call_id="c2", tool="file_write", ok=False,
                               error_code="APPROVAL_DENIED", output="denied", **later)  # fmt: skip

        await bot.store.run(approved_then_another_call)
        for request in ids:
            found = await bot.store.run(lambda tx, r=request: requests.outcome(tx, r))  # type: ignore[misc]
            assert found is not None and found.ok and "Wrote 1 bytes" in found.output, found


async def test_an_approvers_history_pages_through_what_they_may_see(state_dir: Path) -> None:
    """Five decisions in the approver's own chat, then 60 newer ones in another person's
    direct chat (not theirs to see): History shows the five, and no "Older" link past
    them (it showed none of them, on an empty first page)."""
    async with console_bot(state_dir, TELEGRAM_APPROVERS) as bot, client(bot) as session:
        await signed_in(bot, session, APPROVER)

        def decided(chat: str, count: int) -> Callable[[Tx], None]:
            def make(tx: Tx) -> None:
                for number in range(count):
                    request = new_id()
                    tx.approvals.insert(NewApproval(
                        id=request, turn_id="t", session_key=chat, trace_id="tr",
                        tool="file_write", args={"path": f"f{number}"}, args_hash="h",
                        risk="write", requested_by={"id": chat.split(":")[1]}, origin=chat,
                        prompt_to=chat, prompt_outbound_id=None, expires_at=time.time() + 600,
                    ))  # fmt: skip
                    tx.approvals.decide(request, ApprovalStatus.DENIED, verb="deny",
                                        decided_by={"address": chat})  # fmt: skip

            return make

        await bot.store.run(decided("telegram:1", 5))
        await bot.store.run(decided("telegram:2", 60))
        async with session.get("/console/history") as page:
            text = await page.text()
        assert text.count('href="/console/approvals/') == 5, text
        assert 'rel="next"' not in text


async def test_an_mcp_servers_error_is_the_owners_to_read_an_approver_sees_its_state(
    state_dir: Path,
) -> None:
    """An MCP server's error may name its command, URLs or hosts: the Status page shows
    it to the owner; an approver sees "down"."""
    gone = '\n[[mcp.servers]]\nname = "gone"\ncommand = ["/nonexistent/mcp-server"]\n'
    async with (
        console_bot(state_dir, TELEGRAM_APPROVERS + gone) as bot,
        client(bot) as approver,
        client(bot) as owner,
    ):
        await signed_in(bot, approver, APPROVER)
        await signed_in(bot, owner)

        async def status_of(session: aiohttp.ClientSession, showing: str) -> str | None:
            async with session.get("/console/status") as page:
                text = await page.text()
            return text if showing in text else None

        await eventually(lambda: status_of(owner, "/nonexistent/mcp-server"), timeout=15,
                         what="the server's error, for the owner")  # fmt: skip
        theirs = await status_of(approver, "gone: down")
        assert theirs is not None and "/nonexistent" not in theirs
