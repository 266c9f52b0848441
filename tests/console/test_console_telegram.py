"""The console beside a real Telegram chat (aiogram against the fake Bot API): a request
prompted in Telegram shows in the console, a button pressed there meanwhile takes it off
the live queue saying who decided, and a decision from a stale console page is refused."""

from __future__ import annotations

import re
from pathlib import Path

from echo_bot.console.auth import ConsoleUser
from tests.channels.test_telegram import (
    OWNER,
    action,
    answer_of,
    prompt_in,
    say,
    sent_id,
    telegram_bot,
    text_of,
)
from tests.console.helpers import APPEND_X, client, decide, queue_event, signed_in
from tests.waiting import eventually

REQUEST = re.compile(r"Request ([0-9a-f]{32})")


async def test_a_button_pressed_in_telegram_meanwhile_shows_who_decided(state_dir: Path) -> None:
    approver = ConsoleUser(channel="telegram", id=str(OWNER), name="owner")
    async with (
        telegram_bot(
            state_dir, "[console]\nenabled = true\n", telegram=f"approvers = [{OWNER}]"
        ) as (bot, api),
        client(bot) as session,
    ):
        csrf = await signed_in(bot, session, approver)
        async with session.get("/console/events") as stream:
            assert "Nothing is waiting" in await queue_event(stream)
            say(api, APPEND_X)
            prompt = await prompt_in(api)
            found = REQUEST.search(text_of(prompt))
            assert found is not None, text_of(prompt)
            request_id = found.group(1)
            shown = await queue_event(stream)
            while request_id not in shown:
                shown = await queue_event(stream)
            assert "Approve once" in shown

            pressed = api.push_callback(
                action(prompt, "approve_once"), user_id=OWNER, message_id=sent_id(prompt)
            )[1]
            await answer_of(api, pressed)
            while "Nothing is waiting" not in shown:
                shown = await queue_event(stream)
            assert f'approved by <span class="who">{OWNER}</span>' in shown, shown

        async with await decide(session, request_id, "deny", csrf) as stale:
            text = await stale.text()
        assert "Already decided" in text and f"approved by {OWNER}" in text, text
        workspace = bot.state_dir / "workspace" / "count.txt"
        await eventually(workspace.exists, what="the approved write")
        assert workspace.read_text() == "x"


async def test_allow_for_an_hour_shows_what_it_grants_before_it_is_pressed(
    state_dir: Path,
) -> None:
    approver = ConsoleUser(channel="telegram", id=str(OWNER), name="owner")
    async with (
        telegram_bot(
            state_dir, "[console]\nenabled = true\n", telegram=f"approvers = [{OWNER}]"
        ) as (bot, api),
        client(bot) as session,
    ):
        await signed_in(bot, session, approver)
        say(api, APPEND_X)
        prompt = await prompt_in(api)
        assert "Allow here for 1 h" in [b["text"] for row in prompt.params["reply_markup"]
                                        ["inline_keyboard"] for b in row]  # fmt: skip
        found = REQUEST.search(text_of(prompt))
        assert found is not None, text_of(prompt)
        async with session.get(f"/console/approvals/{found.group(1)}") as page:
            text = await page.text()
    assert "Allow here for 1 h</button>" in text
    scope = re.search(r'<p class="note scope">([^<]*)</p>', text)
    assert scope is not None, text
    assert scope.group(1).startswith(
        f"Allow here for 1 h: file_write runs unasked in telegram:{OWNER}"
    )
    assert "for an hour" in scope.group(1)
