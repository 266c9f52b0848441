"""The console's user flows in real Chromium at a phone's size (360x740 CSS pixels).

Each test runs the daemon with the console on (tests/console/helpers.py) on its own
event loop and drives the browser through ``asyncio.to_thread`` (tests/browser.py): sign
in with a one-time link, watch a pending call arrive live, decide it with the page's
buttons, and check what the daemon did — the tool's effect in the workspace, the reply
and the chat prompt's edit. Every page is kept as a screenshot (test artifacts,
``console/``); docs/images/console-*.png are copies of two of them.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from echo_bot.statuses import ReminderStatus
from echo_bot.store.reminders import ReminderRow
from tests.browser import csp_violations, screenshot, wait_for
from tests.conftest import Bot, running_bot
from tests.console.helpers import APPEND_X, CONSOLE, base_url, console_bot, sign_in_link
from tests.fakes.channel import RecordingChannel

WIDTH = 360  # the phone's width in CSS pixels (tests/browser.py)
TOUCH = 44  # the smallest touch target, CSS pixels (WCAG 2.5.5, Apple's HIG)
T = TypeVar("T")


# -- browser steps (plain functions: run them with asyncio.to_thread) -----------------------
# What Chromium says when a page is read while it is being replaced: by a navigation (a
# form's POST and its redirect) or by the live queue's script (new HTML for the queue).
# A wait reads the page again then; anything else is a failure.
TRANSIENT = (
    "does not belong to the document",
    "execution context was destroyed",
    "Cannot find context with specified id",
)


def settled(read: Callable[[WebDriver], T]) -> Callable[[WebDriver], T | None]:
    """``read`` for ``wait_for``: None (not yet) while the page is being replaced."""

    def reading(driver: WebDriver) -> T | None:
        try:
            return read(driver)
        except StaleElementReferenceException:
            return None
        except WebDriverException as exc:
            if any(words in str(exc.msg) for words in TRANSIENT):
                return None
            raise

    return reading


def sign_in(page: WebDriver, link: str) -> None:
    """Open the one-time link, press its Sign in button, land on the pending page."""
    page.get(link)
    wait_for(page, lambda d: d.find_element(By.ID, "sign-in"), what="the Sign in button")
    screenshot(page, "login")
    page.find_element(By.ID, "sign-in").click()
    try:
        wait_for(page, settled(lambda d: heading(d) == "Pending approvals"))
    except AssertionError as exc:
        raise AssertionError(f"not on the pending page: {page_text(page)!r} ({exc})") from None


def open_live_queue(page: WebDriver, base: str) -> None:
    """The pending page, with its event stream open (the script shows "Live" then)."""
    page.get(f"{base}/console/")
    wait_for(
        page,
        settled(lambda d: d.find_element(By.ID, "live").is_displayed()),
        what="the live stream to open",
    )


def heading(page: WebDriver) -> str:
    """The page's first heading."""
    found = page.execute_script('const h = document.querySelector("h1"); return h && h.innerText')
    return str(found or "")


def card(page: WebDriver, request_id: str) -> str:
    """The text of the request's card, once the page shows it (waiting, never reloading)."""
    text = wait_for(
        page,
        settled(
            lambda d: d.execute_script(
                "const e = document.getElementById(arguments[0]); return e && e.innerText",
                f"r-{request_id}",
            )
        ),
        what=f"request {request_id} on the page",
    )
    return str(text)


def press(page: WebDriver, request_id: str, verb: str) -> str:
    """Press a decision button of the request's card as a finger would (Selenium's
    click: scrolled to, not covered); the heading of the outcome page."""
    selector = f'#r-{request_id} form.decide button[value="{verb}"]'

    def click(driver: WebDriver) -> bool:
        driver.find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait_for(page, settled(click), what=f"the {verb} button of request {request_id}")
    wait_for(page, lambda d: "/console/decisions/" in d.current_url, what="the outcome page")

    def outcome(driver: WebDriver) -> str:
        shown = heading(driver)
        return "" if shown == "Submitted" else shown  # "Submitted": not applied yet

    return str(wait_for(page, settled(outcome), what="the outcome"))


def page_text(page: WebDriver) -> str:
    """Everything the page shows, scrolled out of view or not."""
    return str(page.execute_script("return document.body.innerText"))


def gone(page: WebDriver, request_id: str) -> bool:
    return not page.find_elements(By.ID, f"r-{request_id}")


def layout_problems(page: WebDriver) -> list[str]:
    """What makes the page shown hard to use on the phone: a page wider than the screen
    (sideways scrolling) and buttons or links too small to tap."""
    problems: list[str] = []
    width = int(page.execute_script("return document.documentElement.scrollWidth"))
    inner = int(page.execute_script("return window.innerWidth"))
    if inner != WIDTH:
        problems.append(f"laid out {inner} px wide, not as a {WIDTH} px phone")
    if width > WIDTH:
        problems.append(f"{width} px wide: scrolls sideways on a {WIDTH} px screen")
    targets = page.execute_script(
        """
        const tapped = "button, input:not([type=hidden]), header a, .pages a, .filter-actions a";
        return Array.from(document.querySelectorAll(tapped))
          .filter(e => e.offsetParent !== null)
          .map(e => [e.textContent.trim() || e.name, e.getBoundingClientRect().height]);
        """
    )
    for label, height in targets:
        if height < TOUCH:
            problems.append(f"{label!r} is {height:.0f} px high (under {TOUCH} px)")
    return problems


# -- checks of the daemon's side ---------------------------------------------------------------
def workspace(bot: Bot, name: str) -> Path:
    return bot.state_dir / "workspace" / name


def a_reminder(text: str) -> ReminderRow:
    """An active reminder in the terminal's chat, due in an hour."""
    now = time.time()
    return ReminderRow(
        id="0a1b2c3d", chat="cli:local", owner="owner", text=text, timezone="UTC",
        recurrence=None, next_at=now + 3600, status=ReminderStatus.ACTIVE, created_at=now,
        fired_count=0, last_fired_at=None, trace_id=None,
    )  # fmt: skip


async def prompt_edit(channel: RecordingChannel, prompt_id: str) -> str:
    edit = await channel.wait_for(lambda m: m.edit_of == prompt_id)
    return edit.text


# -- the flows ---------------------------------------------------------------------------------
async def test_sign_in_with_a_link_lands_on_the_pending_page(
    page: WebDriver, state_dir: Path
) -> None:
    async with console_bot(state_dir) as bot:
        base = base_url(bot)
        await asyncio.to_thread(page.get, f"{base}/console/history")
        assert "/console/login" in await asyncio.to_thread(lambda: page.current_url)

        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        assert await asyncio.to_thread(lambda: page.current_url) == f"{base}/console/"
        text = await asyncio.to_thread(page_text, page)
        assert "Nothing is waiting" in text and "Signed in as alice" in text
        # The session cookie is there, and out of the page's script's reach.
        cookies = await asyncio.to_thread(page.get_cookies)
        assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
            ("echo_bot_console", True, "Strict")
        ]
        assert await asyncio.to_thread(page.execute_script, "return document.cookie") == ""


async def test_the_page_says_when_it_has_lost_the_daemon(page: WebDriver, state_dir: Path) -> None:
    """The daemon goes away under an open page: it says "disconnected, retrying" instead
    of going on saying that nothing is waiting."""
    async with console_bot(state_dir) as bot:
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        await asyncio.to_thread(open_live_queue, page, base_url(bot))
        assert not await asyncio.to_thread(lambda: page.find_element(By.ID, "lost").is_displayed())
    # The daemon has stopped: its stream ended and its port is closed.
    await asyncio.to_thread(
        wait_for,
        page,
        settled(lambda d: d.find_element(By.ID, "lost").is_displayed()),
        what="the page to say it lost the daemon",
    )
    text = await asyncio.to_thread(page_text, page)
    assert "Disconnected from the daemon, retrying" in text
    assert not await asyncio.to_thread(lambda: page.find_element(By.ID, "live").is_displayed())
    await asyncio.to_thread(screenshot, page, "console-disconnected")


@pytest.mark.usefixtures("on_both_engines")
async def test_a_call_appears_live_is_approved_and_runs_once(
    page: WebDriver, state_dir: Path
) -> None:
    async with console_bot(state_dir) as bot:
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        await asyncio.to_thread(open_live_queue, page, base_url(bot))
        assert "Nothing is waiting" in await asyncio.to_thread(page_text, page)

        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        shown = await asyncio.to_thread(card, page, request_id)  # no reload
        assert "file_write" in shown and '"count.txt"' in shown and "Approve once" in shown
        assert "Live" in await asyncio.to_thread(lambda: page.find_element(By.ID, "live").text)
        await asyncio.to_thread(screenshot, page, "pending")

        outcome = await asyncio.to_thread(press, page, request_id, "approve")
        assert outcome == "Approved"
        await asyncio.to_thread(screenshot, page, "decision")
        reply = await bot.channel.reply_to(inbound)
        assert "Appended 1 bytes" in reply.text
        assert workspace(bot, "count.txt").read_text() == "x"  # ran exactly once
        assert "alice (console)" in await prompt_edit(bot.channel, prompt.id)

        await asyncio.to_thread(page.get, f"{base_url(bot)}/console/history")
        history = await asyncio.to_thread(page_text, page)
        assert "file_write" in history and "alice (console)" in history
        await asyncio.to_thread(screenshot, page, "history")
        assert await asyncio.to_thread(csp_violations, page) == []


async def test_deny_in_the_console_runs_nothing(page: WebDriver, state_dir: Path) -> None:
    async with console_bot(state_dir) as bot:
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        await asyncio.to_thread(open_live_queue, page, base_url(bot))
        inbound = await bot.channel.say("/run touch denied.txt")
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id

        outcome = await asyncio.to_thread(press, page, request_id, "deny")
        assert outcome == "Denied"
        reply = await bot.channel.reply_to(inbound)
        assert "APPROVAL_DENIED" in reply.text
        assert not workspace(bot, "denied.txt").exists()
        assert "alice (console)" in await prompt_edit(bot.channel, prompt.id)


@pytest.mark.usefixtures("on_both_engines")
async def test_a_request_decided_in_the_chat_meanwhile(page: WebDriver, state_dir: Path) -> None:
    async with console_bot(state_dir) as bot:
        base = base_url(bot)
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        await asyncio.to_thread(open_live_queue, page, base)
        queue_tab = await asyncio.to_thread(lambda: page.current_window_handle)
        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        await asyncio.to_thread(card, page, request_id)

        def open_stale_tab() -> str:
            """The request's own page in a second tab: it is not live, so it keeps its
            Approve button after the chat decides."""
            page.switch_to.new_window("tab")
            page.get(f"{base}/console/approvals/{request_id}")
            card(page, request_id)
            screenshot(page, "request")
            handle = page.current_window_handle
            page.switch_to.window(queue_tab)
            return handle

        def one_tab_again() -> None:
            """Close the stale page's tab: the session's browser goes on to other tests."""
            for handle in page.window_handles:
                if handle != queue_tab:
                    page.switch_to.window(handle)
                    page.close()
            page.switch_to.window(queue_tab)

        try:
            stale_tab = await asyncio.to_thread(open_stale_tab)
            approve = next(b for row in prompt.buttons for b in row if b.label == "Approve once")
            await bot.channel.press(approve.action)  # the chat's button, pressed meanwhile
            reply = await bot.channel.reply_to(inbound)
            assert "Appended 1 bytes" in reply.text

            def dropped_and_listed() -> str:
                wait_for(page, settled(lambda d: gone(d, request_id)), what="the queue to drop it")
                recent = wait_for(
                    page,
                    settled(lambda d: d.find_element(By.CSS_SELECTOR, "ul.recent").text),
                    what="the recently decided list",
                )
                screenshot(page, "pending-decided-elsewhere")
                return str(recent)

            recent = await asyncio.to_thread(dropped_and_listed)
            assert "Decided in the last 15 minutes" in await asyncio.to_thread(page_text, page)
            assert "file_write" in recent and "approved by owner (terminal)" in recent

            def approve_on_the_stale_page() -> str:
                page.switch_to.window(stale_tab)
                heading = press(page, request_id, "approve")
                screenshot(page, "already-decided")
                return f"{heading}\n{page_text(page)}"

            stale = await asyncio.to_thread(approve_on_the_stale_page)
            assert stale.startswith("Not applied\n")
            assert "Already decided" in stale and "owner (terminal)" in stale
            assert workspace(bot, "count.txt").read_text() == "x"  # the chat's approval only
        finally:
            await asyncio.to_thread(one_tab_again)


async def test_a_call_too_long_for_the_chat_is_approved_in_the_console(
    page: WebDriver, state_dir: Path
) -> None:
    # 4,500 characters, each line different, so a part left out would show.
    content = "".join(
        f"line {n:03d}: the quick brown fox jumps over the lazy dog. " for n in range(75)
    )
    assert len(content) > 4000
    command = "/tool file_write " + json.dumps(
        {"path": "long.txt", "content": content, "append": True}
    )
    chat = RecordingChannel("telegram")  # a chat shows what fits one message
    config = CONSOLE + "[telegram]\nallowed_users = [42]\n"
    async with running_bot(state_dir, config, channel=chat) as bot:
        base = base_url(bot)
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        inbound = await chat.say(command, chat="42", sender="42")
        prompt = await chat.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert [[b.label for b in row] for row in prompt.buttons] == [["Deny"]]
        link = re.search(r"https?://\S+/console/approvals/([0-9a-f]{32})", prompt.text)
        assert link is not None and link.group(1) == request_id, prompt.text

        await asyncio.to_thread(page.get, f"{base}/console/approvals/{request_id}")
        text = await asyncio.to_thread(page_text, page)
        assert content in text  # every character of it
        assert "Too long for a chat prompt" in text
        assert await asyncio.to_thread(layout_problems, page) == []
        await asyncio.to_thread(screenshot, page, "request-long")

        outcome = await asyncio.to_thread(press, page, request_id, "approve")
        assert outcome == "Approved"
        reply = await chat.reply_to(inbound)
        assert f"Appended {len(content)} bytes" in reply.text
        assert workspace(bot, "long.txt").read_text() == content  # once


async def test_every_page_fits_a_phone(page: WebDriver, state_dir: Path) -> None:
    async with console_bot(state_dir) as bot:
        base = base_url(bot)
        link = await sign_in_link(bot)
        await asyncio.to_thread(page.get, link)
        problems = {"login": await asyncio.to_thread(layout_problems, page)}
        await asyncio.to_thread(sign_in, page, link)
        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        await asyncio.to_thread(open_live_queue, page, base)
        await asyncio.to_thread(card, page, request_id)
        problems["pending"] = await asyncio.to_thread(layout_problems, page)
        await asyncio.to_thread(page.get, f"{base}/console/approvals/{request_id}")
        problems["request"] = await asyncio.to_thread(layout_problems, page)
        await asyncio.to_thread(press, page, request_id, "approve")
        problems["decision"] = await asyncio.to_thread(layout_problems, page)
        await bot.channel.reply_to(inbound)  # the call ran: the audit log has its rows
        await asyncio.to_thread(page.get, f"{base}/console/history")
        problems["history"] = await asyncio.to_thread(layout_problems, page)
        await asyncio.to_thread(page.get, f"{base}/console/audit")
        assert "file_write" in await asyncio.to_thread(page_text, page)
        problems["audit"] = await asyncio.to_thread(layout_problems, page)
        await asyncio.to_thread(screenshot, page, "audit")
        await bot.store.run(lambda tx: tx.reminders.insert(a_reminder("call the plumber")))
        await asyncio.to_thread(page.get, f"{base}/console/status")
        assert "call the plumber" in await asyncio.to_thread(page_text, page)
        problems["status"] = await asyncio.to_thread(layout_problems, page)
        await asyncio.to_thread(screenshot, page, "status")
        assert {name: found for name, found in problems.items() if found} == {}


async def test_status_and_audit_read_well_on_a_phone(page: WebDriver, state_dir: Path) -> None:
    """At 360 px: the Status table's headers stay whole words, its health details are
    key and value (not raw JSON), and 50 audit rows are a page to scroll, not 17,000 px
    of JSON (each row's data one tap away)."""
    async with console_bot(state_dir) as bot:
        base = base_url(bot)
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))

        def write(tx: Any) -> None:
            for n in range(60):
                tx.audit.write("test.row", trace_id=None, session_key="cli:local", n=n,
                               tool="file_write", args={"path": f"notes/{n}.txt",
                                                        "content": "line\n" * 20})  # fmt: skip

        await bot.store.run(write)
        await asyncio.to_thread(page.get, f"{base}/console/status")
        lines = await asyncio.to_thread(
            page.execute_script,
            """return Array.from(document.querySelectorAll("table.rows th")).map(th => {
                 const range = document.createRange(); range.selectNodeContents(th);
                 return [th.textContent, range.getClientRects().length]; });""",
        )
        assert lines and all(count == 1 for _text, count in lines), lines
        assert not await asyncio.to_thread(page.find_elements, By.CSS_SELECTOR, "td pre.json")
        assert await asyncio.to_thread(page.find_elements, By.CSS_SELECTOR, "dl.details dt")
        await asyncio.to_thread(page.get, f"{base}/console/audit")
        rows = await asyncio.to_thread(page.find_elements, By.CSS_SELECTOR, "li.audit-row")
        assert len(rows) == 50
        height = int(await asyncio.to_thread(
            page.execute_script, "return document.documentElement.scrollHeight"
        ))  # fmt: skip
        assert height < 50 * 150, f"{height} px for 50 rows"
        assert await asyncio.to_thread(layout_problems, page) == []
        kinds = await asyncio.to_thread(
            page.execute_script,
            "return Array.from(document.querySelectorAll('form.filters input[name=from],"
            " form.filters input[name=to]')).map(e => e.type)",
        )
        assert kinds == ["date", "date"]  # a date picker, not typed text


async def test_deciding_is_a_plain_form_post(page: WebDriver, state_dir: Path) -> None:
    """Every action works with script off: the decide form is an ordinary POST form,
    and submitting it (no script of the page involved) decides."""
    async with console_bot(state_dir) as bot:
        base = base_url(bot)
        await asyncio.to_thread(sign_in, page, await sign_in_link(bot))
        inbound = await bot.channel.say(APPEND_X)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id

        def submit_the_form() -> tuple[int, str, str, list[str], str]:
            page.get(f"{base}/console/approvals/{request_id}")
            scripts = int(page.execute_script("return document.scripts.length"))
            card(page, request_id)
            form = page.find_element(By.CSS_SELECTOR, f"#r-{request_id} form.decide")
            method = str(form.get_attribute("method"))
            action = str(page.execute_script("return arguments[0].getAttribute('action')", form))
            fields = [
                f"{e.get_attribute('type')}:{e.get_attribute('name')}"
                for e in form.find_elements(By.CSS_SELECTOR, "input, button")
            ]
            # The browser's own submission, with the Approve button as the submitter.
            page.execute_script(
                "arguments[0].requestSubmit(arguments[0].querySelector(arguments[1]))",
                form,
                'button[value="approve"]',
            )
            wait_for(page, lambda d: "/console/decisions/" in d.current_url)
            return scripts, method, action, fields, heading(page)

        scripts, method, action, fields, outcome = await asyncio.to_thread(submit_the_form)
        assert scripts == 0  # the request's page has no script that could do the deciding
        assert method == "post"
        assert action == f"/console/approvals/{request_id}"
        assert "hidden:csrf" in fields and "submit:verb" in fields
        assert outcome == "Approved"
        await bot.channel.reply_to(inbound)
        assert workspace(bot, "count.txt").read_text() == "x"
