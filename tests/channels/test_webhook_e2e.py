"""Must show, end to end: a signed delivery to a tool route whose tool needs approval puts
an approval prompt in the route's Telegram chat (the real aiogram client against the
fake Bot API server); one press runs the tool once; the delivery status shows the end."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import Bot, running_bot
from tests.fakes.telegram_api import Call, FakeTelegramAPI

TOKEN = "123456:WEBHOOK-e2e-token"
OWNER = 42
SECRET = "whsec_" + base64.b64encode(b"e2e-standard-webhooks-secret-key").decode()
ADMIN = "e2e-admin-token"
ENV = {"TELEGRAM_BOT_TOKEN": TOKEN, "DEPLOY_SECRET": SECRET, "ADMIN_TOKEN": ADMIN}


def config(api: FakeTelegramAPI) -> str:
    return f"""
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{OWNER}]
[http]
port = 0
[tools]
profile = "coding"
[tools.shell]
enabled = true
[webhook]
enabled = true
admin_token_env = "ADMIN_TOKEN"

[[webhook.routes]]
name = "deploy"
auth = "standard"
secret_env = "DEPLOY_SECRET"
tool = "shell_exec"
args = {{ argv = ["sh", "-c", "echo ran >> count.txt"] }}
deliver_to = "telegram:{OWNER}"
"""


@asynccontextmanager
async def daemon(state_dir: Path) -> AsyncIterator[tuple[Bot, FakeTelegramAPI, str]]:
    async with (
        FakeTelegramAPI(token=TOKEN) as api,
        running_bot(
            state_dir,
            config(api),
            environ=ENV,
            channels=["telegram", "webhook"],
            channel_options={"telegram": {"poll_timeout": 1}},
        ) as bot,
    ):
        assert bot.daemon.http is not None
        yield bot, api, f"http://127.0.0.1:{bot.daemon.http.port}"


def signed(body: bytes, msg_id: str) -> dict[str, str]:
    """Signed by the `standardwebhooks` reference package, as a real sender would."""
    from standardwebhooks.webhooks import Webhook

    now = datetime.now(UTC)
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body.decode()),
    }


async def deliver(base: str, msg_id: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"ref": "main", "sha": "0123abc"}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base}/hooks/deploy", data=body, headers=signed(body, msg_id)) as response,
    ):
        return response.status, await response.json()


async def delivery_status(base: str, inbound_id: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{base}/hooks/deploy/deliveries/{inbound_id}", headers=headers) as response,
    ):
        assert response.status == 200
        return dict(await response.json())


async def status_becomes(base: str, inbound_id: str, wanted: str) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while (info := await delivery_status(base, inbound_id))["status"] != wanted:
            assert info["status"] in ("accepted", "running", "waiting_approval"), info
            await asyncio.sleep(0.05)
    return info


def buttons(call: Call) -> dict[str, str]:
    markup = call.params["reply_markup"]
    markup = json.loads(markup) if isinstance(markup, str) else markup
    return {b["text"]: b["callback_data"] for row in markup["inline_keyboard"] for b in row}


def runs(state_dir: Path) -> int:
    path = state_dir / "workspace" / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def approval_prompt(api: FakeTelegramAPI) -> tuple[Call, int, dict[str, str]]:
    call = await api.wait_for_call("sendMessage", lambda c: "reply_markup" in c.params, timeout=20)
    assert int(call.params["chat_id"]) == OWNER
    assert call.response is not None
    message_id = int(call.response["result"]["message_id"])
    return call, message_id, buttons(call)


async def test_signed_delivery_approved_from_telegram_runs_once(state_dir: Path) -> None:
    async with daemon(state_dir) as (_bot, api, base):
        status, answer = await deliver(base, "msg_e2e_approve")
        assert status == 202 and answer["status"] == "accepted"
        inbound_id = answer["id"]

        _call, prompt_id, choices = await approval_prompt(api)
        approve = next(data for data in choices.values() if data.startswith("approve_once:"))
        assert any(data.startswith("deny:") for data in choices.values())
        shown = api.message(OWNER, prompt_id)
        assert shown is not None
        assert "echo ran >> count.txt" in shown["plain_text"]  # the call, shown in full
        assert (await status_becomes(base, inbound_id, "waiting_approval"))["result"] is None
        assert runs(state_dir) == 0

        seen = len(api.calls)
        api.push_callback(approve, user_id=OWNER, message_id=prompt_id, chat_id=OWNER)
        edit = await api.wait_for_call("editMessageText", timeout=20, after=seen)
        assert edit.params["text"].startswith("✅ Approved")
        assert int(edit.params["message_id"]) == prompt_id
        result = await api.wait_for_call(
            "sendMessage", lambda c: "exit code 0" in str(c.params.get("text")), 20, after=seen
        )
        assert int(result.params["chat_id"]) == OWNER
        info = await status_becomes(base, inbound_id, "done")
        assert "exit code 0" in info["result"]
        assert runs(state_dir) == 1

        # A second press and a replay of the same signed delivery change nothing.
        presses = len(api.calls_of("answerCallbackQuery"))
        api.push_callback(approve, user_id=OWNER, message_id=prompt_id, chat_id=OWNER)
        await api.wait_for_calls("answerCallbackQuery", presses + 1, timeout=20)
        status, again = await deliver(base, "msg_e2e_approve")
        assert (status, again) == (200, {"status": "duplicate", "id": inbound_id})
        assert (await delivery_status(base, inbound_id))["status"] == "done"
    assert runs(state_dir) == 1
    prompts = [c for c in api.calls_of("sendMessage") if "reply_markup" in c.params]
    assert len(prompts) == 1
    results = [c for c in api.calls_of("sendMessage") if "exit code" in str(c.params.get("text"))]
    assert len(results) == 1


async def test_signed_delivery_denied_from_telegram_never_runs(state_dir: Path) -> None:
    async with daemon(state_dir) as (_bot, api, base):
        status, answer = await deliver(base, "msg_e2e_deny")
        assert status == 202
        inbound_id = answer["id"]
        _call, prompt_id, choices = await approval_prompt(api)
        deny = next(data for data in choices.values() if data.startswith("deny:"))
        seen = len(api.calls)
        api.push_callback(deny, user_id=OWNER, message_id=prompt_id, chat_id=OWNER)
        edit = await api.wait_for_call("editMessageText", timeout=20, after=seen)
        assert edit.params["text"].startswith("❌ Denied")
        info = await status_becomes(base, inbound_id, "denied")
        assert "APPROVAL_DENIED" in (info["error"] or "") + (info["result"] or "")
        await api.wait_for_call(
            "sendMessage", lambda c: "shell_exec" in str(c.params.get("text")), 20, after=seen
        )
    assert runs(state_dir) == 0
