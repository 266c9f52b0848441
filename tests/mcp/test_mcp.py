"""MCP servers' tools through the same gate: a real MCP server process (the SDK's own
server side, tests/fakes/mcp_notes_server.py) over stdio and streamable HTTP, the real
core with a recording chat channel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from echo_bot.config import parse_config
from echo_bot.errors import ConfigError
from echo_bot.events import DecisionVerb, approval_action
from echo_bot.mcp.connection import RemoteTool
from echo_bot.mcp.hub import McpHub
from echo_bot.mcp.tool import McpTool
from echo_bot.tools.base import Risk
from echo_bot.tools.registry import ToolRegistry
from tests.conftest import ROOT, Bot, run_echo_bot, running_bot
from tests.waiting import eventually

SERVER = ROOT / "tests" / "fakes" / "mcp_notes_server.py"


def stdio_config(notes: Path, extra: str = "", *, name: str = "notes", timeout: str = "3s") -> str:
    return f"""
[[mcp.servers]]
name = "{name}"
command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}, "stdio"]
env = {{ NOTES_DIR = {json.dumps(str(notes))} }}
timeout = "{timeout}"
{extra}
"""


def mcp_state(bot: Bot) -> dict[str, dict[str, object]]:
    hub = bot.daemon.runtime.mcp.hub
    assert hub is not None
    servers = hub.health()["servers"]
    assert isinstance(servers, dict)
    return cast(dict[str, dict[str, object]], servers)


@contextlib.asynccontextmanager
async def notes_bot(
    state_dir: Path, extra: str = "", config: str = "", *, timeout: str = "3s"
) -> AsyncIterator[Bot]:
    notes = state_dir / "notes"
    notes.mkdir(exist_ok=True)
    async with running_bot(state_dir, stdio_config(notes, extra, timeout=timeout) + config) as bot:
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        yield bot


def added(state_dir: Path) -> list[str]:
    log = state_dir / "notes" / "added.log"
    return log.read_text().splitlines() if log.exists() else []


ADD = '/tool notes__add_note {"title": "milk", "text": "buy milk"}'


async def test_a_read_tool_runs_at_once_and_a_write_tool_asks_in_the_chat(state_dir: Path) -> None:
    async with notes_bot(state_dir, "trust_annotations = true") as bot:
        first = await bot.channel.say("/tool notes__list_notes {}")
        assert "(no notes)" in (await bot.channel.reply_to(first)).text

        asked = await bot.channel.say(ADD)
        prompt = await bot.channel.prompt_for(asked)
        assert "notes__add_note" in prompt.text and "milk" in prompt.text
        assert added(state_dir) == []
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        assert "added milk" in (await bot.channel.reply_to(asked)).text
        assert added(state_dir) == ["milk"]

        denied = await bot.channel.say('/tool notes__add_note {"title": "eggs", "text": "x"}')
        prompt = await bot.channel.prompt_for(denied)
        assert prompt.approval is not None
        await bot.channel.press(approval_action(DecisionVerb.DENY, prompt.approval.request_id))
        assert "APPROVAL_DENIED" in (await bot.channel.reply_to(denied)).text
        assert added(state_dir) == ["milk"]


async def test_bad_arguments_are_refused_before_the_server_sees_them(state_dir: Path) -> None:
    async with notes_bot(state_dir, "trust_annotations = true") as bot:
        for args in [
            '{"title": ""}',
            '{"title": 5, "text": "x"}',
            '{"title": "a", "text": "b", "x": 1}',
        ]:
            inbound = await bot.channel.say(f"/tool notes__add_note {args}")
            assert "INVALID_PARAMETER" in (await bot.channel.reply_to(inbound)).text
        assert added(state_dir) == []


async def test_an_error_result_and_other_content_reach_the_chat_described(state_dir: Path) -> None:
    async with notes_bot(state_dir, 'risk = { fail = "read", picture = "read" }') as bot:
        failed = await bot.channel.say("/tool notes__fail {}")
        text = (await bot.channel.reply_to(failed)).text
        assert "TOOL_ERROR" in text and "the notes are locked" in text
        picture = await bot.channel.say("/tool notes__picture {}")
        assert "[image: image/png, 70 bytes]" in (await bot.channel.reply_to(picture)).text


def test_risk_comes_from_the_owner_then_trusted_annotations_then_write() -> None:
    registry = ToolRegistry()
    config = parse_config(
        {"mcp": {"servers": [
            {"name": "a", "command": ["x"], "risk": {"tidy": "read"}},
            {"name": "b", "command": ["x"], "trust_annotations": True,
             "risk": {"look": "dangerous"}},
        ]}},
        "t.toml",
    )  # fmt: skip
    hub = McpHub(config.mcp.servers, registry, {})
    schema = {"type": "object"}
    tools = [
        RemoteTool("look", "", schema, {"readOnlyHint": True}),
        RemoteTool("tidy", "", schema, {"destructiveHint": True}),
        RemoteTool("edit", "", schema, {"readOnlyHint": False, "destructiveHint": False}),
        RemoteTool("wipe", "", schema, {}),
    ]
    hub.install(hub.servers["a"], tools)
    hub.install(hub.servers["b"], tools)
    risks = {t.name: (t.risk, t.risk_source) for t in registry if isinstance(t, McpTool)}
    assert risks == {
        # a: annotations not trusted: the owner's word, else write
        "a__look": (Risk.WRITE, "default"),
        "a__tidy": (Risk.READ, "owner"),
        "a__edit": (Risk.WRITE, "default"),
        "a__wipe": (Risk.WRITE, "default"),
        # b: trusted annotations never beat the owner's word
        "b__look": (Risk.DANGEROUS, "owner"),
        "b__tidy": (Risk.DANGEROUS, "annotation"),
        "b__edit": (Risk.WRITE, "annotation"),
        "b__wipe": (Risk.DANGEROUS, "annotation"),  # the spec's default: destructive
    }


def test_names_are_reduced_and_a_collision_leaves_the_second_out_naming_both() -> None:
    registry = ToolRegistry()
    config = parse_config({"mcp": {"servers": [{"name": "n", "command": ["x"]}]}}, "t.toml")
    hub = McpHub(config.mcp.servers, registry, {})
    schema = {"type": "object"}
    long = "x" * 100
    hub.install(
        hub.servers["n"],
        [
            RemoteTool("a.b", "", schema),
            RemoteTool("a b", "", schema),
            RemoteTool(long, "", schema),
        ],
    )
    assert registry.names() == sorted(["n__a_b", ("n__" + long)[:64]])
    [problem] = hub.servers["n"].status.problems
    assert "a b" in problem and "n__a_b" in problem and "a.b of n" in problem


async def test_a_tool_with_a_broken_schema_is_left_out_and_the_rest_work(state_dir: Path) -> None:
    notes = state_dir / "notes"
    notes.mkdir()
    config = stdio_config(notes, "trust_annotations = true").replace(
        f"NOTES_DIR = {json.dumps(str(notes))}",
        f'NOTES_DIR = {json.dumps(str(notes))}, NOTES_BAD_SCHEMA = "1"',
    )
    async with running_bot(state_dir, config) as bot:
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        assert bot.daemon.runtime.registry.get("notes__broken") is None
        hub = bot.daemon.runtime.mcp.hub
        assert hub is not None
        assert any("broken" in p for p in hub.servers["notes"].status.problems)
        inbound = await bot.channel.say("/tool notes__list_notes {}")
        assert "(no notes)" in (await bot.channel.reply_to(inbound)).text


async def test_a_server_that_dies_mid_call_is_outcome_unknown_and_comes_back(
    state_dir: Path,
) -> None:
    async with notes_bot(state_dir, 'risk = { crash = "write", list_notes = "read" }') as bot:
        inbound = await bot.channel.say("/tool notes__crash {}")
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        reply = (await bot.channel.reply_to(inbound)).text
        assert "OUTCOME_UNKNOWN" in reply and "not run again" in reply
        down = await bot.channel.say("/tool notes__list_notes {}")
        text = (await bot.channel.reply_to(down)).text
        assert "TOOL_UNAVAILABLE" in text or "(no notes)" in text, text  # down, or back already
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        again = await bot.channel.say("/tool notes__list_notes {}")
        assert "(no notes)" in (await bot.channel.reply_to(again)).text


async def test_a_call_past_its_timeout_is_cancelled_and_outcome_unknown(state_dir: Path) -> None:
    async with notes_bot(state_dir, 'risk = { hang = "write" }') as bot:
        inbound = await bot.channel.say('/tool notes__hang {"seconds": 60}')
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        reply = (await bot.channel.reply_to(inbound, timeout=15)).text
        assert "OUTCOME_UNKNOWN" in reply and "told to cancel" in reply
        await eventually(lambda: (state_dir / "notes" / "cancelled").exists())


async def test_a_tool_that_keeps_its_server_from_answering_pings_runs_to_its_end(
    state_dir: Path,
) -> None:
    """A synchronous tool (most small Python and Node servers) answers no ping while it
    works: past the pings' 10 s the server is still alive, and within the call's
    ``timeout`` its answer is the call's (it was killed as gone, mid-work)."""
    async with notes_bot(state_dir, 'risk = { block = "read" }', timeout="40s") as bot:
        inbound = await bot.channel.say('/tool notes__block {"seconds": 14}')
        reply = (await bot.channel.reply_to(inbound, timeout=40)).text
        assert "done blocking" in reply, reply
        assert mcp_state(bot)["notes"]["state"] == "ready"


async def test_a_changed_tool_list_reaches_the_registry(state_dir: Path) -> None:
    async with notes_bot(state_dir, "trust_annotations = true") as bot:
        assert bot.daemon.runtime.registry.get("notes__extra") is None
        inbound = await bot.channel.say("/tool notes__grow {}")
        assert "grown" in (await bot.channel.reply_to(inbound)).text
        await eventually(lambda: bot.daemon.runtime.registry.get("notes__extra") is not None)
        assert any(t.name == "notes__extra" for t in bot.daemon.runtime.exposed())


async def test_a_stdio_server_gets_only_its_own_environment(state_dir: Path) -> None:
    extra = 'secret_env = { NOTES_TOKEN = "ECHO_NOTES_TOKEN" }\nrisk = { env = "read" }'
    notes = state_dir / "notes"
    notes.mkdir()
    environ = {"ECHO_NOTES_TOKEN": "s3cr3t-notes-token", "TELEGRAM_BOT_TOKEN": "123:tg-token"}
    async with running_bot(state_dir, stdio_config(notes, extra), environ=environ) as bot:
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        hub = bot.daemon.runtime.mcp.hub
        assert hub is not None
        answer = await hub.servers["notes"].call("env", {}, 5)
        seen = json.loads(answer.content[0]["text"])
        assert seen["NOTES_TOKEN"] == "s3cr3t-notes-token"
        assert str(notes) == seen["NOTES_DIR"]
        assert "TELEGRAM_BOT_TOKEN" not in seen and "ECHO_NOTES_TOKEN" not in seen
        assert set(seen) <= {"NOTES_TOKEN", "NOTES_DIR", "HOME", "LOGNAME", "PATH", "SHELL",
                             "TERM", "USER", "LC_CTYPE"}  # fmt: skip
        inbound = await bot.channel.say("/tool notes__env {}")
        reply = (await bot.channel.reply_to(inbound)).text
        assert "s3cr3t-notes-token" not in reply  # masked like every secret


async def test_sampling_asked_by_a_server_is_declined_with_a_reason(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with notes_bot(state_dir, 'risk = { ask_model = "read", ask_user = "read" }') as bot:
        inbound = await bot.channel.say("/tool notes__ask_model {}")
        reply = (await bot.channel.reply_to(inbound)).text
        assert "does not support sampling yet" in reply
        inbound = await bot.channel.say("/tool notes__ask_user {}")
        reply = (await bot.channel.reply_to(inbound)).text
        assert "does not support elicitation yet" in reply
    said = [r.getMessage() for r in caplog.records]
    assert "mcp notes asked for sampling: declined (not supported yet)" in said
    assert "mcp notes asked for elicitation: declined (not supported yet)" in said


async def test_a_server_that_cannot_start_is_down_and_its_tools_unavailable_at_once(
    state_dir: Path,
) -> None:
    config = """
[[mcp.servers]]
name = "gone"
command = ["/nonexistent/mcp-server"]

[[cron]]
name = "nightly"
schedule = "0 3 29 2 *"
tool = "gone__sync"
deliver_to = "cli:local"
"""
    async with running_bot(state_dir, config) as bot:  # READY is not held back for long
        await eventually(lambda: mcp_state(bot)["gone"]["state"] == "down")
        assert "no such file" in str(mcp_state(bot)["gone"])
        inbound = await bot.channel.say("/tool gone__sync {}")
        reply = (await bot.channel.reply_to(inbound, timeout=5)).text
        assert "TOOL_UNAVAILABLE" in reply and "gone is down" in reply, reply


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ({"name": "a__b", "command": ["x"]}, "single '_'"),
        ({"name": "a", "command": ["x"], "url": "http://127.0.0.1:1/mcp"}, "exactly one of"),
        ({"name": "a"}, "exactly one of"),
        ({"name": "a", "url": "ftp://h/mcp"}, "http:// or https://"),
        ({"name": "a", "url": "http://h/mcp", "env": {"A": "1"}}, "started by 'command'"),
        ({"name": "a", "command": ["x"], "headers_env": {"X": "Y"}}, "reached by 'url'"),
        ({"name": "a", "command": ["x"], "risk": {"t": "harmless"}}, "risk"),
        ({"name": "a", "command": ["x"], "timeout": "0s"}, "timeout"),
        ({"name": "a", "command": ["x"], "secret_env": {"T": "not a name!"}}, "environment"),
        ({"name": "a", "command": ["x"], "unknown": 1}, "unknown"),
    ],
)
def test_bad_server_config_is_one_clear_error(server: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"mcp": {"servers": [server]}}, "t.toml")
    assert expected in str(caught.value).lower() or expected in str(caught.value)


def test_two_servers_of_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        parse_config(
            {
                "mcp": {
                    "servers": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]
                }
            },
            "t.toml",
        )


async def test_over_streamable_http_with_headers_from_the_environment(state_dir: Path) -> None:
    notes = state_dir / "notes"
    notes.mkdir()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SERVER), "http",
        stdout=asyncio.subprocess.PIPE,
        env={"NOTES_DIR": str(notes), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            port = int((await proc.stdout.readline()).decode().strip().split("=")[1])
        config = f"""
[[mcp.servers]]
name = "remote"
url = "http://127.0.0.1:{port}/mcp"
headers_env = {{ Authorization = "REMOTE_AUTH" }}
trust_annotations = true
"""
        environ = {"REMOTE_AUTH": "Bearer remote-token"}
        async with running_bot(state_dir, config, environ=environ) as bot:
            await eventually(lambda: mcp_state(bot)["remote"]["state"] == "ready")
            inbound = await bot.channel.say("/tool remote__list_notes {}")
            assert "(no notes)" in (await bot.channel.reply_to(inbound)).text
            proc.kill()
            await proc.wait()
            await eventually(lambda: mcp_state(bot)["remote"]["state"] == "down")
            after = await bot.channel.say("/tool remote__list_notes {}")
            assert "TOOL_UNAVAILABLE" in (await bot.channel.reply_to(after)).text
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_a_plain_run_does_not_import_the_mcp_sdk(tmp_path: Path) -> None:
    code = (
        "import sys; from echo_bot.runtime import build; from echo_bot.config import"
        " LoadedConfig, parse_config; from pathlib import Path;"
        " build(LoadedConfig(config=parse_config({}, 't')), Path(sys.argv[1]), {});"
        " print(sorted(m for m in sys.modules if m.split('.')[0] == 'mcp'"
        " or m.startswith('echo_bot.mcp')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_mcp_list_shows_each_server_its_tools_their_risk_and_its_source(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    config = tmp_path / "echo-bot.toml"
    config.write_text(
        stdio_config(notes, 'trust_annotations = true\nrisk = { purge = "read" }')
        + '\n[[mcp.servers]]\nname = "gone"\ncommand = ["/nonexistent/mcp-server"]\n'
    )
    done = run_echo_bot("mcp", "list", "--config", str(config), "--state-dir", str(tmp_path / "s"))
    assert done.returncode == 1, done.stderr  # one server is not ready
    lines = done.stdout.splitlines()
    assert lines[0] == "notes (stdio): ready, 12 tools"
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.startswith("  notes__")}
    assert rows["notes__list_notes"] == ["read", "annotation"]
    assert rows["notes__add_note"] == ["write", "annotation"]
    assert rows["notes__purge"] == ["read", "owner"]
    assert rows["notes__crash"] == ["dangerous", "annotation"]
    assert "gone (stdio): down — cannot start /nonexistent/mcp-server: no such file" in lines
    none = tmp_path / "none.toml"
    none.write_text("")
    quiet = run_echo_bot("mcp", "list", "--config", str(none), "--state-dir", str(tmp_path / "s"))
    assert quiet.returncode == 0 and "no MCP servers configured" in quiet.stdout


async def test_a_signed_webhook_route_can_call_an_mcp_tool_through_the_gate(
    state_dir: Path,
) -> None:
    """A route whose tool is an MCP server's: the signed delivery is accepted, the call
    waits for approval in the route's chat like any write tool, and runs once."""
    import aiohttp

    secret = "webhook-bearer-secret-for-notes"
    notes = state_dir / "notes"
    notes.mkdir()
    config = (
        stdio_config(notes, "trust_annotations = true")
        + """
[http]
port = 0
[webhook]
enabled = true

[[webhook.routes]]
name = "note"
auth = "bearer"
secret_env = "NOTE_SECRET"
tool = "notes__add_note"
args = { title = "{payload[title]}", text = "from a webhook" }
deliver_to = "cli:local"
"""
    )
    async with running_bot(
        state_dir, config, environ={"NOTE_SECRET": secret}, channels=["webhook"]
    ) as bot:
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        assert bot.daemon.http is not None
        url = f"http://127.0.0.1:{bot.daemon.http.port}/hooks/note"
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=b'{"title": "deploy"}', headers=headers) as answer:
                assert answer.status == 202, await answer.text()
            async with http.get(url.replace("/hooks/note", "/healthz")) as health:
                assert health.status == 200
                assert (await health.json())["components"]["mcp"] == {"status": "ok"}
            unsigned_headers = {"Content-Type": "application/json"}
            async with http.post(url, data=b'{"title": "x"}', headers=unsigned_headers) as unsigned:
                assert unsigned.status == 401
        prompt = await bot.channel.wait_for(lambda m: m.kind == "approval")
        assert "notes__add_note" in prompt.text and "deploy" in prompt.text
        assert added(state_dir) == []
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        result = await bot.channel.wait_for(lambda m: "added deploy" in m.text)
        assert result.to == bot.channel.address()
        assert added(state_dir) == ["deploy"]


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_sighup_adds_removes_and_restarts_servers_whose_config_changed(
    state_dir: Path,
) -> None:
    notes, more = state_dir / "notes", state_dir / "more"
    notes.mkdir()
    more.mkdir()
    first = stdio_config(notes, "trust_annotations = true")
    async with running_bot(state_dir, first) as bot:
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        path = bot.daemon.runtime.loaded.path
        assert path is not None
        registry = bot.daemon.runtime.registry
        changed = stdio_config(notes, 'trust_annotations = true\nrisk = { purge = "read" }')
        path.write_text(changed + stdio_config(more, "trust_annotations = true", name="more"))
        await bot.daemon.reload()
        await eventually(
            lambda: (
                {s["state"] for s in mcp_state(bot).values()} == {"ready"}
                and len(mcp_state(bot)) == 2
            )
        )
        purge = registry.get("notes__purge")
        assert purge is not None and purge.risk == Risk.READ  # the new config's word
        inbound = await bot.channel.say("/tool more__list_notes {}")
        assert "(no notes)" in (await bot.channel.reply_to(inbound)).text

        path.write_text(stdio_config(more, "trust_annotations = true", name="more"))
        await bot.daemon.reload()
        assert set(mcp_state(bot)) == {"more"}
        assert not [n for n in registry.names() if n.startswith("notes__")]
        assert not [t for t in bot.daemon.runtime.exposed() if t.name.startswith("notes__")]
        gone = await bot.channel.say("/tool notes__list_notes {}")
        assert "TOOL_NOT_FOUND" in (await bot.channel.reply_to(gone)).text


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_status_and_doctor_show_each_server(state_dir: Path, tmp_path: Path) -> None:
    notes = state_dir / "notes"
    notes.mkdir()
    text = stdio_config(notes, "trust_annotations = true") + (
        '\n[[mcp.servers]]\nname = "gone"\ncommand = ["/nonexistent/mcp-server"]\n'
    )
    async with running_bot(state_dir, text) as bot:
        await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
        await eventually(lambda: mcp_state(bot)["gone"]["state"] == "down")
        config = tmp_path / "echo-bot.toml"
        config.write_text(text)
        args = ("--config", str(config), "--state-dir", str(state_dir))

        async def status_lines() -> list[str]:
            done = await asyncio.to_thread(run_echo_bot, "status", *args)
            assert done.returncode == 0, done.stderr
            return [line for line in done.stdout.splitlines() if line.startswith("mcp ")]

        async def both_shown() -> bool:
            return len(await status_lines()) == 2

        await eventually(both_shown)
        lines = await status_lines()
        assert "mcp notes: ready, 12 tools" in lines
        assert any(line.startswith("mcp gone: down — cannot start") for line in lines)
    doctor = await asyncio.to_thread(run_echo_bot, "doctor", *args)
    assert doctor.returncode == 1
    assert "mcp notes  stdio: ready, 12 tools" in doctor.stdout
    assert "[FAIL] mcp gone" in doctor.stdout and "no such file" in doctor.stdout


async def test_the_model_is_told_when_the_owner_denies_an_mcp_call(state_dir: Path) -> None:
    """The scripted model asks for a write MCP tool; the owner denies it in the chat; the
    model's next request carries APPROVAL_DENIED as that call's result; the server never
    saw the call. Tool descriptions reach the model marked as the server's."""
    from tests.fakes.openai_api import FakeOpenAI

    notes = state_dir / "notes"
    notes.mkdir()
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("notes__add_note", {"title": "milk", "text": "buy milk"})])
        llm.reply("Understood, I did not add it.")
        config = stdio_config(notes, "trust_annotations = true") + (
            f'[brain]\nkind = "openai"\n[openai]\nbase_url = "{llm.base_url}"\n'
            'model = "gpt-test"\nmax_retries = 0\n'
        )
        async with running_bot(state_dir, config) as bot:
            await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
            inbound = await bot.channel.say("note that I need milk")
            prompt = await bot.channel.prompt_for(inbound)
            assert prompt.approval is not None
            await bot.channel.press(approval_action(DecisionVerb.DENY, prompt.approval.request_id))
            reply = await bot.channel.reply_to(inbound)
            assert reply.text == "Understood, I did not add it."
        first, second = llm.chat_requests()
        offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
        assert offered["notes__add_note"]["description"].startswith(
            "[notes__add_note: a tool of the MCP server notes]"
        )
        [told] = [m for m in second["messages"] if m["role"] == "tool"]
        assert "APPROVAL_DENIED" in told["content"]
    assert added(state_dir) == []


async def test_approvals_require_and_never_name_mcp_tools_as_any_other(state_dir: Path) -> None:
    extra = 'trust_annotations = true\nrisk = { fail = "write" }'
    policy = '[approvals]\nrequire = ["notes__list_notes"]\nnever = ["notes__fail"]\n'
    async with notes_bot(state_dir, extra, policy) as bot:
        asked = await bot.channel.say("/tool notes__list_notes {}")  # read, but required
        await bot.channel.prompt_for(asked)
        unasked = await bot.channel.say("/tool notes__fail {}")  # write, but never asks
        assert "the notes are locked" in (await bot.channel.reply_to(unasked)).text


async def test_an_approval_for_a_tool_whose_server_was_removed_ends_the_call_not_the_turn(
    state_dir: Path,
) -> None:
    notes = state_dir / "notes"
    notes.mkdir()
    async with notes_bot(state_dir, "trust_annotations = true") as bot:
        inbound = await bot.channel.say(ADD)
        prompt = await bot.channel.prompt_for(inbound)
        path = bot.daemon.runtime.loaded.path
        assert path is not None
        path.write_text("")  # the server is removed while the approval waits
        await bot.daemon.reload()
        assert prompt.approval is not None
        await bot.channel.press(
            approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
        )
        reply = (await bot.channel.reply_to(inbound)).text
        assert "TOOL_NOT_FOUND" in reply and "notes__add_note" in reply
    assert added(state_dir) == []


def test_a_schema_that_checks_out_but_cannot_be_applied_is_an_invalid_call() -> None:
    registry = ToolRegistry()
    config = parse_config({"mcp": {"servers": [{"name": "n", "command": ["x"]}]}}, "t.toml")
    hub = McpHub(config.mcp.servers, registry, {})
    dangling = {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}
    hub.install(hub.servers["n"], [RemoteTool("t", "", dangling)])
    invalid = registry.validate("n__t", {"x": 1})
    assert invalid is not None and invalid.error_code == "INVALID_PARAMETER"
    assert "cannot be applied" in invalid.output
