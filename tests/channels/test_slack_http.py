"""The Slack channel in HTTP mode: the Events API and interactivity POSTed to the
daemon's ``/slack/events``, signed as Slack signs them. The signatures the tests send
are also checked by slack-sdk's own ``SignatureVerifier`` (an implementation
independent of the channel's use of it), so what the daemon accepts is what Slack's
SDK calls valid, and what it refuses is what that verifier refuses."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from slack_sdk.signature import SignatureVerifier

from tests.channels.contract.drivers import SLACK_DM, SLACK_OWNER, SlackHttpDriver, slack_shown
from tests.waiting import eventually


@pytest.fixture
async def chat(state_dir: Path) -> AsyncIterator[SlackHttpDriver]:
    made = SlackHttpDriver(state_dir)
    async with made.peer():
        yield made


def message_event(chat: SlackHttpDriver, text: str) -> dict[str, object]:
    return {"type": "message", "channel": SLACK_DM, "user": SLACK_OWNER, "text": text,
            "ts": chat.next_ts(), "channel_type": "im"}  # fmt: skip


async def test_forged_stale_and_unsigned_deliveries_are_refused_and_nothing_is_stored(
    chat: SlackHttpDriver,
) -> None:
    verifier = SignatureVerifier(chat.slack.signing_secret)
    async with chat.running():
        body = chat.slack.event_body(message_event(chat, "say:forged"))
        wrong = chat.slack.signed_headers(body, secret="not-the-secret")
        stale = chat.slack.signed_headers(body, timestamp=int(time.time()) - 6 * 60)
        tampered_body = body.replace(b"say:forged", b"say:tamper")
        tampered = chat.slack.signed_headers(body)
        for sent_body, headers in (
            (body, wrong), (body, stale), (tampered_body, tampered),
            (body, {"Content-Type": "application/json"}),
        ):  # fmt: skip
            assert not verifier.is_valid_request(sent_body, headers)
            status, answer = await chat.post(sent_body, headers)
            assert status == 401 and "signature" in answer, (status, answer)
        good = chat.slack.signed_headers(body)
        assert verifier.is_valid_request(body, good)
        status, _answer = await chat.post(body, good)
        assert status == 200
        await chat.wait_received("echo: forged")
        texts = await chat.inbound_texts()
    assert texts.count("say:forged") == 1 and "say:tamper" not in texts


async def test_the_url_check_is_answered_and_bad_bodies_get_a_clear_4xx(
    chat: SlackHttpDriver,
) -> None:
    async with chat.running():
        status, answer = await chat.post(chat.slack.url_verification_body("abc123"))
        assert status == 200 and json.loads(answer) == {"challenge": "abc123"}
        # Not a delivery at all: 400. A delivery of an event it cannot read: taken (200),
        # or Slack would send it again and again.
        for body, expected in ((b"not json", 400), (b"[1, 2]", 400),
                               (b'{"type": "event_callback", "event": 7}', 200)):  # fmt: skip
            status, answer = await chat.post(body)
            assert status == expected, (body, status, answer)
            if expected == 400:
                assert "not a Slack delivery" in answer
        status, _ = await chat.post(b"{" + b" " * (2 * 1024 * 1024) + b"}")
        assert status == 413
        await chat.say("say:fine")
        await chat.wait_received("echo: fine")


async def test_a_retried_delivery_is_the_same_inbound(chat: SlackHttpDriver) -> None:
    async with chat.running():
        body = chat.slack.event_body(message_event(chat, "say:retried"))
        assert (await chat.post(body))[0] == 200
        retry = {**chat.slack.signed_headers(body), **chat.slack.retry_headers(1)}
        assert (await chat.post(body, retry))[0] == 200  # Slack did not see the 200 in time
        await chat.wait_received("echo: retried")
        await chat.say("say:next")
        await chat.wait_received("echo: next")
        assert chat.received().count("echo: retried") == 1
        assert (await chat.inbound_texts()).count("say:retried") == 1


async def test_a_button_press_posted_as_a_form_decides_the_request(
    chat: SlackHttpDriver,
) -> None:
    async with chat.running():
        await chat.say("run:posted")
        shown = await chat.prompt()
        await chat.decide(shown, approve=True)
        await chat.wait_received("ran: posted")
        ts, _ids = shown.handle
        await eventually(
            lambda: "Approved" in slack_shown(chat.slack.message(SLACK_DM, ts) or {}),
            timeout=15, what="the prompt updated",
        )  # fmt: skip


async def test_malformed_signature_headers_are_refused_not_a_server_error(
    chat: SlackHttpDriver,
) -> None:
    """Regression (review): slack-sdk's verifier raises on some malformed input rather
    than answering False, and those requests got a 500 with a traceback."""
    async with chat.running():
        body = chat.slack.event_body(message_event(chat, "say:odd"))
        good = chat.slack.signed_headers(body)
        for headers, sent in (
            ({**good, "X-Slack-Request-Timestamp": "abc"}, body),
            ({**good, "X-Slack-Signature": "v0=é"}, body),
            (chat.slack.signed_headers(b"\xff\xfe"), b"\xff\xfe"),
        ):
            status, answer = await chat.post(sent, headers)
            assert status == 401, (headers, status, answer)
        await chat.say("say:fine")
        await chat.wait_received("echo: fine")
