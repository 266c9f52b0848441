"""The real-browser harness (tests/browser.py) against a small aiohttp app.

The app is served on this test's event loop and the browser is driven through
``asyncio.to_thread``: the pattern the console tests follow with the daemon (see
tests/browser.py). The app sends a strict Content-Security-Policy, has a form that
POSTs, and one external script that marks the page.
"""

from __future__ import annotations

import asyncio
import html
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.browser import (
    artifacts_dir,
    console_log,
    csp_violations,
    reset,
    screenshot,
    start_browser,
    wait_for,
)

CSP = "default-src 'none'; script-src 'self'"

INDEX = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>harness</title>
<script src="/app.js" defer></script>
</head>
<body>
<p id="external">external script not run</p>
<p id="inline">inline script not run</p>
<script>document.getElementById("inline").textContent = "inline script ran";</script>
<form method="post" action="/notes">
  <input name="note" id="note">
  <button type="submit" id="send">Send</button>
</form>
</body>
</html>
"""

APP_JS = """\
document.getElementById("external").textContent = "external script ran";
document.body.dataset.width = String(window.innerWidth);
"""


@dataclass
class App:
    """The test app's address and the notes it was sent."""

    base: str
    notes: list[str] = field(default_factory=list)


def _page(body: str) -> web.Response:
    return web.Response(text=body, content_type="text/html")


@web.middleware
async def _strict_csp(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    response.headers["Content-Security-Policy"] = CSP
    return response


@pytest.fixture
async def app() -> AsyncIterator[App]:
    """The app, served on 127.0.0.1 (a free port) by this test's event loop."""
    state = App(base="")

    async def index(request: web.Request) -> web.Response:
        return _page(INDEX)

    async def app_js(request: web.Request) -> web.Response:
        return web.Response(text=APP_JS, content_type="text/javascript")

    async def add_note(request: web.Request) -> web.Response:
        form = await request.post()
        state.notes.append(str(form["note"]))
        raise web.HTTPSeeOther("/notes")

    async def notes(request: web.Request) -> web.Response:
        items = "".join(f"<li>{html.escape(note)}</li>" for note in state.notes)
        return _page(
            '<!doctype html><meta name="viewport" content="width=device-width">'
            f'<title>notes</title><ul id="notes">{items}</ul>'
        )

    application = web.Application(middlewares=[_strict_csp])
    application.router.add_get("/", index)
    application.router.add_get("/app.js", app_js)
    application.router.add_post("/notes", add_note)
    application.router.add_get("/notes", notes)
    runner = web.AppRunner(application)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        state.base = f"http://{host}:{port}"
        yield state
    finally:
        await runner.cleanup()


def _text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _external_ran(driver: WebDriver) -> bool:
    return _text(driver, "external") == "external script ran"


async def test_the_page_sees_a_phone_sized_viewport(app: App, page: WebDriver) -> None:
    await asyncio.to_thread(page.get, f"{app.base}/")
    await asyncio.to_thread(wait_for, page, _external_ran, what="app.js to run")

    width, height, ratio, agent = await asyncio.to_thread(
        page.execute_script,
        "return [window.innerWidth, window.innerHeight, window.devicePixelRatio,"
        " navigator.userAgent]",
    )
    assert (width, height, ratio) == (360, 740, 2)
    assert "Mobile" in agent
    body = await asyncio.to_thread(page.find_element, By.TAG_NAME, "body")
    assert body.get_attribute("data-width") == "360"  # as app.js read it


async def test_a_form_post_makes_the_round_trip(app: App, page: WebDriver) -> None:
    await asyncio.to_thread(page.get, f"{app.base}/")
    field = await asyncio.to_thread(page.find_element, By.ID, "note")
    await asyncio.to_thread(field.send_keys, "milk & <eggs>")
    send = await asyncio.to_thread(page.find_element, By.ID, "send")
    await asyncio.to_thread(send.click)

    items = await asyncio.to_thread(
        wait_for,
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#notes li"),
        what="the notes page after the POST",
    )
    assert [item.text for item in items] == ["milk & <eggs>"]
    assert app.notes == ["milk & <eggs>"]
    assert page.current_url == f"{app.base}/notes"  # the 303 was followed with a GET


async def test_the_csp_blocks_an_inline_script_and_the_log_says_so(
    app: App, page: WebDriver
) -> None:
    await asyncio.to_thread(page.get, f"{app.base}/")
    await asyncio.to_thread(wait_for, page, _external_ran, what="app.js to run")

    assert await asyncio.to_thread(_text, page, "inline") == "inline script not run"
    violations = await asyncio.to_thread(csp_violations, page)
    assert len(violations) == 1, violations
    assert "inline script" in violations[0]
    assert "script-src 'self'" in violations[0]
    assert await asyncio.to_thread(csp_violations, page) == []  # read once


async def test_a_screenshot_is_kept_as_an_artifact(app: App, page: WebDriver) -> None:
    await asyncio.to_thread(page.get, f"{app.base}/")
    await asyncio.to_thread(wait_for, page, _external_ran, what="app.js to run")

    path = await asyncio.to_thread(screenshot, page, "harness index")

    assert path == artifacts_dir() / "harness_index.png"
    png = path.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (width, height) == (720, 1480)  # 360x740 CSS pixels at pixel ratio 2


async def test_reset_leaves_no_cookie_or_storage_behind(app: App, page: WebDriver) -> None:
    def leave_traces() -> None:
        page.get(f"{app.base}/notes")
        page.execute_script(
            "document.cookie = 'left=behind; path=/';"
            "localStorage.setItem('left', 'behind'); sessionStorage.setItem('left', 'behind');"
            "console.log('left behind');"
        )

    def traces() -> list[object]:
        page.get(f"{app.base}/notes")
        found: list[object] = page.execute_script(
            "return [document.cookie, localStorage.getItem('left'), sessionStorage.getItem('left')]"
        )
        return found

    await asyncio.to_thread(leave_traces)
    assert await asyncio.to_thread(traces) == ["left=behind", "behind", "behind"]
    await asyncio.to_thread(reset, page)
    assert await asyncio.to_thread(console_log, page) == []
    assert await asyncio.to_thread(traces) == ["", None, None]


def test_wait_for_fails_saying_what_it_awaited(page: WebDriver) -> None:
    with pytest.raises(AssertionError, match=r"not within 0.2 s: a miracle \(page: about:blank"):
        wait_for(page, lambda d: d.find_element(By.ID, "miracle"), 0.2, "a miracle")


def test_a_missing_browser_skips_here_and_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "chromedriver"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromedriver is missing"):
        start_browser(chromedriver=missing)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromedriver is missing"):
        start_browser(chromedriver=missing)


def test_artifacts_go_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHO_BOT_TEST_ARTIFACTS", str(tmp_path))
    assert artifacts_dir() == tmp_path / "console"
    assert artifacts_dir().is_dir()
