"""`echo-bot run` as a real process with Telegram pointed at the fake Bot API server:
a pending approval survives SIGKILL, and the press after the restart runs it once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from echo_bot.store import Tx
from tests.conftest import ROOT, echo_bot_env, read_store
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.waiting import eventually

# The tests that kill a real daemon and start it again are slow: several seconds of a
# core each (`pytest -m "not slow"`, the inner loop, leaves them to the full run).
RESTARTS = pytest.mark.slow

TOKEN = "123456:PROCESS-test-token"
OWNER = 42
COUNT = '/tool shell_exec {"argv": ["sh", "-c", "echo ran >> count.txt"]}'


def write_config(path: Path, api: FakeTelegramAPI, llm: FakeOpenAI | None = None) -> None:
    """The daemon's config: Telegram at the fake; with ``llm``, its brain the openai SDK
    against the fake OpenAI server."""
    brain = (
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "gpt-test"\nmax_retries = 0\n'
        '[brain]\nkind = "openai"\n'
        if llm is not None
        else ""
    )
    path.write_text(
        f"""
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
{brain}"""
    )


START_TIMEOUT = 60.0  # seconds for a daemon to say it is ready


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
    # Ready in about a second alone; a full parallel suite on two cores can take many times
    # that (a wait for liveness, not a speed check).
    async with asyncio.timeout(START_TIMEOUT):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "the daemon exited before it was ready"
            if line.startswith("stop with"):
                break
    return proc


async def delivered(state: Path, kind: str) -> None:
    """Wait until the daemon has recorded the delivery of an outbound of ``kind``."""

    def receipted_kinds(tx: Tx) -> list[str]:
        return [message.kind for message in tx.outbox.receipted()]

    async with asyncio.timeout(20):
        while True:
            if kind in await asyncio.to_thread(read_store, state, receipted_kinds):
                return
            await asyncio.sleep(0.05)


async def answered_later(api: FakeTelegramAPI) -> None:
    """A later message of the chat, answered: a chat's turns run in arrival order and its
    messages go out in order, so whatever the earlier ones did (or did twice) is done."""
    seen = len(api.calls)
    api.push_message("/help", user_id=OWNER)  # a command: answered without the model
    await api.wait_for_call(
        "sendMessage", lambda c: "show this help" in c.params.get("text", ""), timeout=30,
        after=seen,
    )  # fmt: skip


def count_runs(state: Path) -> int:
    path = state / "workspace" / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


@RESTARTS
async def test_pending_approval_survives_sigkill_and_runs_once(tmp_path: Path) -> None:
    state, config = tmp_path / "st", tmp_path / "config.toml"
    async with FakeTelegramAPI(token=TOKEN) as api:
        write_config(config, api)
        first = await start_daemon(config, state)
        try:
            api.push_message(COUNT, user_id=OWNER)
            prompt_call = await api.wait_for_call(
                "sendMessage", lambda c: "reply_markup" in c.params, timeout=20
            )
            markup = prompt_call.params["reply_markup"]
            markup = json.loads(markup) if isinstance(markup, str) else markup
            approve = markup["inline_keyboard"][0][0]["callback_data"]
            assert approve.startswith("approve_once:")
            prompt_id = prompt_call.response["result"]["message_id"]  # type: ignore[index]
            await delivered(state, "approval")  # kill once the prompt counts as delivered
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert count_runs(state) == 0

        seen = len(api.calls)
        # The press waits at Telegram while the daemon is down; it is judged at start.
        api.push_callback(approve, user_id=OWNER, message_id=prompt_id, chat_id=OWNER)
        second = await start_daemon(config, state)
        try:
            await api.wait_for_call(
                "sendMessage", lambda c: "exit code 0" in c.params.get("text", ""), timeout=20,
                after=seen,
            )  # fmt: skip
            edit = await api.wait_for_call("editMessageText", timeout=20, after=seen)
            assert edit.params["text"].startswith("✅ Approved")
            assert int(edit.params["message_id"]) == prompt_id
            await api.wait_for_call("answerCallbackQuery", timeout=20, after=seen)
            await answered_later(api)  # a duplicate would have come before
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 20) == 0
    assert count_runs(state) == 1
    replies = [c for c in api.calls_of("sendMessage") if "exit code 0" in c.params.get("text", "")]
    assert len(replies) == 1
    prompts = [c for c in api.calls_of("sendMessage") if "reply_markup" in c.params]
    assert len(prompts) == 1, "the prompt was sent before the kill and must not be re-sent"


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_a_rejected_token_is_one_clear_line_and_exit_code_2(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    async with FakeTelegramAPI(token=TOKEN) as api:
        write_config(config, api)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo_bot", "run", "--config", str(config),
            "--state-dir", str(tmp_path / "st"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=echo_bot_env(TELEGRAM_BOT_TOKEN="123456:not-the-right-token"),
            cwd=ROOT,
        )  # fmt: skip
        _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    errors = [line for line in err.decode().splitlines() if line.startswith("echo-bot: ")]
    assert len(errors) == 1 and "401" in errors[0], err.decode()
    assert "Traceback" not in err.decode()
    assert "not-the-right-token" not in err.decode()


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_an_unreachable_bot_api_leaves_the_daemon_running_and_degraded(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = probe.getsockname()[1]
    config = tmp_path / "config.toml"
    config.write_text(
        f"""
[telegram]
enabled = true
api_base = "http://127.0.0.1:{closed_port}"
allowed_users = [{OWNER}]
[http]
enabled = true
port = {http_port}
"""
    )
    proc = await start_daemon(config, tmp_path / "st")
    try:
        from aiohttp import ClientSession

        url = f"http://127.0.0.1:{http_port}/healthz"
        async with ClientSession() as session, session.get(url) as response:
            body = await response.json()
        assert response.status == 503
        assert body["components"]["telegram"]["status"] == "degraded"
        assert proc.returncode is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0


@RESTARTS
async def test_a_restarted_poller_goes_on_from_the_offset_it_stored(tmp_path: Path) -> None:
    """The poller keeps its offset in the store: after a kill, the next start asks
    Telegram for what came after the last stored update (it does not fetch that again);
    an offset stored over a day ago is not trusted (Telegram keeps updates 24 hours, and
    numbers them afresh after a quiet week) and the poller asks afresh."""
    state, config = tmp_path / "st", tmp_path / "config.toml"
    async with FakeTelegramAPI(token=TOKEN) as api:
        write_config(config, api)
        first = await start_daemon(config, state)
        try:
            update_id = api.push_message("what time is it?", user_id=OWNER)
            await delivered(state, "reply")
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()

        async def first_offset_of_a_start() -> int | None:
            polled = len(api.offsets)
            daemon = await start_daemon(config, state)
            try:
                async with asyncio.timeout(20):
                    while len(api.offsets) <= polled:
                        await asyncio.sleep(0.05)
            finally:
                daemon.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(daemon.wait(), 20) == 0
            return api.offsets[polled]

        assert await first_offset_of_a_start() == update_id + 1
        with contextlib.closing(sqlite3.connect(state / "echo-bot.sqlite3")) as conn, conn:
            key = "position:telegram-offset:123456"
            (value,) = conn.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
            stale = {**json.loads(value), "at": json.loads(value)["at"] - 2 * 86400}
            conn.execute("UPDATE meta SET value = ? WHERE key = ?", [json.dumps(stale), key])
        assert await first_offset_of_a_start() is None
    replies = [t for t in api.sent_texts(OWNER) if t.startswith("It is")]
    assert len(replies) == 1, "the update was handled again after a restart"


@RESTARTS
async def test_a_photo_whose_download_a_kill_cut_short_is_fetched_after_restart(
    tmp_path: Path,
) -> None:
    state, config = tmp_path / "st", tmp_path / "config.toml"
    photo = b"\xff\xd8\xff" + b"pixels" * 2000
    async with FakeTelegramAPI(token=TOKEN) as api:
        write_config(config, api)
        api.hold_downloads()  # committed, asked for, never answered: then the kill
        first = await start_daemon(config, state)
        try:
            api.push_message("", user_id=OWNER, content={"photo": api.photo(photo)})
            async with asyncio.timeout(20):
                while not api.downloads:
                    await asyncio.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert not [c for c in api.calls_of("sendMessage") if "saved" in c.params["text"]]
        api.release_downloads()
        second = await start_daemon(config, state)
        try:
            await api.wait_for_call(
                "sendMessage", lambda c: "photo is saved" in c.params.get("text", ""), timeout=20
            )
            await answered_later(api)  # a duplicate would have come before
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 20) == 0
    answers = [c for c in api.calls_of("sendMessage") if "photo is saved" in c.params["text"]]
    assert len(answers) == 1
    saved = [p for p in (state / "workspace" / "inbox").rglob("*") if p.is_file()]
    assert [p.read_bytes() for p in saved] == [photo]  # whole, and no partial file left


@RESTARTS
async def test_a_reply_cut_mid_stream_by_a_kill_is_delivered_once_after_restart(
    tmp_path: Path,
) -> None:
    state, config = tmp_path / "st", tmp_path / "config.toml"
    answer = " ".join(f"word{i}" for i in range(120))
    async with FakeTelegramAPI(token=TOKEN) as api, FakeOpenAI() as llm:
        write_config(config, api, llm)
        llm.reply(answer)
        llm.reply(answer)
        llm.stream_hold_after = 40  # a third written, shown as a draft, then the kill
        first = await start_daemon(config, state)
        try:
            api.push_message("tell me a long story", user_id=OWNER)
            await api.wait_for_call("sendMessageDraft", timeout=20)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert api.calls_of("sendMessage") == []  # nothing half-written was sent as a reply
        llm.stream_hold_after = None
        llm.stream_release.set()
        second = await start_daemon(config, state)
        try:
            await api.wait_for_call(
                "sendMessage", lambda c: c.params.get("text") == answer, timeout=20
            )
            await answered_later(api)  # a duplicate would have come before
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 20) == 0
    texts = [c.params["text"] for c in api.calls_of("sendMessage")]
    # The answer once, then only the later /help's reply.
    assert len(texts) == 2 and texts[0] == answer and "show this help" in texts[1], texts
    assert len(llm.chat_requests()) == 2  # the turn was asked again from its checkpoint


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_a_group_preview_a_kill_left_mid_stream_is_removed_after_restart(
    tmp_path: Path,
) -> None:
    """In a group the reply being written is a message edited as it grows: killed
    mid-stream, the daemon left it ending in ✍️; the next start removes it, and the
    turn, run again, answers once."""
    state, config = tmp_path / "st", tmp_path / "config.toml"
    group = -(10**12 + OWNER)
    answer = " ".join(f"word{i}" for i in range(120))
    async with FakeTelegramAPI(token=TOKEN) as api, FakeOpenAI() as llm:
        write_config(config, api, llm)
        llm.reply(answer)
        llm.reply(answer)
        llm.stream_hold_after = 40  # a third written, shown in the group, then the kill
        first = await start_daemon(config, state)
        try:
            api.push_message("@echo_test_bot tell me a long story", user_id=OWNER,
                             chat_type="group")  # fmt: skip
            preview = await api.wait_for_call("sendMessage", lambda c: c.ok, timeout=20)
            preview_id = str(preview.response["result"]["message_id"])  # type: ignore[index]

            def noted() -> bool:  # the store has it (written once Telegram gave its id)
                note = read_store(state, lambda tx: tx.meta.note("telegram.previews"))
                return note is not None and preview_id in note[0]

            await eventually(lambda: asyncio.to_thread(noted), timeout=20, what="noted")
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert preview.params["text"].endswith("✍️")
        llm.stream_hold_after = None
        llm.stream_release.set()
        second = await start_daemon(config, state)
        try:
            await api.wait_for_call(
                "deleteMessage", lambda c: c.ok and str(c.params.get("message_id")) == preview_id,
                timeout=20,
            )  # fmt: skip
            await api.wait_for_call(
                "sendMessage", lambda c: c.ok and c.params.get("text") == answer, timeout=20
            )
        finally:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 20) == 0
    assert api.message(group, int(preview_id)) is None
    assert [c.params["text"] for c in api.calls_of("sendMessage") if c.ok][-1:] == [answer]
