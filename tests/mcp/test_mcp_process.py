"""MCP tools in `echo-bot run` as a real process: the scripted fake model calls the notes
server's tools, the approval arrives in the fake Telegram chat with buttons, and the
daemon is SIGKILLed while an approval is pending or a call is running. Nothing runs
twice; a call that was running is OUTCOME_UNKNOWN."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from tests.channels.test_telegram_process import answered_later
from tests.conftest import ROOT, echo_bot_env
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.waiting import eventually

# Slow: real echo-bot processes, started, stopped or killed, and started again, several
# seconds of a core each (`pytest -m "not slow"`, the inner loop, leaves them to the
# full run).
pytestmark = pytest.mark.slow

TOKEN = "123456:MCP-process-token"
OWNER = 42
SERVER = ROOT / "tests" / "fakes" / "mcp_notes_server.py"


def write_config(path: Path, api: FakeTelegramAPI, llm: FakeOpenAI, notes: Path) -> None:
    path.write_text(
        f"""
[brain]
kind = "openai"
[openai]
base_url = "{llm.base_url}"
model = "gpt-test"
max_retries = 0
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{OWNER}]
[http]
port = 0

[[mcp.servers]]
name = "notes"
command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}, "stdio"]
env = {{ NOTES_DIR = {json.dumps(str(notes))} }}
trust_annotations = true
risk = {{ hang = "write" }}
timeout = "120s"
"""
    )


async def start_daemon(config: Path, state: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "echo_bot", "run", "--config", str(config), "--state-dir", str(state),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=echo_bot_env(TELEGRAM_BOT_TOKEN=TOKEN),
        cwd=ROOT,
    )  # fmt: skip
    assert proc.stderr is not None
    async with asyncio.timeout(60):  # ready in ~1 s alone; a full parallel suite starves it
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "the daemon exited before it was ready"
            if line.startswith("stop with"):
                break
    asyncio.get_running_loop().create_task(_drain(proc))
    return proc


async def _drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    while await proc.stderr.readline():
        pass


async def kill(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def press_approve(api: FakeTelegramAPI, after: int = 0) -> tuple[str, int]:
    """The first approval prompt sent after call ``after``: its approve action, its id."""
    prompt = await api.wait_for_call(
        "sendMessage", lambda c: "reply_markup" in c.params, timeout=30, after=after
    )
    markup = prompt.params["reply_markup"]
    markup = json.loads(markup) if isinstance(markup, str) else markup
    action = markup["inline_keyboard"][0][0]["callback_data"]
    assert action.startswith("approve_once:")
    return action, prompt.response["result"]["message_id"]  # type: ignore[index]


async def test_a_pending_mcp_approval_survives_sigkill_and_the_tool_runs_once(
    tmp_path: Path,
) -> None:
    notes, state, config = tmp_path / "notes", tmp_path / "st", tmp_path / "config.toml"
    notes.mkdir()
    async with FakeTelegramAPI(token=TOKEN) as api, FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("notes__list_notes", {})])
        llm.tool_calls([("notes__add_note", {"title": "milk", "text": "buy milk"})])
        llm.reply("Noted: milk.")
        write_config(config, api, llm, notes)
        first = await start_daemon(config, state)
        try:
            api.push_message("note that I need milk", user_id=OWNER)
            approve, prompt_id = await press_approve(api)
            prompt = api.calls_of("sendMessage")[-1].params["text"]
            assert "notes__add_note" in prompt and "buy milk" in prompt
            # the read tool ran at once: its result is what the model saw next
            assert "(no notes)" in json.dumps(llm.chat_requests()[1]["messages"])
        finally:
            await kill(first)
        assert lines(notes / "added.log") == []

        seen = len(api.calls)
        api.push_callback(approve, user_id=OWNER, message_id=prompt_id, chat_id=OWNER)
        second = await start_daemon(config, state)
        try:
            await api.wait_for_call(
                "sendMessage", lambda c: "Noted: milk." in c.params.get("text", ""),
                timeout=30, after=seen,
            )  # fmt: skip
            await answered_later(api)  # a duplicate would have come before
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 30) == 0
    assert lines(notes / "added.log") == ["milk"]


async def test_a_write_mcp_call_running_at_a_sigkill_is_outcome_unknown_after_restart(
    tmp_path: Path,
) -> None:
    notes, state, config = tmp_path / "notes", tmp_path / "st", tmp_path / "config.toml"
    notes.mkdir()
    async with FakeTelegramAPI(token=TOKEN) as api, FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("notes__hang", {"seconds": 600})])
        llm.reply("I could not tell whether it ran.")
        write_config(config, api, llm, notes)
        first = await start_daemon(config, state)
        try:
            api.push_message("take your time", user_id=OWNER)
            approve, prompt_id = await press_approve(api)
            api.push_callback(approve, user_id=OWNER, message_id=prompt_id, chat_id=OWNER)
            hanging = notes / "hanging"  # the call is running on the server
            await eventually(hanging.exists, 30, f"{hanging} to be written")
        finally:
            await kill(first)

        second = await start_daemon(config, state)
        try:
            await api.wait_for_call(
                "sendMessage",
                lambda c: "could not tell" in c.params.get("text", ""),
                timeout=30,
            )
            told = json.dumps(llm.chat_requests()[-1]["messages"])
            assert "OUTCOME_UNKNOWN" in told
            await answered_later(api)  # a duplicate would have come before
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 30) == 0
    assert lines(notes / "hang.log") == ["hang"], "the call was sent again"
