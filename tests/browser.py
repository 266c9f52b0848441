"""A real browser for the tests: headless Chromium through Selenium, phone-sized.

Tests of server-rendered pages (the web console) drive Debian's ``/usr/bin/chromium``
through ``/usr/bin/chromedriver`` (``.ci/run`` installs both when missing). Where the
browser, its driver or selenium cannot be had, those tests fail under CI (``CI`` set),
never a silent skip there, and are skipped, saying why, everywhere else, as
tests/postgres.py does for PostgreSQL.

Fixtures (tests/conftest.py registers this module as a plugin, so every test module has
them; importing them instead would start one browser per module):

``browser``
    One Chromium for the whole session (starting one takes about 1.5 s), with a 360x740
    CSS-pixel viewport (mobile emulation: pixel ratio 2, a phone's user agent, touch),
    a 20 s page load and 10 s script time-out, and its console log kept
    (``goog:loggingPrefs``). Pages must carry ``<meta name="viewport"
    content="width=device-width">``, as on a real phone: without it the page is laid out
    980 px wide and ``window.innerWidth`` says 980.
``page``
    The same driver, reset for one test: on ``about:blank``, with no cookies, storage
    or cache of any origin, and with the console log read so far thrown away. Use this
    one in tests.

Helpers: ``wait_for(driver, predicate)`` waits (WebDriverWait) and fails with an
``AssertionError`` as tests/waiting.py does; ``screenshot(driver, name)`` keeps a PNG
under ``$ECHO_BOT_TEST_ARTIFACTS`` (default ``<repo>/test-artifacts/``), ``console/``;
``console_log`` and ``csp_violations`` read the browser's console log.

Selenium blocks, so it must not run on the event loop that serves the page. The pattern
for a server (the daemon) on the test's own event loop: the test is ``async``, starts
the server as any async test does, and every browser call goes through
``asyncio.to_thread``, so the loop keeps serving while the browser waits for it::

    async def test_console_lists_turns(page: WebDriver) -> None:
        async with running_bot(...) as bot:            # serves on this test's loop
            await asyncio.to_thread(page.get, f"{base}/console/")
            await asyncio.to_thread(
                wait_for, page, lambda d: d.find_elements(By.CSS_SELECTOR, "li.turn")
            )
            await asyncio.to_thread(screenshot, page, "turns")

A plain (sync) ``page.get`` in an async test hangs until the 20 s page load time-out
(and aiohttp's shutdown then waits out its 60 s for the stuck request): the loop that
should answer is the one waiting for the browser. Several browser steps in a row may
go into one plain function, called once through ``asyncio.to_thread``. A sync test
with no server on its loop may call the driver directly.

tests/test_browser_harness.py shows the pattern against a small aiohttp app.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

T = TypeVar("T")

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS_ENV = "ECHO_BOT_TEST_ARTIFACTS"
ROOT = Path(__file__).resolve().parent.parent

WIDTH, HEIGHT = 360, 740  # CSS pixels, as a small phone
PIXEL_RATIO = 2.0
PHONE_USER_AGENT = (
    "Mozilla/5.0 (Linux; Android 14; Pixel 7) AppleWebKit/537.36 "
    "(KHTML, like Gecko) Chrome/126.0.0.0 Mobile Safari/537.36"
)
PAGE_LOAD_TIMEOUT = 20.0  # seconds
SCRIPT_TIMEOUT = 10.0
ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage")


def _unavailable(reason: str) -> NoReturn:
    message = f"no browser for the browser tests: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message + " (install chromium and chromium-driver, as .ci/run does)")


def start_browser(*, chromium: Path = CHROMIUM, chromedriver: Path = CHROMEDRIVER) -> WebDriver:
    """A new headless, phone-sized Chromium (else fail or skip, as above). Quit it."""
    for program in (chromium, chromedriver):
        if not os.access(program, os.X_OK):
            _unavailable(f"{program} is missing")
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:  # the test extra brings it
        _unavailable(f"selenium is not installed ({exc})")

    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in ARGUMENTS:
        options.add_argument(argument)
    options.add_experimental_option(
        "mobileEmulation",
        {
            "deviceMetrics": {"width": WIDTH, "height": HEIGHT, "pixelRatio": PIXEL_RATIO},
            "userAgent": PHONE_USER_AGENT,
        },
    )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=Service(str(chromedriver)))
    except WebDriverException as exc:
        _unavailable(f"Chromium did not start: {' '.join(str(exc.msg).split())}")
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT)
    driver.set_script_timeout(SCRIPT_TIMEOUT)
    return driver


def reset(driver: WebDriver) -> None:
    """Bring ``driver`` back to a clean state (about 0.3 s): on ``about:blank``, with
    no cookies, storage or cache of any origin and no console log left over. Through
    DevTools: ``delete_all_cookies`` clears only the cookies of the page shown (and
    cookies are shared by every port of 127.0.0.1), not local or session storage."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": "*", "storageTypes": "all"})
    console_log(driver)


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """The session's Chromium; tests take ``page`` (the same driver, reset) instead."""
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: WebDriver) -> Iterator[WebDriver]:
    """The session's Chromium on ``about:blank`` with no cookies, storage or log.

    Afterwards it leaves the test's page for ``about:blank`` too, so that no request
    of that page is still open when the test's server shuts down."""
    reset(browser)
    yield browser
    from selenium.common.exceptions import WebDriverException

    with contextlib.suppress(WebDriverException):  # the test's own failure says more
        browser.get("about:blank")


def wait_for(
    driver: WebDriver,
    predicate: Callable[[WebDriver], T],
    timeout: float = 10.0,
    what: str = "",
) -> T:
    """Wait until ``predicate(driver)`` gives something truthy, and return it.

    An element that is not there yet or went stale while looked at counts as not yet.
    Fails after ``timeout`` seconds with an ``AssertionError`` naming ``what`` (else the
    predicate) and the page shown then."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.support.wait import WebDriverWait

    waiting = WebDriverWait(
        driver,
        timeout,
        poll_frequency=0.05,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )
    try:
        return waiting.until(predicate)
    except TimeoutException:
        raise AssertionError(
            f"not within {timeout} s: {what or predicate} (page: {driver.current_url})"
        ) from None


def artifacts_dir() -> Path:
    """Where browser tests keep their screenshots (made on first use)."""
    base = os.environ.get(ARTIFACTS_ENV)
    folder = (Path(base) if base else ROOT / "test-artifacts") / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save what the browser shows as ``<artifacts>/console/<name>.png``; its path."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name.removesuffix(".png")).strip("._") or "page"
    path = artifacts_dir() / f"{stem}.png"
    png = driver.get_screenshot_as_png()
    if not png:
        raise AssertionError(f"the browser gave no screenshot for {name!r}")
    path.write_bytes(png)
    return path


def console_log(driver: WebDriver) -> list[dict[str, Any]]:
    """The browser's console entries since the last call (reading them empties the
    buffer): dicts with ``level``, ``message``, ``source`` and ``timestamp``."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return entries


def csp_violations(driver: WebDriver) -> list[str]:
    """The Content-Security-Policy refusals Chromium logged since the last read of the
    console log (``console_log``, ``csp_violations``, ``page``'s reset)."""
    return [
        entry["message"]
        for entry in console_log(driver)
        if "Content Security Policy" in str(entry.get("message", ""))
    ]
