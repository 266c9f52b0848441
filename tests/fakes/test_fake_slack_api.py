"""The fake Slack, exercised through the real slack_sdk clients.

Every feature is reached the way the channel will reach it: AsyncWebClient for the Web
API and files, SocketModeClient for Socket Mode, SignatureVerifier for HTTP mode. If the
fake drifts from what the SDK sends or expects, these tests fail first.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack_api import DEFAULT_SCOPES, Envelope, FakeSlack
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
def web(slack: FakeSlack) -> AsyncWebClient:
    # No session given: the SDK opens and closes one per request, so nothing leaks.
    return AsyncWebClient(token=slack.bot_token, base_url=slack.base_url)


def button(action_id: str, label: str = "Approve", **extra: Any) -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": action_id,
        "text": {"type": "plain_text", "text": label},
        **extra,
    }


def approval_blocks(*, label: str = "Approve") -> list[dict[str, Any]]:
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Run* `rm -rf build`?"}},
        {
            "type": "actions",
            "block_id": "approval",
            "elements": [
                button("approve", label, value="42", style="primary"),
                button("deny", "Deny", value="42", style="danger"),
            ],
        },
    ]


class SocketPeer:
    """A real SocketModeClient and what reached its listeners."""

    def __init__(self, client: SocketModeClient) -> None:
        self.client = client
        self.requests: list[SocketModeRequest] = []
        self.raw: list[dict[str, Any]] = []  # what reached the SDK's message listeners
        self.frames: list[dict[str, Any]] = []  # every text frame, disconnects included
        self.auto_ack = True

    async def on_request(self, client: Any, request: SocketModeRequest) -> None:
        self.requests.append(request)
        if self.auto_ack:
            await client.send_socket_mode_response(
                SocketModeResponse(envelope_id=request.envelope_id)
            )

    async def on_message(self, client: Any, message: dict[str, Any], raw: str | None) -> None:
        self.raw.append(message)

    async def on_frame(self, message: aiohttp.WSMessage) -> None:
        self.frames.append(json.loads(message.data))

    async def wait_request(self, count: int = 1, timeout: float = 2.0) -> SocketModeRequest:
        await eventually(lambda: len(self.requests) >= count, timeout, "socket requests")
        return self.requests[count - 1]


@asynccontextmanager
async def socket_peer(
    slack: FakeSlack, *, auto_ack: bool = True, ping_interval: float = 0.1
) -> AsyncIterator[SocketPeer]:
    client = SocketModeClient(
        app_token=slack.app_token,
        web_client=AsyncWebClient(base_url=slack.base_url),
        ping_interval=ping_interval,
    )
    peer = SocketPeer(client)
    peer.auto_ack = auto_ack
    client.socket_mode_request_listeners.append(peer.on_request)
    client.message_listeners.append(peer.on_message)
    client.on_message_listeners.append(peer.on_frame)
    try:
        await client.connect()  # type: ignore[no-untyped-call]  # slack_sdk leaves it untyped
        await slack.wait_connected(timeout=2)
        yield peer
    finally:
        await client.close()  # type: ignore[no-untyped-call]  # slack_sdk leaves it untyped


# ---------------------------------------------------------------------------------------------
# Web API: auth
# ---------------------------------------------------------------------------------------------


async def test_auth_test_answers_the_bot_identity_and_scopes(
    slack: FakeSlack, web: AsyncWebClient
) -> None:
    answer = await web.auth_test()
    assert answer["user_id"] == "U0BOT"
    assert answer["bot_id"] == "B0BOT"
    assert answer["team_id"] == "T0TEAM"
    assert answer["is_enterprise_install"] is False
    assert answer.headers["x-oauth-scopes"].split(",") == list(DEFAULT_SCOPES)
    call = await slack.wait_for_call("auth.test")
    assert call.ok and call.status == 200 and call.token == slack.bot_token


async def test_bad_tokens_are_refused_as_slack_does(slack: FakeSlack) -> None:
    bad = AsyncWebClient(token="xoxb-wrong", base_url=slack.base_url)
    with pytest.raises(SlackApiError) as caught:
        await bad.chat_postMessage(channel="C0GENERAL", text="hi")
    assert caught.value.response["error"] == "invalid_auth"
    assert caught.value.response.status_code == 200

    anonymous = AsyncWebClient(base_url=slack.base_url)
    with pytest.raises(SlackApiError) as caught:
        await anonymous.auth_test()
    assert caught.value.response["error"] == "not_authed"

    app_token_as_bot = AsyncWebClient(token=slack.app_token, base_url=slack.base_url)
    with pytest.raises(SlackApiError) as caught:
        await app_token_as_bot.auth_test()
    assert caught.value.response["error"] == "not_allowed_token_type"

    web = AsyncWebClient(token=slack.bot_token, base_url=slack.base_url)
    with pytest.raises(SlackApiError) as caught:
        await web.apps_connections_open(app_token="xapp-wrong")
    assert caught.value.response["error"] == "invalid_auth"
    assert slack.messages == {}


async def test_unknown_method_and_missing_scope(slack: FakeSlack, web: AsyncWebClient) -> None:
    with pytest.raises(SlackApiError) as caught:
        await web.api_call("chat.postMessagee", json={"channel": "C0GENERAL", "text": "x"})
    assert caught.value.response["error"] == "unknown_method"
    assert caught.value.response.status_code == 200

    async with FakeSlack(scopes=("im:history",)) as narrow:
        client = AsyncWebClient(token=narrow.bot_token, base_url=narrow.base_url)
        with pytest.raises(SlackApiError) as caught:
            await client.chat_postMessage(channel="C0GENERAL", text="hi")
        assert caught.value.response["error"] == "missing_scope"
        assert caught.value.response["needed"] == "chat:write"
        assert narrow.messages == {}


# ---------------------------------------------------------------------------------------------
# Web API: messages
# ---------------------------------------------------------------------------------------------


async def test_post_message_stores_the_message(slack: FakeSlack, web: AsyncWebClient) -> None:
    first = await web.chat_postMessage(channel="C0GENERAL", text="hello", unfurl_links=False)
    second = await web.chat_postMessage(
        channel="C0GENERAL", text="approve?", blocks=approval_blocks(), thread_ts=first["ts"]
    )
    assert first["channel"] == "C0GENERAL"
    assert float(second["ts"]) > float(first["ts"])
    assert second["message"]["bot_id"] == "B0BOT"
    assert second["message"]["user"] == "U0BOT"
    assert second["message"]["thread_ts"] == first["ts"]
    assert second["message"]["blocks"] == approval_blocks()
    stored = slack.messages["C0GENERAL"]
    assert [m["text"] for m in stored] == ["hello", "approve?"]
    assert stored[0]["unfurl_links"] is False and stored[0]["blocks"] == []
    assert stored[1] is slack.message("C0GENERAL", second["ts"])
    call = slack.calls_to("chat.postMessage")[1]
    assert call.params["blocks"] == approval_blocks()  # sent as JSON by the SDK


async def test_form_encoded_blocks_are_decoded(slack: FakeSlack, web: AsyncWebClient) -> None:
    """Other methods (and other clients) send forms with blocks as JSON text."""
    answer = await web.api_call(
        "chat.postMessage",
        data={"channel": "D0OWNER", "text": "form", "blocks": json.dumps(approval_blocks())},
    )
    assert answer["ok"]
    assert slack.messages["D0OWNER"][0]["blocks"] == approval_blocks()
    assert slack.calls[-1].params["blocks"] == approval_blocks()


async def test_posting_to_a_user_id_goes_to_the_dm(slack: FakeSlack, web: AsyncWebClient) -> None:
    answer = await web.chat_postMessage(channel="U0OWNER", text="psst")
    assert answer["channel"] == "D0OWNER"
    assert slack.messages["D0OWNER"][0]["text"] == "psst"


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"channel": "general", "text": "x"}, "channel_not_found"),
        ({"channel": "C0GENERAL"}, "no_text"),
        ({"channel": "C0GENERAL", "text": ""}, "no_text"),
        ({"channel": "C0GENERAL", "text": "x" * 40_001}, "msg_too_long"),
    ],
)
async def test_post_message_errors(
    slack: FakeSlack, web: AsyncWebClient, kwargs: dict[str, Any], error: str
) -> None:
    with pytest.raises(SlackApiError) as caught:
        await web.chat_postMessage(**kwargs)
    assert caught.value.response["error"] == error
    assert slack.messages == {}
    assert not slack.calls[-1].ok


async def test_unknown_channels_can_be_declared(slack: FakeSlack, web: AsyncWebClient) -> None:
    slack.unknown_channels.add("C0GONE")
    with pytest.raises(SlackApiError) as caught:
        await web.chat_postMessage(channel="C0GONE", text="x")
    assert caught.value.response["error"] == "channel_not_found"


async def test_a_76_character_button_label_is_invalid_blocks(
    slack: FakeSlack, web: AsyncWebClient
) -> None:
    ok = await web.chat_postMessage(
        channel="C0GENERAL", text="t", blocks=approval_blocks(label="x" * 75)
    )
    assert ok["ok"]
    with pytest.raises(SlackApiError) as caught:
        await web.chat_postMessage(
            channel="C0GENERAL", text="t", blocks=approval_blocks(label="x" * 76)
        )
    response = caught.value.response
    assert response["error"] == "invalid_blocks"
    assert any("/blocks/1/elements/0/text/text" in e for e in response["errors"])
    assert len(slack.messages["C0GENERAL"]) == 1


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


@pytest.mark.parametrize(
    "blocks",
    [
        [_section("x")] * 51,
        [{"type": "input", "label": {"type": "plain_text", "text": "x"}}],
        [_section("x" * 3001)],
        [{"type": "section", "text": {"type": "markdown", "text": "x"}}],
        [{"type": "header", "text": {"type": "plain_text", "text": "x" * 151}}],
        [{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}],
        [{"type": "actions", "elements": [button(f"b{i}") for i in range(26)]}],
        [{"type": "actions", "elements": [button("same"), button("same", "Other")]}],
        [_section("x") | {"accessory": button("same")},
         {"type": "actions", "elements": [button("same")]}],
        [{"type": "actions", "elements": [button("b", style="secondary")]}],
        [{"type": "actions", "elements": [button("b" * 256)]}],
        [{"type": "actions", "elements": [button("b", value="v" * 2001)]}],
        [{"type": "actions", "elements": [button("b") | {"text": {"type": "mrkdwn",
                                                                  "text": "x"}}]}],
        [_section("x") | {"block_id": "b" * 256}],
        [_section("x") | {"block_id": "one"}, _section("y") | {"block_id": "one"}],
        [{"type": "rich_text", "elements": [{"type": "rich_text_section",
                                             "elements": [{"type": None, "text": "x"}]}]}],
        [{"type": "rich_text", "elements": [{"type": "paragraph", "elements": []}]}],
        [{"type": "rich_text", "elements": [{"type": "rich_text_list", "style": "bullet",
                                             "elements": [{"type": "text", "text": "x"}]}]}],
        [{"type": "image", "image_url": "https://example.com/a.png"}],
    ],
)  # fmt: skip
async def test_block_kit_limits_are_enforced(
    slack: FakeSlack, web: AsyncWebClient, blocks: list[dict[str, Any]]
) -> None:
    with pytest.raises(SlackApiError) as caught:
        await web.chat_postMessage(channel="C0GENERAL", text="fallback", blocks=blocks)
    assert caught.value.response["error"] == "invalid_blocks"
    assert caught.value.response["errors"]
    assert slack.messages == {}


async def test_valid_rich_blocks_pass(slack: FakeSlack, web: AsyncWebClient) -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Report"}},
        {"type": "divider"},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "by *echo*"}]},
        {
            "type": "rich_text",
            "elements": [
                {
                    "type": "rich_text_section",
                    "elements": [
                        {"type": "text", "text": "hi ", "style": {"bold": True}},
                        {"type": "user", "user_id": "U0OWNER"},
                        {"type": "link", "url": "https://example.com"},
                    ],
                },
                {"type": "rich_text_preformatted", "elements": [{"type": "text", "text": "ls"}]},
                {"type": "rich_text_quote", "elements": [{"type": "text", "text": "q"}]},
                {
                    "type": "rich_text_list",
                    "style": "ordered",
                    "elements": [
                        {"type": "rich_text_section", "elements": [{"type": "text", "text": "1"}]},
                    ],
                },
            ],
        },
        {"type": "image", "image_url": "https://example.com/a.png", "alt_text": "a"},
    ]
    answer = await web.chat_postMessage(channel="C0GENERAL", text="report", blocks=blocks)
    assert answer["message"]["blocks"] == blocks


async def test_malformed_blocks_json_is_invalid_blocks_format(
    slack: FakeSlack, web: AsyncWebClient
) -> None:
    for raw in ('[{"type": "section"', '{"type": "divider"}'):
        with pytest.raises(SlackApiError) as caught:
            await web.api_call(
                "chat.postMessage", data={"channel": "C0GENERAL", "text": "x", "blocks": raw}
            )
        assert caught.value.response["error"] == "invalid_blocks_format"
    assert slack.messages == {}


async def test_update_edits_in_place_and_keeps_omitted_blocks(
    slack: FakeSlack, web: AsyncWebClient
) -> None:
    posted = await web.chat_postMessage(
        channel="C0GENERAL", text="approve?", blocks=approval_blocks()
    )
    stored = slack.message("C0GENERAL", posted["ts"])
    assert stored is not None and stored["edited"] is None

    answer = await web.chat_update(channel="C0GENERAL", ts=posted["ts"], text="working…")
    assert answer["ts"] == posted["ts"] and answer["text"] == "working…"
    assert stored["text"] == "working…"
    assert stored["blocks"] == approval_blocks()  # Slack keeps blocks an update leaves out
    assert cast(dict[str, Any], stored["edited"])["user"] == "U0BOT"

    await web.chat_update(channel="C0GENERAL", ts=posted["ts"], text="done", blocks=[])
    assert stored["blocks"] == []
    assert slack.messages["C0GENERAL"] == [stored]
    assert slack.updates == [
        {
            "channel": "C0GENERAL",
            "ts": posted["ts"],
            "text": "working…",
            "blocks": approval_blocks(),
        },
        {"channel": "C0GENERAL", "ts": posted["ts"], "text": "done", "blocks": []},
    ]


async def test_update_and_delete_errors(slack: FakeSlack, web: AsyncWebClient) -> None:
    with pytest.raises(SlackApiError) as caught:
        await web.chat_update(channel="C0GENERAL", ts="1.000001", text="x")
    assert caught.value.response["error"] == "message_not_found"

    slack.ack_timeout = 0
    async with socket_peer(slack):
        envelope = await slack.push_message("mine", channel="C0GENERAL", channel_type="channel")
    ts = envelope.payload["event"]["ts"]
    assert slack.message("C0GENERAL", ts)["user"] == "U0OWNER"  # type: ignore[index]
    with pytest.raises(SlackApiError) as caught:
        await web.chat_update(channel="C0GENERAL", ts=ts, text="hijack")
    assert caught.value.response["error"] == "cant_update_message"
    with pytest.raises(SlackApiError) as caught:
        await web.chat_delete(channel="C0GENERAL", ts=ts)
    assert caught.value.response["error"] == "cant_delete_message"

    posted = await web.chat_postMessage(channel="C0GENERAL", text="bye")
    with pytest.raises(SlackApiError) as caught:
        await web.chat_update(
            channel="C0GENERAL", ts=posted["ts"], text="t", blocks=approval_blocks(label="x" * 76)
        )
    assert caught.value.response["error"] == "invalid_blocks"
    assert slack.updates == []

    await web.chat_delete(channel="C0GENERAL", ts=posted["ts"])
    assert slack.messages["C0GENERAL"] == []
    assert slack.message("C0GENERAL", posted["ts"]) is None
    assert slack.deletions == [{"channel": "C0GENERAL", "ts": posted["ts"]}]
    with pytest.raises(SlackApiError) as caught:
        await web.chat_delete(channel="C0GENERAL", ts=posted["ts"])
    assert caught.value.response["error"] == "message_not_found"


async def test_conversations_and_users_info(slack: FakeSlack, web: AsyncWebClient) -> None:
    dm = (await web.conversations_info(channel="D0OWNER"))["channel"]
    assert dm["is_im"] is True and dm["user"] == "U0OWNER" and "name" not in dm
    general = (await web.conversations_info(channel="C0GENERAL"))["channel"]
    assert general["name"] == "general"
    assert general["is_channel"] and not general["is_private"] and general["is_member"]
    private = (await web.conversations_info(channel="G0SECRET"))["channel"]
    assert private["is_private"] and not private["is_im"]
    with pytest.raises(SlackApiError) as caught:
        await web.conversations_info(channel="nope")
    assert caught.value.response["error"] == "channel_not_found"

    owner = (await web.users_info(user="U0OWNER"))["user"]
    assert owner["name"] == "owner"
    assert owner["profile"]["display_name"] == "owner"
    assert owner["profile"]["real_name"] == "Owner Person"
    other = (await web.users_info(user="W0SOMEONE"))["user"]
    assert other["id"] == "W0SOMEONE" and other["real_name"]
    with pytest.raises(SlackApiError) as caught:
        await web.users_info(user="nobody")
    assert caught.value.response["error"] == "user_not_found"
    assert slack.calls_to("users.info")[0].params == {"user": "U0OWNER"}


# ---------------------------------------------------------------------------------------------
# Web API: faults and rate limits
# ---------------------------------------------------------------------------------------------


async def test_fail_next_fails_without_effect(slack: FakeSlack, web: AsyncWebClient) -> None:
    slack.fail_next("chat.postMessage", error="fatal_error", count=2)
    slack.fail_next("chat.postMessage", error="service_unavailable", status=503)
    for expected in ("fatal_error", "fatal_error"):
        with pytest.raises(SlackApiError) as caught:
            await web.chat_postMessage(channel="C0GENERAL", text="x")
        assert caught.value.response["error"] == expected
        assert caught.value.response.status_code == 200
    with pytest.raises(SlackApiError) as caught:
        await web.chat_postMessage(channel="C0GENERAL", text="x")
    assert caught.value.response.status_code == 503
    assert slack.messages == {}
    await web.chat_postMessage(channel="C0GENERAL", text="finally")
    assert [m["text"] for m in slack.messages["C0GENERAL"]] == ["finally"]
    assert [c.ok for c in slack.calls_to("chat.postMessage")] == [False, False, False, True]


async def test_fail_next_429_carries_retry_after(slack: FakeSlack, web: AsyncWebClient) -> None:
    slack.fail_next("chat.update", status=429, retry_after=7)
    with pytest.raises(SlackApiError) as caught:
        await web.chat_update(channel="C0GENERAL", ts="1.1", text="x")
    response = caught.value.response
    assert response.status_code == 429
    assert response["error"] == "ratelimited"
    assert response.headers["Retry-After"] == "7"
    assert slack.rate_limited == 1


async def test_rate_limit_is_per_channel(slack: FakeSlack, web: AsyncWebClient) -> None:
    slack.rate_limit("chat.postMessage", per_second=1, burst=2)
    await web.chat_postMessage(channel="C0GENERAL", text="1")
    await web.chat_postMessage(channel="C0GENERAL", text="2")
    with pytest.raises(SlackApiError) as caught:
        await web.chat_postMessage(channel="C0GENERAL", text="3")
    assert caught.value.response.status_code == 429
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    assert slack.rate_limited == 1
    await web.chat_postMessage(channel="D0OWNER", text="elsewhere")
    assert [m["text"] for m in slack.messages["C0GENERAL"]] == ["1", "2"]
    assert [m["text"] for m in slack.messages["D0OWNER"]] == ["elsewhere"]


async def test_wait_for_call_waits_and_can_fail(slack: FakeSlack, web: AsyncWebClient) -> None:
    await web.auth_test()
    after = len(slack.calls)
    waiter = asyncio.ensure_future(slack.wait_for_call("chat.postMessage", after=after, timeout=2))
    await asyncio.sleep(0)
    assert not waiter.done()
    answer = await web.chat_postMessage(channel="C0GENERAL", text="now")
    call = await waiter
    assert call.response["ts"] == answer["ts"]
    assert slack.message("C0GENERAL", answer["ts"]) is not None  # applied when woken
    with pytest.raises(AssertionError, match=r"no matching chat\.update call"):
        await slack.wait_for_call("chat.update", timeout=0.1)
    with pytest.raises(AssertionError):
        await slack.wait_for_call("auth.test", after=after, timeout=0.1)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


async def test_files_upload_v2_end_to_end(
    slack: FakeSlack, web: AsyncWebClient, tmp_path: Path
) -> None:
    parent = await web.chat_postMessage(channel="D0OWNER", text="here you go")
    answer = await web.files_upload_v2(
        channel="D0OWNER",
        file=b"col1,col2\n1,2\n",
        filename="data.csv",
        title="Data",
        initial_comment="the export",
        thread_ts=parent["ts"],
    )
    assert answer["file"]["title"] == "Data"
    file_id = answer["file"]["id"]
    assert slack.uploads == [
        {
            "id": file_id,
            "title": "Data",
            "filename": "data.csv",
            "content": b"col1,col2\n1,2\n",
            "channel_id": "D0OWNER",
            "thread_ts": parent["ts"],
            "initial_comment": "the export",
        }
    ]
    share = slack.messages["D0OWNER"][-1]
    assert share["subtype"] == "file_share" and share["text"] == "the export"
    assert share["thread_ts"] == parent["ts"] and share["files"][0]["id"] == file_id
    assert [c.method for c in slack.calls[-2:]] == [
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ]

    path = tmp_path / "notes.txt"
    path.write_bytes(b"from disk")
    await web.files_upload_v2(channel="C0GENERAL", file=str(path))
    assert slack.uploads[-1]["filename"] == "notes.txt"
    assert slack.uploads[-1]["title"] == "notes.txt"
    assert slack.uploads[-1]["content"] == b"from disk"


async def test_upload_errors(slack: FakeSlack, web: AsyncWebClient) -> None:
    for length in (0, -3, "many"):
        with pytest.raises(SlackApiError) as caught:
            await web.api_call(
                "files.getUploadURLExternal", params={"filename": "a.txt", "length": length}
            )
        assert caught.value.response["error"] == "invalid_arguments"
    with pytest.raises(SlackApiError) as caught:
        await web.api_call("files.getUploadURLExternal", params={"filename": "a.txt"})
    assert caught.value.response["error"] == "invalid_arguments"

    with pytest.raises(SlackApiError) as caught:
        await web.files_completeUploadExternal(
            files=[{"id": "F999", "title": "x"}], channel_id="C0GENERAL"
        )
    assert caught.value.response["error"] == "file_not_found"

    announced = await web.files_getUploadURLExternal(filename="a.txt", length=10)
    with pytest.raises(SlackApiError) as caught:  # announced but never uploaded
        await web.files_completeUploadExternal(files=[{"id": announced["file_id"]}])
    assert caught.value.response["error"] == "file_not_found"
    async with (
        aiohttp.ClientSession() as session,
        session.post(announced["upload_url"], data=b"short") as resp,
    ):
        assert resp.status == 200
        assert await resp.text() == "OK - 5"
    with pytest.raises(SlackApiError) as caught:  # 5 bytes where 10 were announced
        await web.files_completeUploadExternal(files=[{"id": announced["file_id"]}])
    assert caught.value.response["error"] == "file_not_found"
    assert slack.uploads == []


async def test_downloads_need_the_bot_token(slack: FakeSlack, web: AsyncWebClient) -> None:
    shared = slack.add_file(b"secret numbers", name="report.txt")
    assert shared["id"].startswith("F") and shared["size"] == 14
    assert shared["mimetype"] == "text/plain" and shared["name"] == "report.txt"
    auth = {"Authorization": f"Bearer {slack.bot_token}"}
    async with aiohttp.ClientSession() as session:
        for url in (shared["url_private"], shared["url_private_download"]):
            async with session.get(url, headers=auth) as resp:
                assert resp.status == 200
                assert await resp.read() == b"secret numbers"
            async with session.get(url) as resp:  # forgot the header: the sign-in page
                body = await resp.read()
                assert resp.status == 200 and resp.content_type == "text/html"
                assert b"secret numbers" not in body and b"Sign in" in body
            async with session.get(url, headers={"Authorization": "Bearer xoxb-no"}) as resp:
                assert b"secret numbers" not in await resp.read()
    assert [d["authorized"] for d in slack.downloads] == [True, False, False] * 2

    uploaded = await web.files_upload_v2(
        channel="C0GENERAL", content="made by the bot", filename="out.txt"
    )
    async with (
        aiohttp.ClientSession() as session,
        session.get(uploaded["file"]["url_private"], headers=auth) as resp,
    ):
        assert await resp.read() == b"made by the bot"


# ---------------------------------------------------------------------------------------------
# Socket Mode
# ---------------------------------------------------------------------------------------------


async def test_socket_mode_hello_event_and_ack(slack: FakeSlack) -> None:
    async with socket_peer(slack) as peer:
        await eventually(lambda: peer.raw, 2, "the hello")
        hello = peer.raw[0]
        assert hello["type"] == "hello" and hello["num_connections"] == 1
        assert hello["connection_info"] == {"app_id": "A0APP"}
        assert slack.connections == 1
        open_call = slack.calls_to("apps.connections.open")[0]
        assert open_call.token == slack.app_token
        assert open_call.response["url"].startswith("ws://127.0.0.1:")

        envelope = await slack.push_message("hello bot")
        request = await peer.wait_request()
        ack = await slack.wait_acked(envelope, timeout=2)
        assert ack == {"envelope_id": envelope.envelope_id}
        assert slack.acked(envelope)

    assert request.type == "events_api"
    assert request.envelope_id == envelope.envelope_id
    assert request.retry_attempt == 0 and request.retry_reason == ""
    payload = request.payload
    assert payload["type"] == "event_callback"
    assert payload["team_id"] == "T0TEAM" and payload["api_app_id"] == "A0APP"
    assert payload["event_id"] == envelope.event_id
    assert payload["event_id"].startswith("Ev") and len(payload["event_id"]) == 12
    assert payload["authorizations"][0]["user_id"] == "U0BOT"
    assert abs(payload["event_time"] - time.time()) < 60
    event = payload["event"]
    assert event["type"] == "message" and event["channel_type"] == "im"
    assert event["channel"] == "D0OWNER" and event["user"] == "U0OWNER"
    assert event["text"] == "hello bot" and event["ts"] == event["event_ts"]
    assert event["blocks"][0]["type"] == "rich_text"
    assert "subtype" not in event


async def test_pushed_messages_mentions_and_files(slack: FakeSlack) -> None:
    report = slack.add_file(b"data", name="report.txt")
    async with socket_peer(slack) as peer:
        first = await slack.push_message("one")
        threaded = await slack.push_message(
            "two",
            thread_ts=first.payload["event"]["ts"],
            channel="C0GENERAL",
            channel_type="channel",
        )
        shared = await slack.push_message("", files=[report])
        mention = await slack.push_mention("status?", thread_ts="1700000000.000100")
        explicit = await slack.push_event({"type": "reaction_added"}, event_id="Ev0000000001")
        await peer.wait_request(5)

    ts = [e.payload["event"].get("ts") for e in (first, threaded, shared, mention)]
    assert ts == sorted(ts) and len(set(ts)) == 4
    assert ts[0] == "1700000000.000100"
    assert threaded.payload["event"]["thread_ts"] == ts[0]
    share_event = shared.payload["event"]
    assert share_event["subtype"] == "file_share"
    assert share_event["files"][0]["url_private"] == report["url_private"]
    mention_event = mention.payload["event"]
    assert mention_event["type"] == "app_mention" and mention_event["channel"] == "C0GENERAL"
    assert mention_event["text"] == "<@U0BOT> status?"
    assert mention_event["thread_ts"] == "1700000000.000100"
    assert {"type": "user", "user_id": "U0BOT"} in (
        mention_event["blocks"][0]["elements"][0]["elements"]
    )
    assert explicit.payload["event_id"] == "Ev0000000001"
    assert [r.payload["event_id"] for r in peer.requests][-1] == "Ev0000000001"
    assert slack.message("C0GENERAL", ts[1])["thread_ts"] == ts[0]  # type: ignore[index]


async def test_button_press_is_an_interactive_envelope(
    slack: FakeSlack, web: AsyncWebClient
) -> None:
    posted = await web.chat_postMessage(
        channel="D0OWNER", text="approve?", blocks=approval_blocks()
    )
    async with socket_peer(slack, auto_ack=False) as peer:
        envelope = await slack.push_action(
            channel="D0OWNER", message_ts=posted["ts"], action_id="approve"
        )
        request = await peer.wait_request()
        await peer.client.send_socket_mode_response(
            SocketModeResponse(envelope_id=request.envelope_id, payload={"text": "noted"})
        )
        ack = await slack.wait_acked(envelope, timeout=2)
    assert ack["payload"] == {"text": "noted"}
    assert request.type == "interactive"
    payload = request.payload
    assert payload["type"] == "block_actions"
    assert payload["user"]["id"] == "U0OWNER" and payload["team"]["id"] == "T0TEAM"
    assert payload["channel"]["id"] == "D0OWNER"
    assert payload["container"] == {
        "type": "message",
        "message_ts": posted["ts"],
        "channel_id": "D0OWNER",
        "is_ephemeral": False,
    }
    assert payload["message"]["ts"] == posted["ts"]
    assert payload["message"]["blocks"] == approval_blocks()
    assert payload["trigger_id"] and payload["response_url"].startswith(slack.origin)
    [action] = payload["actions"]
    assert action["action_id"] == "approve" and action["block_id"] == "approval"
    assert action["value"] == "42" and action["type"] == "button"
    assert action["text"]["text"] == "Approve" and action["action_ts"]

    async with aiohttp.ClientSession() as session:
        body = {"replace_original": True, "text": "approved", "blocks": []}
        async with session.post(payload["response_url"], json=body) as resp:
            assert resp.status == 200
    stored = slack.message("D0OWNER", posted["ts"])
    assert stored is not None and stored["text"] == "approved" and stored["blocks"] == []
    assert slack.action_responses[0]["body"] == body


async def test_unacked_events_are_redelivered(slack: FakeSlack) -> None:
    slack.ack_timeout = 0.05
    slack.max_retries = 2
    async with socket_peer(slack, auto_ack=False) as peer:
        first = await slack.push_message("are you there?")
        await peer.wait_request(3)
        await asyncio.sleep(0.2)  # no fourth delivery: max_retries reached
        deliveries = slack.deliveries(first.event_id or "")
    assert [d.retry_attempt for d in deliveries] == [0, 1, 2]
    assert [r.retry_attempt for r in peer.requests] == [0, 1, 2]
    assert [r.retry_reason for r in peer.requests] == ["", "timeout", "timeout"]
    assert len({r.envelope_id for r in peer.requests}) == 3
    assert all(r.payload == first.payload for r in peer.requests)


async def test_acked_events_are_not_redelivered(slack: FakeSlack) -> None:
    slack.ack_timeout = 0.05
    async with socket_peer(slack) as peer:
        envelope = await slack.push_message("hi")
        await slack.wait_acked(envelope, timeout=2)
        await asyncio.sleep(0.2)
    assert len(peer.requests) == 1
    assert slack.deliveries(envelope.event_id or "") == [envelope]


async def test_redelivery_can_be_switched_off_and_forced(slack: FakeSlack) -> None:
    slack.ack_timeout = 0
    async with socket_peer(slack, auto_ack=False) as peer:
        envelope = await slack.push_message("once")
        await peer.wait_request()
        await asyncio.sleep(0.1)
        assert len(peer.requests) == 1
        again = await slack.redeliver(envelope)
        request = await peer.wait_request(2)
    assert isinstance(again, Envelope)
    assert again.envelope_id != envelope.envelope_id and again.retry_attempt == 1
    assert request.envelope_id == again.envelope_id and request.retry_reason == "timeout"
    assert request.payload["event_id"] == envelope.event_id
    assert slack.deliveries(envelope.event_id or "") == [envelope, again]


async def test_disconnect_makes_the_sdk_reconnect(slack: FakeSlack) -> None:
    async with socket_peer(slack) as peer:
        await slack.disconnect()
        await slack.wait_connected(timeout=2)
        assert slack.connections == 2
        assert len(slack.calls_to("apps.connections.open")) == 2
        envelope = await slack.push_message("after the refresh")
        request = await peer.wait_request()
        await slack.wait_acked(envelope, timeout=2)
        await asyncio.sleep(0.2)
        assert slack.connections == 2  # exactly one new connection
    assert request.envelope_id == envelope.envelope_id
    disconnects = [m for m in peer.frames if m.get("type") == "disconnect"]
    assert [m["reason"] for m in disconnects] == ["refresh_requested"]


async def test_dropped_connection_is_reestablished(slack: FakeSlack) -> None:
    async with socket_peer(slack, ping_interval=0.05) as peer:
        await slack.drop_connection()
        await slack.wait_connected(timeout=3)
        assert slack.connections == 2
        envelope = await slack.push_message("still there?")
        await peer.wait_request()
        await slack.wait_acked(envelope, timeout=2)


async def test_echoed_bot_messages(slack: FakeSlack, web: AsyncWebClient) -> None:
    slack.echo_bot_messages = True
    async with socket_peer(slack) as peer:
        posted = await web.chat_postMessage(channel="C0GENERAL", text="me")
        request = await peer.wait_request()
    event = request.payload["event"]
    assert event["bot_id"] == "B0BOT" and event["ts"] == posted["ts"]
    assert event["channel"] == "C0GENERAL"


# ---------------------------------------------------------------------------------------------
# HTTP mode
# ---------------------------------------------------------------------------------------------


async def test_signed_headers_verify_with_the_sdk(slack: FakeSlack) -> None:
    body = slack.event_body({"type": "app_mention", "text": "<@U0BOT> hi"}, event_id="Ev1")
    verifier = SignatureVerifier(slack.signing_secret)
    headers = slack.signed_headers(body)
    assert verifier.is_valid_request(body, headers)
    assert headers["Content-Type"] == "application/json"
    assert not verifier.is_valid_request(body + b" ", headers)
    assert not verifier.is_valid_request(body, slack.signed_headers(body, secret="other"))
    stale = slack.signed_headers(body, timestamp=int(time.time()) - 301)
    assert not verifier.is_valid_request(body, stale)
    assert SignatureVerifier("other").is_valid_request(
        body, slack.signed_headers(body, secret="other")
    )

    payload = json.loads(body)
    assert payload["type"] == "event_callback" and payload["event_id"] == "Ev1"
    assert payload["event"]["text"] == "<@U0BOT> hi"


async def test_action_body_is_a_signed_form(slack: FakeSlack, web: AsyncWebClient) -> None:
    posted = await web.chat_postMessage(channel="C0GENERAL", text="?", blocks=approval_blocks())
    body = slack.action_body(
        channel="C0GENERAL", message_ts=posted["ts"], action_id="deny", value="override"
    )
    headers = slack.signed_headers(body)
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert SignatureVerifier(slack.signing_secret).is_valid_request(body, headers)
    [raw] = parse_qs(body.decode())["payload"]
    payload = json.loads(raw)
    assert payload["type"] == "block_actions"
    assert payload["actions"][0]["value"] == "override"
    assert payload["actions"][0]["style"] == "danger"
    assert json.loads(slack.url_verification_body("c"))["challenge"] == "c"
    assert slack.retry_headers(1) == {
        "X-Slack-Retry-Num": "1",
        "X-Slack-Retry-Reason": "http_timeout",
    }
