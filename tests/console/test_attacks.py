"""Attacks on the console over real HTTP (aiohttp as the attacker's and the victim's
browser): each ``test_attack_…`` checks that the attack's effect did not happen AND that
the same request made legitimately does work, so none passes for a trivial reason.

The attacks a real browser is needed for (a page of another origin, script running in
the console's pages) are in test_attacks_browser.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import aiohttp
import pytest
from yarl import URL

from echo_bot.console import requests
from echo_bot.console.auth import COOKIE, ConsoleUser, link_url, new_link
from echo_bot.console.security import peer_key, same_origin
from echo_bot.events import DecisionVerb, approval_action
from echo_bot.secrets import Masker
from echo_bot.statuses import ApprovalStatus
from echo_bot.store.approvals import ApprovalRow
from tests.conftest import Bot, running_bot
from tests.console.helpers import (
    APPEND_X,
    CONSOLE,
    CSRF,
    OWNER,
    TELEGRAM_APPROVERS,
    base_url,
    client,
    console_bot,
    link_secret,
    sign_in,
    sign_in_link,
    signed_in,
)
from tests.fakes.channel import RecordingChannel
from tests.waiting import eventually

APPROVER_A = ConsoleUser(channel="telegram", id="1", name="1")
APPROVER_B = ConsoleUser(channel="telegram", id="3", name="3")
NOT_AN_APPROVER = ConsoleUser(channel="telegram", id="2", name="2")
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
FORGED = "did not come from this console"
BAD_LINK = "This sign-in link does not work"


def with_console(**settings: int) -> str:
    """The console's test config with these ``[console]`` settings."""
    lines = "".join(f"{key} = {value}\n" for key, value in settings.items())
    return CONSOLE.replace("[console]\nenabled = true\n", f"[console]\nenabled = true\n{lines}")


# -- helpers ------------------------------------------------------------------------------
def count_file(bot: Bot) -> Path:
    return bot.state_dir / "workspace" / "count.txt"


def appended(bot: Bot) -> str:
    """What APPEND_X calls wrote so far ("" before any ran)."""
    path = count_file(bot)
    return path.read_text() if path.exists() else ""


async def status_of(bot: Bot, request_id: str) -> str:
    row = await bot.store.run(lambda tx: tx.approvals.get(request_id))
    assert row is not None
    return str(row.status)


async def pending_append(bot: Bot) -> tuple[str, str]:
    """Ask for APPEND_X in the owner's chat: (its inbound id, the approval request's id)."""
    inbound = await bot.channel.say(APPEND_X)
    prompt = await bot.channel.prompt_for(inbound)
    assert prompt.approval is not None
    return inbound, prompt.approval.request_id


def origin(session: aiohttp.ClientSession) -> str:
    return str(session._base_url)


async def post(
    session: aiohttp.ClientSession,
    path: str,
    data: dict[str, str] | str | bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, str, aiohttp.ClientResponse]:
    """POST a form; (status, text, response) — redirects not followed."""
    sent = dict(FORM) if not isinstance(data, dict) else {}
    sent.update(headers if headers is not None else {"Origin": origin(session)})
    async with session.post(path, data=data, headers=sent, allow_redirects=False) as response:
        return response.status, await response.text(), response


async def decide(
    session: aiohttp.ClientSession,
    request_id: str,
    verb: str,
    csrf: str,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Press a decision's button (the 303 to its outcome followed)."""
    sent = headers if headers is not None else {"Origin": origin(session)}
    async with session.post(
        f"/console/approvals/{request_id}",
        data={"csrf": csrf, "verb": verb},
        headers=sent,
        allow_redirects=True,
    ) as response:
        return response.status, await response.text()


async def page_status(session: aiohttp.ClientSession, path: str) -> int:
    async with session.get(path, allow_redirects=False) as page:
        return page.status


@asynccontextmanager
async def telegram_bot(state_dir: Path, approvers: str = TELEGRAM_APPROVERS) -> AsyncIterator[Bot]:
    """The console on, with Telegram approvers 1 and 3 (2 is allowed, not an approver)."""
    channel = RecordingChannel("telegram")
    async with running_bot(state_dir, CONSOLE + approvers, channel=channel) as bot:
        yield bot


async def run_in_chat(bot: Bot, chat: str, file: str) -> str:
    """``/run touch FILE`` asked by ``chat``'s own user in their private chat; the request's
    id (its prompt goes there, or to the owner's queue for a non-approver)."""
    await bot.channel.say(f"/run touch {file}", chat=chat, sender=chat)

    async def made() -> str | None:
        rows = await bot.store.run(lambda tx: tx.approvals.list(ApprovalStatus.PENDING))
        return next((r.id for r in rows if file in str(r.args)), None)

    found: str = await eventually(made, what=f"a request for {file}")
    return found


# -- CSRF ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("on_both_engines")
async def test_attack_csrf_from_another_origin(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as victim, client(bot) as other:
        csrf = await signed_in(bot, victim)
        other_csrf = await signed_in(bot, other)  # the attacker's own session
        assert other_csrf != csrf
        _, request_id = await pending_append(bot)
        own = origin(victim)
        forged = {
            "a foreign Origin": ({"Origin": "https://evil.example"}, csrf),
            "a foreign Origin on our port": ({"Origin": own.replace("127.0.0.1", "evil")}, csrf),
            "Sec-Fetch-Site: cross-site": ({"Origin": own, "Sec-Fetch-Site": "cross-site"}, csrf),
            "Sec-Fetch-Site: same-site": ({"Origin": own, "Sec-Fetch-Site": "same-site"}, csrf),
            "no CSRF token": ({"Origin": own}, ""),
            "another session's token": ({"Origin": own}, other_csrf),
            "Origin: null": ({"Origin": "null"}, csrf),
            "Origin: null from another site": (
                {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
                csrf,
            ),
            "Origin: null from a sibling site": (
                {"Origin": "null", "Sec-Fetch-Site": "same-site"},
                csrf,
            ),
            "a malformed Origin": ({"Origin": "http://[::1"}, csrf),
        }
        for what, (headers, token) in forged.items():
            fields = {"verb": "approve"} | ({"csrf": token} if token else {})
            status, text, _ = await post(
                victim, f"/console/approvals/{request_id}", fields, headers
            )
            assert (status, FORGED in text) == (403, True), what
            assert await status_of(bot, request_id) == "pending", what
        assert appended(bot) == ""

        # Signing the victim in (with the attacker's link) or out from elsewhere: refused,
        # and the link is not used up by it.
        link = link_secret(await sign_in_link(bot))
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        status, text, response = await post(other, "/console/login", {"t": link}, evil)
        assert (status, FORGED in text, COOKIE in response.cookies) == (403, True, False)
        status, text, _ = await post(victim, "/console/logout", {"csrf": csrf}, evil)
        assert (status, FORGED in text) == (403, True)
        assert await page_status(victim, "/console/") == 200  # still signed in
        status, text, _ = await post(  # every form: a reminder's Cancel too
            victim, f"/console/reminders/{'0' * 32}/cancel", {"csrf": csrf}, evil
        )
        assert (status, FORGED in text) == (403, True)
        async with client(bot) as fresh:
            assert (await sign_in(fresh, link_url(base_url(bot), link))).status == 303

        # The same button, pressed on the console's own page, works: as Chromium sends it
        # from a page under "Referrer-Policy: no-referrer" (Origin: null), and as a
        # browser without Sec-Fetch-Site sends it under ours (same-origin: its Origin).
        from_our_page = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        status, text = await decide(victim, request_id, "approve", csrf, from_our_page)
        assert status == 200 and "Approved" in text
        await eventually(lambda: appended(bot) == "x", what="the approved call to run")


# -- sign-in links ------------------------------------------------------------------------
@pytest.mark.usefixtures("on_both_engines")
async def test_attack_replayed_login_link(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot:
        used = await sign_in_link(bot)
        async with client(bot) as first:
            response = await sign_in(first, used)
            assert response.status == 303 and COOKIE in response.cookies  # works once
        expired = link_url(
            base_url(bot),
            await bot.store.run(lambda tx: new_link(tx, OWNER, 60, now=time.time() - 3600)),
        )
        good = await sign_in_link(bot)
        secret = link_secret(good)
        mistyped = good.replace(secret, secret[:-1] + ("A" if secret[-1] != "A" else "B"))

        answers = []
        for link in (used, expired, mistyped):
            async with client(bot) as browser:
                response = await sign_in(browser, link)
                answers.append((response.status, await response.text()))
                assert COOKIE not in response.cookies
                assert "Set-Cookie" not in response.headers
                assert len(browser.cookie_jar) == 0
                assert await page_status(browser, "/console/") == 303
        assert answers[0][0] == 403 and BAD_LINK in answers[0][1]
        assert answers[0] == answers[1] == answers[2]  # never tells which it was

        async with client(bot) as browser:  # the link the mistyped one was made from
            assert (await sign_in(browser, good)).status == 303
            assert await page_status(browser, "/console/") == 200


async def test_attack_another_approvers_link(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as bot:
        own = await run_in_chat(bot, "1", "a.txt")  # A's own chat: A decides it
        b_private = await run_in_chat(bot, "3", "b.txt")  # B's own chat
        owner_queue = await run_in_chat(bot, "2", "q.txt")  # a non-approver: the owner's
        row = await bot.store.run(lambda tx: tx.approvals.get(owner_queue))
        assert row is not None and row.prompt_to == "echo-bot:approvals"

        async with client(bot) as a:
            a_csrf = await signed_in(bot, a, APPROVER_A)
            async with a.get("/console/") as page:
                queue = await page.text()
            assert "telegram:1 (console)" in queue and "telegram:3" not in queue
            assert own in queue and b_private not in queue and owner_queue not in queue
            (session,) = await bot.store.run(lambda tx: tx.console.sessions(time.time()))
            assert session.approver == APPROVER_A.to_json()  # bound to A, never B

            for hidden in (b_private, owner_queue):
                assert await page_status(a, f"/console/approvals/{hidden}") == 404
                for verb in ("approve", "deny"):
                    status, text = await decide(a, hidden, verb, a_csrf)
                    assert status == 404 and "no such request" in text.lower()
                assert await status_of(bot, hidden) == "pending"
            status, text = await decide(a, own, "approve", a_csrf)  # A's own: works
            assert status == 200 and "Approved" in text
            workspace = bot.state_dir / "workspace"
            await eventually(lambda: (workspace / "a.txt").exists(), what="A's call to run")

        async with client(bot) as owner:
            owner_csrf = await signed_in(bot, owner)
            async with owner.get("/console/") as page:
                queue = await page.text()
            assert b_private in queue and owner_queue in queue
            # The owner's decision page is not A's to read either.
            status, _, response = await post(
                owner, f"/console/approvals/{owner_queue}", {"csrf": owner_csrf, "verb": "deny"}
            )
            assert status == 303
            outcome = response.headers["Location"]
            assert await page_status(owner, outcome) == 200
        async with client(bot) as b:  # B decides their own request: B may
            b_csrf = await signed_in(bot, b, APPROVER_B)
            status, text = await decide(b, b_private, "deny", b_csrf)
            assert status == 200 and "Denied" in text
            async with b.get("/console/history") as page:
                assert b_private in await page.text()
        async with client(bot) as a_again:
            await signed_in(bot, a_again, APPROVER_A)
            assert await page_status(a_again, outcome) == 404
            for decided in (b_private, owner_queue):  # decided now: still not A's to see
                assert await page_status(a_again, f"/console/approvals/{decided}") == 404
            for path in ("/console/history", "/console/"):
                async with a_again.get(path) as page:
                    shown = await page.text()
                assert own in shown and b_private not in shown and owner_queue not in shown
            async with a_again.get("/console/audit") as page:  # nor their audit rows
                shown = await page.text()
            assert "a.txt" in shown and "b.txt" not in shown and "q.txt" not in shown
            assert b_private not in shown and owner_queue not in shown
        assert not (workspace / "b.txt").exists() and not (workspace / "q.txt").exists()


async def test_attack_non_approvers_link(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as bot:
        secret = await bot.store.run(lambda tx: new_link(tx, NOT_AN_APPROVER, 600))
        async with client(bot) as stranger:
            response = await sign_in(stranger, link_url(base_url(bot), secret))
            assert response.status == 403 and BAD_LINK in await response.text()
            assert COOKIE not in response.cookies and len(stranger.cookie_jar) == 0
            assert await page_status(stranger, "/console/") == 303
        live = await bot.store.run(lambda tx: tx.console.sessions(time.time()))
        assert live == []

        # An approver signs in; then the config stops naming them an approver.
        request_id = await run_in_chat(bot, "1", "a.txt")
        async with client(bot) as a:
            csrf = await signed_in(bot, a, APPROVER_A)
            assert await page_status(a, "/console/") == 200
            path = bot.daemon.runtime.loaded.path
            assert path is not None
            path.write_text(
                CONSOLE + TELEGRAM_APPROVERS.replace("approvers = [1, 3]", "approvers = [3]")
            )
            await bot.daemon.reload()
            assert await page_status(a, "/console/") == 303
            assert await page_status(a, f"/console/approvals/{request_id}") == 303
            status, _ = await decide(a, request_id, "approve", csrf)
            assert status == 401
            assert await status_of(bot, request_id) == "pending"
            # Signed out, not only turned away: named again, they sign in anew.
            live = await bot.store.run(lambda tx: tx.console.sessions(time.time()))
            assert live == []
            path.write_text(CONSOLE + TELEGRAM_APPROVERS)
            await bot.daemon.reload()
            assert await page_status(a, "/console/") == 303
        assert not (bot.state_dir / "workspace" / "a.txt").exists()


@pytest.mark.usefixtures("on_both_engines")
async def test_attack_session_fixation(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as browser:
        planted = "attacker-chosen"
        browser.cookie_jar.update_cookies({COOKIE: planted}, URL(base_url(bot)))
        assert await page_status(browser, "/console/") == 303  # a planted value is nobody

        response = await sign_in(browser, await sign_in_link(bot))
        assert response.status == 303
        first = response.cookies[COOKIE].value
        assert first and first != planted
        morsel = response.cookies[COOKIE]
        assert morsel["httponly"] and morsel["samesite"] == "Strict"
        assert await page_status(browser, "/console/") == 200

        async with client(bot) as attacker:
            attacker.cookie_jar.update_cookies({COOKIE: planted}, URL(base_url(bot)))
            assert await page_status(attacker, "/console/") == 303

        # The same browser signs in again: the session it had is ended.
        again = await sign_in(browser, await sign_in_link(bot))
        assert again.status == 303
        second = again.cookies[COOKIE].value
        assert second not in (first, planted)
        async with client(bot) as stolen:
            stolen.cookie_jar.update_cookies({COOKIE: first}, URL(base_url(bot)))
            assert await page_status(stolen, "/console/") == 303
        async with client(bot) as copy:
            copy.cookie_jar.update_cookies({COOKIE: second}, URL(base_url(bot)))
            assert await page_status(copy, "/console/") == 200
        live = await bot.store.run(lambda tx: tx.console.sessions(time.time()))
        assert len(live) == 1


# -- framing, redirects -------------------------------------------------------------------
async def test_attack_clickjacking(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as browser:
        _, request_id = await pending_append(bot)
        anonymous = ["/console", "/console/", "/console/login", "/console/login?t=x"]
        anonymous += ["/console/history", "/console/static/console.css", "/console/nowhere"]
        signed = [*anonymous[:2], "/console/history", f"/console/approvals/{request_id}"]
        signed += ["/console/approvals/nope", "/console/decisions/nope", "/console/nowhere"]
        signed += ["/console/audit", "/console/audit?chat=%ff&from=x", "/console/status"]

        def framed(response: aiohttp.ClientResponse, what: str) -> None:
            assert response.headers.get("X-Frame-Options") == "DENY", what
            csp = response.headers.get("Content-Security-Policy", "")
            assert "frame-ancestors 'none'" in csp, what

        for path in anonymous:
            async with browser.get(path, allow_redirects=False) as page:
                framed(page, path)
        status, _, response = await post(browser, "/console/login", {"t": "nope"})
        assert status == 403
        framed(response, "a refused sign-in")
        csrf = await signed_in(bot, browser)
        for path in signed:
            async with browser.get(path, allow_redirects=False) as page:
                framed(page, path)
        async with browser.get("/console/events") as stream:
            framed(stream, "the live stream")
        status, _, response = await post(
            browser, f"/console/approvals/{request_id}", {"csrf": "x", "verb": "deny"}
        )
        assert status == 403
        framed(response, "a refused decision")
        status, _, response = await post(
            browser, f"/console/approvals/{request_id}", {"csrf": csrf, "verb": "deny"}
        )
        assert status == 303
        framed(response, "a decision")


OPEN_REDIRECTS = [
    "https://evil.example",
    "//evil.example",
    "/\\evil.example",
    "/console/../..//evil",
    "/console/..//evil.example",
    "/console//evil.example",
    "javascript:alert(1)",
    "/console/javascript:alert(1)",
    "\t//evil.example",
    " /console/",
    "/console/\r\nLocation: https://evil.example",
    "https:evil.example",
]
# As they would be written in the form's body: percent-encoded once, and twice.
ENCODED = [
    "%2F%2Fevil.example",
    "%2f%2fevil.example",
    "%252F%252Fevil.example",
    "/console/%2e%2e/%2e%2e//evil",
    "%2Fconsole%2F%2E%2E%2F%2E%2E%2F%2Fevil",
    "/console/%5Cevil.example",
    "/%5Cevil.example",
    "https%3A%2F%2Fevil.example",
    "%0D%0ALocation:%20https://evil.example",
    "/console/%0d%0aSet-Cookie:%20x=1",
]


async def test_attack_open_redirect_in_the_login_flow(state_dir: Path) -> None:
    async with running_bot(state_dir, with_console(login_rate=1000)) as bot:

        async def lands(raw_next: str) -> str:
            """Sign in with a fresh link and ``next`` as written in the body: where to."""
            secret = link_secret(await sign_in_link(bot))
            async with client(bot) as browser:
                status, _, response = await post(
                    browser, "/console/login", f"t={secret}&next={raw_next}"
                )
                assert status == 303, raw_next
                location = response.headers.getall("Location")
                assert len(location) == 1 and "Set-Cookie: x" not in str(response.headers)
                return location[0]

        for target in OPEN_REDIRECTS:
            assert await lands(quote(target, safe="")) == "/console/", target
        for target in ENCODED:
            assert await lands(target) == "/console/", target
        # A console page is kept: the check is not "always /console/".
        assert await lands("%2Fconsole%2Fhistory") == "/console/history"
        assert await lands("/console/approvals/abc") == "/console/approvals/abc"

        # The link's page carries only a safe target into its form, whatever it was given.
        async with client(bot) as browser:
            for target in [*OPEN_REDIRECTS, "/console/history"]:
                async with browser.get("/console/login", params={"t": "x", "next": target}) as page:
                    html = await page.text()
                expected = "/console/history" if target == "/console/history" else "/console/"
                assert f'name="next" value="{expected}"' in html, target
            # Arriving by a link from another site (no cookie sent), the page that loads
            # it again from here keeps to the console too.
            for target in ("/console/history?;url=//evil.example", "/console/approvals/%2F%2Fe"):
                async with browser.get(
                    URL(target, encoded=True), headers={"Sec-Fetch-Site": "cross-site"}
                ) as page:
                    html = await page.text()
                refresh = html.split('http-equiv="refresh" content="', 1)[1].split('"', 1)[0]
                assert refresh == f"0;url={target}", refresh
            # Not signed in: sent to sign in, and back to the console page asked for.
            async with browser.get("/console/history", allow_redirects=False) as page:
                assert page.headers["Location"] == "/console/login?next=/console/history"


# -- decisions that come too late ------------------------------------------------------------
async def test_attack_decision_on_an_expired_request(state_dir: Path) -> None:
    expiring = '[approvals]\ntimeout = "1s"\n'
    async with console_bot(state_dir, expiring) as bot, client(bot) as browser:
        csrf = await signed_in(bot, browser)
        inbound, request_id = await pending_append(bot)
        reply = await bot.channel.reply_to(inbound)
        assert "APPROVAL_EXPIRED" in reply.text
        assert await status_of(bot, request_id) == "expired"

        for verb in ("approve", "allow", "deny"):
            status, text = await decide(browser, request_id, verb, csrf)
            assert status == 200 and "Not applied" in text and "expired" in text.lower(), verb
        assert await status_of(bot, request_id) == "expired"
        assert appended(bot) == ""

    # The same button on a request still pending (the default timeout) approves it.
    async with console_bot(state_dir) as bot, client(bot) as browser:
        csrf = await signed_in(bot, browser)
        _, request_id = await pending_append(bot)
        status, text = await decide(browser, request_id, "approve", csrf)
        assert status == 200 and "Approved" in text
        await eventually(lambda: appended(bot) == "x", what="the approved call to run")


@pytest.mark.usefixtures("on_both_engines")
async def test_attack_decision_on_an_already_decided_request(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as browser, client(bot) as second:
        csrf = await signed_in(bot, browser)
        second_csrf = await signed_in(bot, second)
        inbound, request_id = await pending_append(bot)
        status, text = await decide(browser, request_id, "approve", csrf)
        assert status == 200 and "Approved" in text
        await bot.channel.reply_to(inbound)
        assert appended(bot) == "x"

        for session, token in ((browser, csrf), (second, second_csrf)):
            for verb in ("approve", "allow", "deny"):
                status, text = await decide(session, request_id, verb, token)
                assert status == 200 and "Not applied" in text, verb
                assert "Already decided" in text and "alice (console)" in text, verb
        # Decided in the chat meanwhile: the console says who.
        inbound, in_chat = await pending_append(bot)
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        await bot.channel.press(approval_action(DecisionVerb.DENY, in_chat))
        await bot.channel.reply_to(inbound)
        status, text = await decide(browser, in_chat, "approve", csrf)
        assert "Already decided" in text and "owner" in text
        assert await status_of(bot, request_id) == "approved"
        assert await status_of(bot, in_chat) == "denied"
        assert appended(bot) == "x"  # ran once


# -- rate limits, hostile bodies ------------------------------------------------------------
async def test_attack_login_and_decision_rate_limits(state_dir: Path) -> None:
    limited = with_console(login_rate=3, decision_rate=3)
    async with running_bot(state_dir, limited) as bot, client(bot) as guesser:
        for _ in range(3):
            status, text, _ = await post(guesser, "/console/login", {"t": "guess"})
            assert status == 403 and BAD_LINK in text
        status, text, response = await post(guesser, "/console/login", {"t": "guess"})
        assert status == 429 and "Too many" in text
        assert int(response.headers["Retry-After"]) >= 1
        assert COOKIE not in response.cookies
        # Behind a proxy the guesser and the owner share an address: junk posts (not
        # even a form) never keep a working link from signing in.
        async with guesser.post("/console/login", data=b"\xff" * 10) as junk:
            assert junk.status == 429
        good = await sign_in_link(bot)
        status, _, response = await post(
            guesser, "/console/login", {"t": link_secret(good), "next": "/console/"}
        )
        assert status == 303 and COOKIE in response.cookies

    async with running_bot(state_dir, limited) as bot, client(bot) as fast, client(bot) as calm:
        csrf = await signed_in(bot, fast)
        calm_csrf = await signed_in(bot, calm)
        _, request_id = await pending_append(bot)
        for _ in range(3):
            status, _ = await decide(fast, "0" * 32, "approve", csrf)
            assert status == 404
        async with fast.post(
            f"/console/approvals/{request_id}",
            data={"csrf": csrf, "verb": "approve"},
            headers={"Origin": origin(fast)},
            allow_redirects=False,
        ) as response:
            assert response.status == 429 and "Too many" in await response.text()
            assert int(response.headers["Retry-After"]) >= 1
        assert await status_of(bot, request_id) == "pending"
        # Per session: another one still decides.
        status, text = await decide(calm, request_id, "approve", calm_csrf)
        assert status == 200 and "Approved" in text
        await eventually(lambda: appended(bot) == "x", what="the approved call to run")


async def test_attack_oversized_and_malformed_forms(state_dir: Path) -> None:
    async with console_bot(state_dir) as bot, client(bot) as browser:
        csrf = await signed_in(bot, browser)
        _, request_id = await pending_append(bot)
        decide_path = f"/console/approvals/{request_id}"
        fields = f"csrf={csrf}&verb=approve"
        hostile: dict[str, bytes] = {
            "a 1 MB body": (fields + "&pad=" + "a" * (1 << 20)).encode(),
            "invalid UTF-8": fields.encode() + b"&x=\xff\xfe\xc3",
            "thousands of fields": (fields + "".join(f"&f{i}=1" for i in range(5000))).encode(),
            "a NUL and nothing else": b"\x00",
            "a token in percent-encoded invalid UTF-8": f"csrf=%ff{csrf}&verb=approve".encode(),
        }

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: it must count
            for _ in range(64):
                yield b"a" * 16384

        async with browser.post(
            decide_path, data=chunks(), headers={**FORM, "Origin": origin(browser)}
        ) as response:
            assert response.status == 413
        for path in ("/console/login", decide_path, "/console/logout"):
            for what, body in hostile.items():
                status, _, _ = await post(browser, path, body)
                assert 400 <= status < 500, (path, what, status)
                assert await status_of(bot, request_id) == "pending", (path, what)
        # Hostile headers and queries, too.
        odd: list[tuple[str, dict[str, str]]] = [
            ("/console/login?t=%ff%fe&next=%ff", {}),
            ("/console/", {"Cookie": f"{COOKIE}=" + "x" * 300}),
            ("/console/", {"Cookie": f"{COOKIE}=%ff%fe"}),
            ("/console/history?page=-1e309", {}),
            ("/console/history?page=99999999999999999999", {}),
        ]
        for path, headers in odd:
            async with browser.get(path, headers=headers, allow_redirects=False) as page:
                assert page.status < 500, (path, headers, page.status)
        assert appended(bot) == ""

        # The daemon keeps serving: the page, and the same decision sent properly.
        assert await page_status(browser, "/console/") == 200
        status, text = await decide(browser, request_id, "approve", csrf)
        assert status == 200 and "Approved" in text
        await eventually(lambda: appended(bot) == "x", what="the approved call to run")
        async with browser.get("/console/") as page:
            assert CSRF.search(await page.text()) is not None


@pytest.mark.usefixtures("on_both_engines")
async def test_attack_an_approver_decides_a_request_prompted_in_another_approvers_private_chat(
    state_dir: Path,
) -> None:
    """Round 3, finding 3: approvers 1 and 3, [approvals] default_chat telegram:1. User 2
    (not an approver) asks; the prompt goes to approver 1's private chat, whose buttons
    only 1 sees. Approver 3 signed in to the console saw it in Pending and approved it:
    it ran. The console decides exactly what a button would: it is 1's alone."""
    routed = TELEGRAM_APPROVERS + '[approvals]\ndefault_chat = "telegram:1"\n'
    async with telegram_bot(state_dir, routed) as bot, client(bot) as three:
        csrf = await signed_in(bot, three, APPROVER_B)
        request_id = await run_in_chat(bot, "2", "q.txt")
        row = await bot.store.run(lambda tx: tx.approvals.get(request_id))
        assert row is not None and row.prompt_to == "telegram:1"
        async with three.get("/console/") as pending_page:
            assert request_id not in await pending_page.text()
        assert await page_status(three, f"/console/approvals/{request_id}") == 404
        await post(three, f"/console/approvals/{request_id}", {"csrf": csrf, "verb": "approve"})
        assert await status_of(bot, request_id) == "pending"
        assert not (bot.state_dir / "workspace" / "q.txt").exists()
        async with client(bot) as one:  # approver 1, whose chat it is, decides it
            one_csrf = await signed_in(bot, one, APPROVER_A)
            await post(one, f"/console/approvals/{request_id}", {"csrf": one_csrf, "verb": "deny"})
        assert await status_of(bot, request_id) == "denied"


def test_attack_a_secret_in_a_grants_scope_is_masked_where_allow_for_is_offered() -> None:
    """A tool whose grant covers all its arguments (an MCP tool naming none): the
    "Allow here for 1 h" line shows them, masked as the call is."""
    secret = "ghp_S3cr3tT0kenValue1234567890abcd"
    args = {"webhook": f"https://hooks.example.com/{secret}", "text": "deploy done"}
    now = time.time()
    row = ApprovalRow(
        id="a" * 32, turn_id="t", session_key="telegram:1", trace_id="tr", tool="notify__post",
        args=args, args_hash="h", risk="write", requested_by={"id": "1"}, origin="telegram:1",
        prompt_to="telegram:1", prompt_outbound_id=None, status=ApprovalStatus.PENDING,
        verb=None, decided_by=None, decided_at=None, created_at=now, expires_at=now + 600,
        grant_scope=json.dumps(args, sort_keys=True), reason="",
    )  # fmt: skip
    gate = SimpleNamespace(masker=Masker([secret]))
    shown = requests.view(gate, row, brief=True)  # type: ignore[arg-type]
    assert "hooks.example.com" in shown.allow_scope and secret not in shown.allow_scope


def test_failed_sign_ins_are_counted_by_address_and_an_ipv6_hosts_whole_64() -> None:
    assert peer_key("2001:db8:1:2::1") == peer_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert peer_key("2001:db8:1:3::1") != peer_key("2001:db8:1:2::1")
    assert peer_key("192.0.2.7") == "192.0.2.7" and peer_key(None) == "?"


def test_a_form_post_from_a_browser_without_sec_fetch_site_is_told_by_its_origin() -> None:
    """Safari before 16.4 sends no Sec-Fetch-Site: under ``same-origin`` its posts from
    the console's pages carry the console's Origin and count; another site's do not."""
    from aiohttp.test_utils import make_mocked_request

    def post(headers: dict[str, str]) -> bool:
        request = make_mocked_request(
            "POST", "/console/login", headers={"Host": "bot.example.org", **headers}
        )
        return same_origin(request, None)

    assert post({"Origin": "https://bot.example.org"})
    assert not post({"Origin": "https://evil.example.com"})
    assert not post({"Origin": "null"})  # only with Sec-Fetch-Site: same-origin
    assert post({"Origin": "null", "Sec-Fetch-Site": "same-origin"})
