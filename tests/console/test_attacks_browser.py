"""Attacks on the console that need a real browser (Chromium, tests/browser.py): a page
of another origin that posts to the console or frames it, and hostile text (tool
arguments, a model's reply, a chat's name, a user's name) that would run as script if
it were ever parsed as markup.

Each checks the attack's effect did not happen AND that the legitimate way works (the
console's own button decides; a frame of a page that allows it does render; the hostile
text is shown, literally), so none passes for a trivial reason.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import new_id
from echo_bot.tools.base import Tool
from tests.browser import console_log, csp_violations, screenshot, wait_for
from tests.conftest import Bot, running_bot
from tests.console.helpers import CONSOLE, base_url, console_bot, sign_in_link
from tests.waiting import eventually

HOSTILE = (
    '<img src=x onerror="window.__pwned=1">',
    "</pre><script>window.__pwned=1</script>",
)
# Characters that reorder or hide text, and the escapes the console shows instead.
HIDDEN = {"\u202e": "\\u202e", "\u200b": "\\u200b"}


# -- another origin -------------------------------------------------------------------------
@dataclass
class Elsewhere:
    """An attacker's site: another aiohttp server on 127.0.0.1, on another port (so
    another origin), serving the pages a test puts in ``pages``."""

    base: str = ""
    pages: dict[str, str] = field(default_factory=dict)


@asynccontextmanager
async def elsewhere() -> AsyncIterator[Elsewhere]:
    site = Elsewhere()

    async def serve(request: web.Request) -> web.Response:
        body = site.pages.get(request.path)
        if body is None:
            return web.Response(status=404, text="not here")
        return web.Response(text=body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/{name:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        site.base = f"http://{host}:{port}"
        yield site
    finally:
        await runner.cleanup()


def html_page(body: str) -> str:
    return f'<!doctype html><meta name="viewport" content="width=device-width">{body}'


def sign_in_browser(page: WebDriver, link: str) -> None:
    """Open a sign-in link and press its button, as a person does."""
    page.get(link)
    page.find_element(By.ID, "sign-in").click()
    wait_for(page, lambda d: d.current_url.endswith("/console/"), what="the console")


def count_file(bot: Bot) -> Path:
    return bot.state_dir / "workspace" / "count.txt"


async def pending_request(bot: Bot, text: str, **where: str) -> str:
    inbound = await bot.channel.say(text, **where)
    prompt = await bot.channel.prompt_for(inbound)
    assert prompt.approval is not None
    return prompt.approval.request_id


async def status_of(bot: Bot, request_id: str) -> str:
    row = await bot.store.run(lambda tx: tx.approvals.get(request_id))
    assert row is not None
    return str(row.status)


APPEND = '/tool file_write {"path": "count.txt", "content": "x", "append": true}'


async def test_attack_csrf_from_another_origin_in_a_browser(
    page: WebDriver, state_dir: Path
) -> None:
    async with console_bot(state_dir) as bot, elsewhere() as evil:
        console = base_url(bot)
        assert evil.base != console  # another port: another origin
        await asyncio.to_thread(sign_in_browser, page, await sign_in_link(bot))
        request_id = await pending_request(bot, APPEND)
        # The worst case: the attacker even knows the session's CSRF token.
        await asyncio.to_thread(page.get, f"{console}/console/approvals/{request_id}")
        token = await asyncio.to_thread(
            lambda: page.find_element(By.NAME, "csrf").get_attribute("value")
        )
        action = f"{console}/console/approvals/{request_id}"
        for name, csrf in (("with-token", token), ("without-token", "")):
            evil.pages[f"/{name}"] = html_page(
                f'<form id="f" method="post" action="{html.escape(action)}">'
                f'<input name="csrf" value="{html.escape(csrf or "")}">'
                '<input name="verb" value="approve"></form>'
                '<script>document.getElementById("f").submit()</script>'
            )

            def attack(path: str = f"/{name}") -> str:
                page.get(f"{evil.base}{path}")
                wait_for(page, lambda d: d.current_url.startswith(console), what="the post")
                wait_for(page, lambda d: d.find_elements(By.TAG_NAME, "h1"), what="a page")
                return str(page.find_element(By.TAG_NAME, "h1").text)

            title = await asyncio.to_thread(attack)
            assert title in ("Refused", "Signed out"), (name, title)
            await asyncio.to_thread(screenshot, page, f"attack csrf {name}")
            assert await status_of(bot, request_id) == "pending", name
        assert not count_file(bot).exists()

        # The console's own button, in the same browser, decides.
        def approve() -> str:
            page.get(f"{console}/console/approvals/{request_id}")
            page.find_element(By.CSS_SELECTOR, "button[value=approve]").click()
            found = wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#outcome h1"))
            return str(found[0].text)

        assert await asyncio.to_thread(approve) == "Approved"
        await eventually(lambda: count_file(bot).exists(), what="the approved call to run")
        assert count_file(bot).read_text() == "x"


async def test_attack_clickjacking_in_a_browser(page: WebDriver, state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, elsewhere() as evil:
        console = base_url(bot)
        await asyncio.to_thread(sign_in_browser, page, await sign_in_link(bot))
        link = await sign_in_link(bot)
        evil.pages["/plain"] = html_page('<p id="plain">a page that may be framed</p>')
        evil.pages["/frames"] = html_page(
            '<iframe id="plain" src="/plain"></iframe>'
            f'<iframe id="queue" src="{console}/console/"></iframe>'
            f'<iframe id="login" src="{html.escape(link)}"></iframe>'
        )

        def framed_texts() -> dict[str, str]:
            page.get(f"{evil.base}/frames")
            texts: dict[str, str] = {}
            for frame in ("plain", "queue", "login"):
                page.switch_to.frame(frame)
                try:
                    texts[frame] = str(
                        page.execute_script("return document.body ? document.body.innerText : ''")
                    )
                    texts[frame + " buttons"] = str(len(page.find_elements(By.TAG_NAME, "button")))
                finally:
                    page.switch_to.default_content()
            return texts

        def all_loaded(driver: WebDriver) -> dict[str, str] | None:
            texts = framed_texts()
            return texts if "a page that may be framed" in texts["plain"] else None

        texts = await asyncio.to_thread(wait_for, page, all_loaded, what="the frames")
        assert texts is not None
        assert "a page that may be framed" in texts["plain"]  # framing works…
        for frame in ("queue", "login"):  # …but not of the console
            assert "echo-bot" not in texts[frame] and "Sign in" not in texts[frame], texts
            assert texts[frame + " buttons"] == "0", texts
        log = " ".join(str(e.get("message")) for e in await asyncio.to_thread(console_log, page))
        assert "frame-ancestors" in log or "X-Frame-Options" in log, log
        await asyncio.to_thread(screenshot, page, "attack clickjacking")
        # The framed sign-in page was not used: the link still signs in.
        await asyncio.to_thread(page.delete_all_cookies)
        await asyncio.to_thread(sign_in_browser, page, link)


# -- hostile text ---------------------------------------------------------------------------
def pwned(page: WebDriver) -> Any:
    return page.execute_script("return window.__pwned")


def injected(page: WebDriver) -> int:
    """Elements of the hostile markup, had it been parsed (the page has none of its own)."""
    count: int = page.execute_script(
        "return document.querySelectorAll('main img, main script, body > script').length"
    )
    return count


def shown_text(page: WebDriver) -> str:
    return str(page.find_element(By.TAG_NAME, "main").text)


def inert(page: WebDriver, url: str, expected: Sequence[str], absent: Sequence[str]) -> str:
    """Open ``url``: nothing ran, no markup of the text was made, every ``expected``
    text is shown literally and no ``absent`` one is; the text shown."""
    page.get(url)
    wait_for(page, lambda d: d.find_elements(By.TAG_NAME, "main"), what=url)
    # Every closed row opened, as a person taps them (the Audit page's rows).
    page.execute_script("document.querySelectorAll('details').forEach(d => { d.open = true; })")
    text = shown_text(page)
    assert pwned(page) is None, url
    assert injected(page) == 0, url
    for literal in expected:
        assert literal in text, (url, literal, text)
    for hidden in absent:
        assert hidden not in text, (url, hidden)
    return text


async def sign_in_and_watch(page: WebDriver, bot: Bot) -> None:
    """Sign in and stay on the live queue (its script puts the stream's HTML in)."""
    await asyncio.to_thread(sign_in_browser, page, await sign_in_link(bot))
    await asyncio.to_thread(
        wait_for, page, lambda d: d.find_element(By.ID, "live").is_displayed(), 10, "live"
    )


async def live_shows(page: WebDriver, request_ids: Sequence[str]) -> None:
    """The live queue (without a reload) shows these requests."""

    def there(driver: WebDriver) -> bool:
        ids = {e.get_attribute("data-id") for e in driver.find_elements(By.CSS_SELECTOR, "article")}
        return set(request_ids) <= ids

    await asyncio.to_thread(wait_for, page, there, 10, "the requests in the live queue")
    assert await asyncio.to_thread(pwned, page) is None
    assert await asyncio.to_thread(injected, page) == 0


async def check_pages(
    page: WebDriver, bot: Bot, request_ids: Sequence[str], expected: Sequence[str]
) -> None:
    """The queue, each request's page, and after denying them the history: all inert."""
    console = base_url(bot)
    absent = list(HIDDEN)
    await asyncio.to_thread(inert, page, f"{console}/console/", expected, absent)
    for request_id in request_ids:
        await asyncio.to_thread(
            inert, page, f"{console}/console/approvals/{request_id}", [], absent
        )

    def deny(request_id: str) -> None:
        page.get(f"{console}/console/approvals/{request_id}")
        page.find_element(By.CSS_SELECTOR, "button[value=deny]").click()
        wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#outcome h1"))
        assert pwned(page) is None and injected(page) == 0

    for request_id in request_ids:
        await asyncio.to_thread(deny, request_id)
        assert await status_of(bot, request_id) == "denied"
    await asyncio.to_thread(inert, page, f"{console}/console/history", [], absent)
    assert await asyncio.to_thread(csp_violations, page) == []  # never needed


async def audit_shows(page: WebDriver, bot: Bot, expected: Sequence[str]) -> None:
    """The audit log (``/console/audit``) shows these texts literally, and is inert."""
    await asyncio.to_thread(inert, page, f"{base_url(bot)}/console/audit", expected, list(HIDDEN))
    assert await asyncio.to_thread(csp_violations, page) == []


def as_json(text: str) -> str:
    """How a value is shown in a call: JSON (quotes escaped), hidden characters as escapes."""
    shown = json.dumps(text, ensure_ascii=False)[1:-1]
    for char, escape in HIDDEN.items():
        shown = shown.replace(char, escape)
    return shown


async def test_attack_xss_through_a_tool_argument(page: WebDriver, state_dir: Path) -> None:
    values = [*HOSTILE, "safe\u202eexe.txt\u200b"]
    async with console_bot(state_dir) as bot:
        await sign_in_and_watch(page, bot)
        request_ids = []
        for value in values:
            args = json.dumps({"path": "out.txt", "content": value})
            request_ids.append(await pending_request(bot, f"/tool file_write {args}"))
        await live_shows(page, request_ids)
        text = await asyncio.to_thread(shown_text, page)
        for value in values:
            assert as_json(value) in text, (value, text)
        assert "\u202e" not in text and "\u200b" not in text
        await asyncio.to_thread(screenshot, page, "attack xss tool argument")
        await check_pages(page, bot, request_ids, [as_json(v) for v in values])
        await audit_shows(page, bot, [as_json(v) for v in values])
        assert not (bot.state_dir / "workspace" / "out.txt").exists()


def named(value: str) -> str:
    """A name as the console shows it: hidden characters as escapes."""
    for char, escape in HIDDEN.items():
        value = value.replace(char, escape)
    return value


async def test_attack_xss_through_a_user_name(page: WebDriver, state_dir: Path) -> None:
    names = [f"{h}\u202e\u200b" for h in HOSTILE]
    async with console_bot(state_dir) as bot:
        await sign_in_and_watch(page, bot)
        request_ids = [await pending_request(bot, APPEND, sender=name) for name in names]
        await live_shows(page, request_ids)
        text = await asyncio.to_thread(shown_text, page)
        for name in names:
            assert f"Asked by\n{named(name)}" in text or named(name) in text, text
        await asyncio.to_thread(screenshot, page, "attack xss user name")
        await check_pages(page, bot, request_ids, [named(n) for n in names])
        await audit_shows(page, bot, [as_json(n) for n in names])
        assert not count_file(bot).exists()


async def test_attack_xss_through_a_chat_title(page: WebDriver, state_dir: Path) -> None:
    """A chat is shown by its address (channel:chat id), which a chat platform names."""
    chats = [f"{h}\u202e\u200b" for h in HOSTILE]
    async with console_bot(state_dir) as bot:
        await sign_in_and_watch(page, bot)
        request_ids = [await pending_request(bot, APPEND, chat=chat) for chat in chats]
        await live_shows(page, request_ids)
        text = await asyncio.to_thread(shown_text, page)
        for chat in chats:
            assert f"cli:{named(chat)}" in text, text
        await asyncio.to_thread(screenshot, page, "attack xss chat title")
        await check_pages(page, bot, request_ids, [f"cli:{named(c)}" for c in chats])
        await audit_shows(page, bot, [as_json(f"cli:{c}") for c in chats])
        assert not count_file(bot).exists()


REPLY = " ".join(HOSTILE) + " \u202e\u200b"


class HostileModel:
    """A model whose every word is hostile: a file_write of hostile text, then a reply
    of hostile text."""

    name = "hostile"

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        if conversation and conversation[-1].role == "tool":
            return BrainReply(text=REPLY, route_reason="test: reply")
        return BrainReply(
            tool_calls=[
                ToolCall(
                    id=new_id(),
                    name="file_write",
                    args={"path": "model.txt", "content": " ".join(HOSTILE)},
                )
            ],
            route_reason="test: hostile call",
        )


async def test_attack_xss_through_a_model_reply(page: WebDriver, state_dir: Path) -> None:
    async with running_bot(state_dir, CONSOLE, brain=HostileModel()) as bot:
        await sign_in_and_watch(page, bot)
        inbound = await bot.channel.say("write something")
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        await live_shows(page, [request_id])
        text = await asyncio.to_thread(shown_text, page)
        assert as_json(" ".join(HOSTILE)) in text, text
        await asyncio.to_thread(screenshot, page, "attack xss model reply")
        await check_pages(page, bot, [request_id], [as_json(" ".join(HOSTILE))])
        reply = await bot.channel.reply_to(inbound)  # after the denial: the model's words
        assert reply.text.startswith(HOSTILE[0])
        await audit_shows(page, bot, [as_json(REPLY)])
        assert not (bot.state_dir / "workspace" / "model.txt").exists()
