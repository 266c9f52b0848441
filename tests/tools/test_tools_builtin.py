"""The built-in tools, exercised through ToolRegistry.execute (schemas included)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from echo_bot.config import HttpToolConfig, ShellToolConfig, ToolsConfig
from echo_bot.tools.base import ErrorCode, Risk, ToolContext, ToolResult
from echo_bot.tools.builtin import (
    CurrentTimeTool,
    HttpRequestTool,
    ShellExecTool,
    argv_of,
    builtin_tools,
)
from echo_bot.tools.builtin.web import host_allowed
from echo_bot.tools.registry import ToolRegistry

# --------------------------------------------------------------------------- helpers


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"  # deliberately not created: the tools create it


def make_registry(
    workspace: Path,
    *,
    shell: ShellToolConfig | None = None,
    http: HttpToolConfig | None = None,
    timezone: str = "Europe/Berlin",
) -> ToolRegistry:
    config = ToolsConfig(
        shell=shell or ShellToolConfig(enabled=True),
        http=http or HttpToolConfig(allow_domains=["127.0.0.1"]),
    )
    registry = ToolRegistry()
    for tool in builtin_tools(config, workspace=workspace, timezone=timezone):
        registry.register(tool)
    return registry


@pytest.fixture
def registry(workspace: Path) -> ToolRegistry:
    return make_registry(workspace)


async def call(registry: ToolRegistry, ctx: ToolContext, name: str, **args: Any) -> ToolResult:
    return await registry.execute(name, args, ctx)


# --------------------------------------------------------------------------- registration


def test_builtin_tools_register_and_declare(workspace: Path) -> None:
    registry = make_registry(workspace)
    assert registry.names() == [
        "current_time",
        "file_read",
        "file_write",
        "http_request",
        "send_file",
        "send_message",
        "shell_exec",
    ]
    shell = registry.get("shell_exec")
    assert isinstance(shell, ShellExecTool)
    assert shell.risk is Risk.DANGEROUS and shell.group == "coding" and not shell.idempotent
    assert shell.timeout == 35.0  # config default 30 s + 5
    assert ShellExecTool.timeout == 30.0  # the class default is untouched
    assert registry.get("current_time").idempotent  # type: ignore[union-attr]
    assert registry.get("file_read").risk is Risk.READ  # type: ignore[union-attr]
    assert registry.get("file_write").risk is Risk.WRITE  # type: ignore[union-attr]


def test_switched_off_tools_report_unavailable(workspace: Path) -> None:
    tools = {t.name: t for t in builtin_tools(ToolsConfig(), workspace=workspace, timezone="UTC")}
    assert set(tools) == {
        "current_time",
        "send_message",
        "send_file",
        "shell_exec",
        "file_read",
        "file_write",
        "http_request",
    }
    assert not tools["shell_exec"].available()  # shell.enabled defaults to false
    assert not tools["http_request"].available()  # no allowed domain at all
    assert tools["current_time"].available() and tools["file_read"].available()


def test_importing_the_builtins_does_not_import_aiohttp() -> None:
    code = (
        "import sys, echo_bot.tools.builtin\n"
        "assert 'aiohttp' not in sys.modules, 'aiohttp imported'\n"
        "assert 'yarl' not in sys.modules, 'yarl imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- current_time


async def test_current_time_formats_the_moment(ctx: ToolContext) -> None:
    registry = ToolRegistry()
    fixed = datetime(2026, 11, 30, 7, 52, 10, tzinfo=UTC)
    registry.register(CurrentTimeTool("Europe/Berlin", now=lambda: fixed))
    result = await call(registry, ctx, "current_time")
    assert result.ok
    assert result.output == "It is Monday 30 November 2026, 08:52 (Europe/Berlin, UTC+01:00)."
    assert result.data["timezone"] == "Europe/Berlin"
    assert result.data["iso"] == "2026-11-30T08:52:10+01:00"

    other = await call(registry, ctx, "current_time", timezone="Asia/Kolkata")
    assert other.output == "It is Monday 30 November 2026, 13:22 (Asia/Kolkata, UTC+05:30)."
    west = await call(registry, ctx, "current_time", timezone="america/new_york")
    assert west.output == "It is Monday 30 November 2026, 02:52 (America/New_York, UTC-05:00)."


async def test_current_time_live_clock(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await call(registry, ctx, "current_time", timezone="UTC")
    assert result.ok
    assert result.output.startswith("It is ") and result.output.endswith("(UTC, UTC+00:00).")


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime"])
async def test_current_time_rejects_unknown_timezone(
    registry: ToolRegistry, ctx: ToolContext, zone: str
) -> None:
    result = await call(registry, ctx, "current_time", timezone=zone)
    assert not result.ok
    assert result.error_code is ErrorCode.INVALID_PARAMETER
    assert "unknown timezone" in result.output


async def test_current_time_rejects_unexpected_arguments(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    result = await call(registry, ctx, "current_time", zone="UTC")
    assert result.error_code is ErrorCode.INVALID_PARAMETER


def test_current_time_extract_args() -> None:
    tool = CurrentTimeTool("UTC")
    assert tool.extract_args("what time is it?") == {}
    assert tool.extract_args("What time is it in Europe/Berlin?") == {"timezone": "Europe/Berlin"}
    assert tool.extract_args("time in america/los_angeles please") == {
        "timezone": "America/Los_Angeles"
    }
    assert tool.extract_args("what day is it in UTC") == {"timezone": "UTC"}
    # An unknown place is passed on, so the answer says so instead of giving UTC.
    assert tool.extract_args("what time is it in Mars/Olympus") == {"timezone": "Mars/Olympus"}
    assert tool.extract_args("what time is it in Tokyo?") == {"timezone": "Asia/Tokyo"}
    assert tool.extract_args("time in new york city") == {"timezone": "America/New_York"}
    assert tool.extract_args("what time is it in the morning") == {}
    assert "what time is it" in tool.triggers and "remind me" in tool.negative_triggers


# --------------------------------------------------------------------------- shell: allowlist


def allowlisted(*entries: str) -> ShellExecTool:
    return ShellExecTool(ShellToolConfig(enabled=True, allow_commands=list(entries)), Path("/tmp"))


@pytest.mark.parametrize(
    "args",
    [
        {"command": "uptime; rm -rf ~"},
        {"command": "uptime && rm x"},
        {"command": "uptime || rm x"},
        {"command": "uptime | sh"},
        {"command": "$(rm x)"},
        {"command": "`rm x`"},
        {"command": "/usr/bin/../bin/sh"},
        {"command": "/usr/bin/uptime"},
        {"command": "uptime -p"},
        {"command": "uptime\nrm x"},
        {"command": "uptime 'unterminated"},
        {"argv": ["uptime", ";", "rm", "-rf", "~"]},
        {"argv": ["uptime;", "rm"]},
        {"argv": ["sh", "-c", "uptime"]},
    ],
)
def test_shell_allowlist_refuses_hostile_lines(args: dict[str, Any], ctx: ToolContext) -> None:
    assert allowlisted("uptime").approval_override(args, ctx) is None


@pytest.mark.parametrize(
    "args", [{"command": "uptime"}, {"argv": ["uptime"]}, {"command": " uptime "}]
)
def test_shell_allowlist_allows_exact_match(args: dict[str, Any], ctx: ToolContext) -> None:
    assert allowlisted("uptime").approval_override(args, ctx) is False


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git status", False),
        ("git status src 'a file'", False),
        ("git status --short", None),  # options must be spelled in the entry
        ("git status -- 'a file'", None),
        ("git status src -s", None),
        ("git status --short *", None),
        ("git status -s", False),  # spelled: "git status -s *"
        ("git status -s src", False),
        ("git status -s -b", None),
        ("git log", None),
        ("git", None),
        ("git status; rm x", None),
        ("git status 'a;b'", None),
        ("git status $(rm x)", None),
        ("git status `rm x`", None),
        ("git status > /etc/passwd", None),
        ("git status & rm x", None),
        ("git status ( x )", None),
        ("git status --format=$HOME", None),
        ("df -h /", False),
        ("df -h / /home", None),
        # Paths out of the workspace are no operand of "*"; a range of commits is.
        ("git status /etc", None),
        ("git status ..", None),
        ("git status src/../../secret", None),
        ("git status ../x", None),
        ("git status main..feature src/..x", False),
    ],
)
def test_shell_allowlist_prefix_entries(
    command: str, expected: bool | None, ctx: ToolContext
) -> None:
    tool = allowlisted("git status *", "git status -s *", "df -h /", "bad 'quote *")
    assert tool.approval_override({"command": command}, ctx) is expected


def test_shell_allowlist_bare_star_allows_nothing(ctx: ToolContext) -> None:
    tool = allowlisted(" *", "*")
    assert tool.approval_override({"command": "rm -rf /"}, ctx) is None
    assert tool.approval_override({"command": "ls"}, ctx) is None


def test_argv_of() -> None:
    assert argv_of({"argv": ["ls", "-l"]}) == ["ls", "-l"]
    assert argv_of({"command": "grep -r 'two words' ."}) == ["grep", "-r", "two words", "."]
    with pytest.raises(ValueError):
        argv_of({"command": "echo 'open"})
    with pytest.raises(ValueError):
        argv_of({"command": "   "})


# --------------------------------------------------------------------------- shell: running


async def test_shell_runs_in_the_workspace(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    result = await call(registry, ctx, "shell_exec", command="echo hi")
    assert result.ok
    assert result.output == "hi\nexit code 0"
    assert result.data["exit_code"] == 0
    assert result.data["argv"] == ["echo", "hi"]

    where = await call(registry, ctx, "shell_exec", argv=["pwd"])
    assert where.output.splitlines()[0] == str(workspace.resolve())


async def test_shell_never_uses_a_shell(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await call(registry, ctx, "shell_exec", command="echo a; echo $HOME `id` | cat")
    assert result.ok
    assert result.output.splitlines()[0] == "a; echo $HOME `id` | cat"


async def test_shell_environment_is_scrubbed(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHO_BOT_TEST_API_KEY", "sk-do-not-leak-4242")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:also-secret")
    result = await call(registry, ctx, "shell_exec", argv=["env"])
    assert result.ok
    assert "sk-do-not-leak-4242" not in result.output
    assert "also-secret" not in result.output
    lines = result.output.splitlines()[:-1]  # without "exit code 0"
    env = dict(line.split("=", 1) for line in lines)
    home = Path(env.pop("HOME"))
    assert home.is_absolute() and not home.is_relative_to(workspace)
    assert not home.exists()  # private to the call, removed after it
    git = {key: env.pop(key) for key in list(env) if key.startswith("GIT_")}
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    assert git["GIT_CONFIG_NOSYSTEM"] == "1" and git["GIT_CONFIG_GLOBAL"] == "/dev/null"


async def test_shell_reports_exit_code_and_stderr(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await call(
        registry, ctx, "shell_exec", argv=["sh", "-c", "echo out; echo err >&2; exit 3"]
    )
    assert not result.ok
    assert result.output == "out\nstderr:\nerr\nexit code 3"
    assert result.data["exit_code"] == 3


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # killed but not yet reaped by init: a zombie
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


async def test_shell_timeout_kills_the_process_group(workspace: Path, ctx: ToolContext) -> None:
    registry = make_registry(
        workspace, shell=ShellToolConfig(enabled=True, timeout=timedelta(seconds=1))
    )
    assert registry.get("shell_exec").timeout == 6.0  # type: ignore[union-attr]
    # sh starts a grandchild and waits for it; the timeout must take down both.
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", "sleep 30 & echo $!; wait"])
    assert result.error_code is ErrorCode.TIMEOUT
    assert "did not finish within 1 s" in result.output
    grandchild = int(result.output.splitlines()[-1])
    for _ in range(200):  # wait for the kill to land; this is not a timing assertion
        if _process_gone(grandchild):
            break
        await asyncio.sleep(0.05)
    assert _process_gone(grandchild)


async def test_shell_output_is_capped(workspace: Path, ctx: ToolContext) -> None:
    registry = make_registry(workspace, shell=ShellToolConfig(enabled=True, max_output=1024))
    script = "yes | head -c 2000000; yes e | head -c 50000 >&2"
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", script])
    assert result.ok  # the child was drained to the end, not blocked on a full pipe
    assert result.data["truncated"] is True
    assert result.output.count("[output truncated]") == 2
    assert len(result.output) < 2 * 1024 + 200


async def test_shell_timeout_with_endless_output(workspace: Path, ctx: ToolContext) -> None:
    # The reader stops at the cap while the child keeps writing; the kill must still reap it
    # (in Python 3.11 Process.wait() also waits for the pipes to close).
    shell = ShellToolConfig(enabled=True, timeout=timedelta(seconds=1), max_output=1024)
    registry = make_registry(workspace, shell=shell)
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", "yes out & yes err >&2"])
    assert result.error_code is ErrorCode.TIMEOUT
    assert "did not finish within 1 s and was killed" in result.output  # ours, not the registry's
    assert "[output truncated]" in result.output


async def test_shell_missing_program(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await call(registry, ctx, "shell_exec", argv=["definitely-not-a-program-7f3a"])
    assert result.error_code is ErrorCode.NOT_FOUND
    assert "definitely-not-a-program-7f3a" in result.output


async def test_shell_malformed_quoting(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = await call(registry, ctx, "shell_exec", command="echo 'unterminated")
    assert result.error_code is ErrorCode.INVALID_PARAMETER


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"argv": ["echo"], "command": "echo"},
        {"argv": []},
        {"argv": "echo hi"},
        {"command": ""},
        {"command": "echo", "shell": True},
        {"command": "x" * 8193},
        {"argv": ["x"] * 257},
    ],
)
async def test_shell_schema(registry: ToolRegistry, ctx: ToolContext, args: dict[str, Any]) -> None:
    result = await registry.execute("shell_exec", args, ctx)
    assert result.error_code is ErrorCode.INVALID_PARAMETER


async def test_shell_disabled_is_refused(workspace: Path, ctx: ToolContext) -> None:
    registry = make_registry(workspace, shell=ShellToolConfig(enabled=False))
    result = await call(registry, ctx, "shell_exec", command="echo hi")
    assert result.error_code is ErrorCode.PERMISSION_DENIED
    assert not workspace.exists()  # nothing ran


# --------------------------------------------------------------------------- files


async def test_file_write_of_content_that_is_not_text_is_an_invalid_parameter(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    """A lone surrogate ("\\ud800" in the model's JSON) is refused as the argument it
    is, and nothing is written."""
    written = await call(registry, ctx, "file_write", path="bad.txt", content="a\ud800b")
    assert not written.ok and written.error_code == ErrorCode.INVALID_PARAMETER
    assert "not text" in written.output
    assert not (workspace / "bad.txt").exists()


async def test_file_write_read_round_trip(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    written = await call(registry, ctx, "file_write", path="notes/day/one.txt", content="héllo\n")
    assert written.ok, written.output
    assert written.data["bytes"] == len("héllo\n".encode())
    assert (workspace / "notes/day/one.txt").read_text() == "héllo\n"

    read = await call(registry, ctx, "file_read", path="notes/day/one.txt")
    assert read.ok and read.output == "héllo\n" and read.data["truncated"] is False

    appended = await call(
        registry, ctx, "file_write", path="notes/day/one.txt", content="more\n", append=True
    )
    assert appended.ok
    again = await call(registry, ctx, "file_read", path="./notes/../notes/day/one.txt")
    assert again.output == "héllo\nmore\n"


async def test_file_write_replaces_atomically(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    workspace.mkdir()
    target = workspace / "a.txt"
    target.write_text("old")
    target.chmod(0o600)
    result = await call(registry, ctx, "file_write", path="a.txt", content="new")
    assert result.ok
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]  # no temp file left


@pytest.mark.parametrize("path", ["../x", "a/../../x", "..", "/etc/passwd"])
async def test_file_paths_outside_are_refused(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path, tmp_path: Path, path: str
) -> None:
    workspace.mkdir()
    (tmp_path / "x").write_text("outside")
    read = await call(registry, ctx, "file_read", path=path)
    assert read.error_code is ErrorCode.PERMISSION_DENIED
    for target in (path, path + "/new"):
        write = await call(registry, ctx, "file_write", path=target, content="x")
        assert write.error_code in (ErrorCode.PERMISSION_DENIED, ErrorCode.INVALID_PARAMETER)
    write = await call(registry, ctx, "file_write", path=path + "/new", content="x")
    assert write.error_code is ErrorCode.PERMISSION_DENIED
    assert (tmp_path / "x").read_text() == "outside"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workspace", "x"]


async def test_file_write_absolute_path_is_refused(
    registry: ToolRegistry, ctx: ToolContext, tmp_path: Path
) -> None:
    target = tmp_path / "outside.txt"
    result = await call(registry, ctx, "file_write", path=str(target), content="x")
    assert result.error_code is ErrorCode.PERMISSION_DENIED
    assert not target.exists()


async def test_file_symlink_escapes_are_refused(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path, tmp_path: Path
) -> None:
    workspace.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "f.txt").write_text("also secret")
    (workspace / "link.txt").symlink_to(secret)
    (workspace / "linkdir").symlink_to(outside_dir)

    for path in ("link.txt", "linkdir/f.txt", "linkdir/../secret.txt"):
        result = await call(registry, ctx, "file_read", path=path)
        assert result.error_code is ErrorCode.PERMISSION_DENIED, path
        assert "top secret" not in result.output

    for path, append in (("link.txt", False), ("link.txt", True), ("linkdir/new.txt", False)):
        result = await call(registry, ctx, "file_write", path=path, content="pwned", append=append)
        assert result.error_code is ErrorCode.PERMISSION_DENIED, path
    assert secret.read_text() == "top secret"
    assert sorted(p.name for p in outside_dir.iterdir()) == ["f.txt"]


async def test_file_symlinks_inside_the_workspace(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "real").mkdir(parents=True)
    (workspace / "real/a.txt").write_text("inside")
    (workspace / "alias.txt").symlink_to(workspace / "real/a.txt")
    (workspace / "aliasdir").symlink_to(workspace / "real")

    assert (await call(registry, ctx, "file_read", path="alias.txt")).output == "inside"
    assert (await call(registry, ctx, "file_read", path="aliasdir/a.txt")).output == "inside"
    # A write never goes through a symlink as the final component, even one pointing inside.
    refused = await call(registry, ctx, "file_write", path="alias.txt", content="x")
    assert refused.error_code is ErrorCode.PERMISSION_DENIED
    assert (workspace / "real/a.txt").read_text() == "inside"
    via_dir = await call(registry, ctx, "file_write", path="aliasdir/b.txt", content="b")
    assert via_dir.ok and (workspace / "real/b.txt").read_text() == "b"


async def test_file_read_missing(registry: ToolRegistry, ctx: ToolContext, workspace: Path) -> None:
    result = await call(registry, ctx, "file_read", path="nope.txt")
    assert result.error_code is ErrorCode.NOT_FOUND
    workspace.mkdir()
    result = await call(registry, ctx, "file_read", path="dir/nope.txt")
    assert result.error_code is ErrorCode.NOT_FOUND


async def test_file_read_truncates_large_files(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    workspace.mkdir()
    (workspace / "big.txt").write_bytes(b"a" * (300 * 1024))
    result = await call(registry, ctx, "file_read", path="big.txt")
    assert result.ok
    assert result.data["truncated"] is True
    assert result.data["bytes"] == 256 * 1024 and result.data["size"] == 300 * 1024
    assert "truncated" in result.output.splitlines()[-1]

    small = await call(registry, ctx, "file_read", path="big.txt", max_bytes=10)
    assert small.output.startswith("a" * 10 + "\n[truncated")


async def test_file_read_binary_and_directories(
    registry: ToolRegistry, ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "sub").mkdir(parents=True)
    (workspace / "blob.bin").write_bytes(b"ok\xff\xfe\x00end")
    result = await call(registry, ctx, "file_read", path="blob.bin")
    assert result.ok and result.output == "ok\ufffd\ufffd\x00end"
    directory = await call(registry, ctx, "file_read", path="sub")
    assert directory.error_code is ErrorCode.INVALID_PARAMETER
    onto_dir = await call(registry, ctx, "file_write", path="sub", content="x")
    assert onto_dir.error_code is ErrorCode.INVALID_PARAMETER


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("file_write", {"path": "a.txt", "content": "x" * 1_000_001}),
        ("file_write", {"path": "a.txt"}),
        ("file_write", {"path": "", "content": "x"}),
        ("file_write", {"path": ".", "content": "x"}),
        ("file_read", {"path": "a.txt", "max_bytes": 0}),
        ("file_read", {"path": "a.txt", "mode": "r"}),
    ],
)
async def test_file_schema(
    registry: ToolRegistry, ctx: ToolContext, name: str, args: dict[str, Any]
) -> None:
    result = await registry.execute(name, args, ctx)
    assert result.error_code is ErrorCode.INVALID_PARAMETER


# --------------------------------------------------------------------------- http_request


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, int]]]:
    from aiohttp import web

    hits: dict[str, int] = {}

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

    def counted(handler: Handler) -> Handler:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            hits[request.path] = hits.get(request.path, 0) + 1
            return await handler(request)

        return wrapper

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="hello", headers={"ETag": '"v1"'})

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 200_000, content_type="text/plain")

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        while True:  # ends when the client goes away
            await response.write(b"y" * 16_384)

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    async def missing(request: web.Request) -> web.Response:
        return web.Response(status=404, text="no such thing")

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/ok"})

    async def echo(request: web.Request) -> web.Response:
        body = await request.text()
        return web.json_response(
            {"method": request.method, "body": body, "x": request.headers.get("X-Test")}
        )

    app = web.Application()
    app.router.add_get("/ok", counted(ok))
    app.router.add_get("/big", big)
    app.router.add_get("/endless", endless)
    app.router.add_get("/fail", fail)
    app.router.add_get("/missing", missing)
    app.router.add_get("/redirect", counted(redirect))
    app.router.add_route("*", "/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


@pytest.fixture
def http_registry(workspace: Path) -> ToolRegistry:
    # The test server is on loopback, which only allow_private lets through.
    http = HttpToolConfig(allow_domains=["127.0.0.1"], max_bytes=4096, allow_private=True)
    return make_registry(workspace, http=http)


async def test_http_get(
    http_registry: ToolRegistry, ctx: ToolContext, server: tuple[str, dict[str, int]]
) -> None:
    base, _ = server
    result = await call(http_registry, ctx, "http_request", url=f"{base}/ok")
    assert result.ok
    assert result.output == "HTTP 200 OK\nhello"
    assert result.data["status"] == 200 and result.data["truncated"] is False
    assert result.data["headers"]["ETag"] == '"v1"'

    head = await call(http_registry, ctx, "http_request", url=f"{base}/ok", method="HEAD")
    assert head.ok and head.output == "HTTP 200 OK"


async def test_http_post_sends_body_and_headers(
    http_registry: ToolRegistry, ctx: ToolContext, server: tuple[str, dict[str, int]]
) -> None:
    base, _ = server
    result = await call(
        http_registry,
        ctx,
        "http_request",
        url=f"{base}/echo",
        method="POST",
        headers={"X-Test": "yes"},
        body="payload",
    )
    assert result.ok
    assert '"method": "POST"' in result.output
    assert '"body": "payload"' in result.output and '"x": "yes"' in result.output


async def test_http_refuses_other_hosts_before_any_network_access(
    http_registry: ToolRegistry, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiohttp

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a session was opened for a refused host")

    monkeypatch.setattr(aiohttp, "ClientSession", no_network)
    for url in ("https://example.com/", "http://EXAMPLE.com./x", "http://127.0.0.1.example.com/"):
        result = await call(http_registry, ctx, "http_request", url=url)
        assert result.error_code is ErrorCode.PERMISSION_DENIED, url
        assert "example.com" in result.output.lower()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1/file",
        "file:///etc/passwd",
        "http://user:pw@127.0.0.1/",
        "http://127.0.0.1@example.com/",
        "http://example.com\\@127.0.0.1/",
        "http:///nohost",
        "http://127.0.0.1:99999/",
        "not a url",
    ],
)
async def test_http_rejects_odd_urls(
    http_registry: ToolRegistry, ctx: ToolContext, url: str
) -> None:
    result = await call(http_registry, ctx, "http_request", url=url)
    assert not result.ok
    assert result.error_code in (ErrorCode.INVALID_PARAMETER, ErrorCode.PERMISSION_DENIED)


def test_host_allowed() -> None:
    allow = ["example.com", "127.0.0.1", "API.Other.org."]
    assert host_allowed("example.com", allow)
    assert host_allowed("EXAMPLE.COM.", allow)
    assert host_allowed("deep.api.example.com", allow)
    assert host_allowed("api.other.org", allow) and host_allowed("v1.api.other.org", allow)
    assert not host_allowed("other.org", allow)
    assert not host_allowed("badexample.com", allow)
    assert not host_allowed("example.com.evil.net", allow)
    assert host_allowed("127.0.0.1", allow)
    assert not host_allowed("1.127.0.0.1", allow)  # no "subdomains" of an IP address
    assert not host_allowed("", allow) and not host_allowed(None, allow)
    assert not host_allowed("example.com", [])


async def test_http_truncates_large_bodies(
    http_registry: ToolRegistry, ctx: ToolContext, server: tuple[str, dict[str, int]]
) -> None:
    base, _ = server
    for path in ("/big", "/endless"):
        result = await call(http_registry, ctx, "http_request", url=f"{base}{path}")
        assert result.ok, result.output
        assert result.data["truncated"] is True
        assert result.output.endswith("[body truncated after 4096 bytes]")
        body = result.output.splitlines()[1]
        assert len(body) == 4096


async def test_http_server_errors(
    http_registry: ToolRegistry, ctx: ToolContext, server: tuple[str, dict[str, int]]
) -> None:
    base, _ = server
    failed = await call(http_registry, ctx, "http_request", url=f"{base}/fail")
    assert failed.error_code is ErrorCode.UPSTREAM_ERROR
    assert failed.output.startswith("HTTP 500") and "boom" in failed.output
    assert failed.data["status"] == 500

    missing = await call(http_registry, ctx, "http_request", url=f"{base}/missing")
    assert not missing.ok and missing.error_code is None
    assert missing.data["status"] == 404 and missing.output.startswith("HTTP 404 Not Found")


async def test_http_connection_refused_is_upstream_error(
    http_registry: ToolRegistry, ctx: ToolContext, server: tuple[str, dict[str, int]]
) -> None:
    import socket

    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = await call(http_registry, ctx, "http_request", url=f"http://127.0.0.1:{port}/")
    assert result.error_code is ErrorCode.UPSTREAM_ERROR


async def test_http_redirects_are_reported_not_followed(
    http_registry: ToolRegistry, ctx: ToolContext, server: tuple[str, dict[str, int]]
) -> None:
    base, hits = server
    result = await call(http_registry, ctx, "http_request", url=f"{base}/redirect")
    assert result.data["status"] == 302
    assert "Location: /ok" in result.output
    assert hits == {"/redirect": 1}  # /ok was never requested


def test_http_risk_depends_on_the_method() -> None:
    tool = HttpRequestTool(HttpToolConfig(allow_domains=["example.com"]))
    assert tool.risk is Risk.WRITE
    assert tool.risk_for({"url": "http://example.com"}) is Risk.READ
    assert tool.risk_for({"url": "http://example.com", "method": "GET"}) is Risk.READ
    assert tool.risk_for({"url": "http://example.com", "method": "HEAD"}) is Risk.READ
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert tool.risk_for({"url": "http://example.com", "method": method}) is Risk.WRITE


@pytest.mark.parametrize(
    "args",
    [
        {"url": "http://127.0.0.1/", "method": "TRACE"},
        {"url": "http://127.0.0.1/", "headers": {f"X-{i}": "v" for i in range(21)}},
        {"url": "http://127.0.0.1/", "headers": {"X-Num": 1}},
        {"url": "http://127.0.0.1/", "body": "x" * 100_001},
        {"url": "http://127.0.0.1/", "headers": {"X-Bad": "a\r\nInjected: 1"}},
        {"url": "http://127.0.0.1/", "headers": {"Bad Name": "v"}},
        {"method": "GET"},
    ],
)
async def test_http_schema(
    http_registry: ToolRegistry, ctx: ToolContext, args: dict[str, Any]
) -> None:
    result = await registry_execute(http_registry, "http_request", args, ctx)
    assert result.error_code is ErrorCode.INVALID_PARAMETER


async def registry_execute(
    registry: ToolRegistry, name: str, args: dict[str, Any], ctx: ToolContext
) -> ToolResult:
    return await registry.execute(name, args, ctx)
