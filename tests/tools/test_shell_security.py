"""Attacks on shell_exec and the file tools, performed against the real tools and
processes: an approved write must never become code execution, a " *" allowlist entry
admits no options, hard links lead nowhere, and no process outlives its call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from echo_bot.config import ShellToolConfig
from echo_bot.tools.base import ErrorCode, Risk, ToolContext, ToolResult
from echo_bot.tools.registry import ToolRegistry
from tests.conftest import run_echo_bot
from tests.tools.test_tools_builtin import make_registry

GIT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def shell_registry(workspace: Path, *allow: str, timeout: float = 30) -> ToolRegistry:
    shell = ShellToolConfig(
        enabled=True, allow_commands=list(allow), timeout=timedelta(seconds=timeout)
    )
    return make_registry(workspace, shell=shell)


async def call(registry: ToolRegistry, ctx: ToolContext, name: str, **args: Any) -> ToolResult:
    return await registry.execute(name, args, ctx)


async def run_allowlisted(registry: ToolRegistry, ctx: ToolContext, command: str) -> ToolResult:
    """Run ``command`` through shell_exec after checking it would run without asking."""
    tool = registry.get("shell_exec")
    assert tool is not None
    assert tool.approval_override({"command": command}, ctx) is False, "not allowlisted"
    return await call(registry, ctx, "shell_exec", command=command)


def git(workspace: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=workspace, env=GIT_ENV, check=True, capture_output=True)


def write_risk(registry: ToolRegistry, **args: Any) -> Risk:
    tool = registry.get("file_write")
    assert tool is not None
    return tool.risk_for(args)


# ----------------------------------------------------------- item 3: writes never run code


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        ".git/hooks/pre-commit",
        ".git/info/attributes",
        "./.git/config",
        "sub/.git/config",
        "a/../.git/config",
        ".gitattributes",
        ".gitconfig",
        "app/.npmrc",
        ".config/git/config",
    ],
)
def test_attack_writes_to_config_and_hook_paths_are_dangerous(workspace: Path, path: str) -> None:
    registry = shell_registry(workspace, "git status")
    for append in (False, True):
        assert write_risk(registry, path=path, content="x", append=append) is Risk.DANGEROUS


@pytest.mark.parametrize("path", ["notes.txt", "src/main.py", "a.b/c.d", "config", "HEAD"])
def test_plain_writes_stay_write_risk(workspace: Path, path: str) -> None:
    registry = shell_registry(workspace)
    assert write_risk(registry, path=path, content="x") is Risk.WRITE


async def test_attack_fsmonitor_planted_by_file_write_never_runs_unasked(
    workspace: Path, ctx: ToolContext
) -> None:
    git(workspace, "init", "-q")
    registry = shell_registry(workspace, "git status")
    planted = '[core]\n\tfsmonitor = "touch fsmonitor-ran"\n'
    write = {"path": ".git/config", "content": planted, "append": True}
    # The gate asks for a dangerous call whatever [approvals] never or a grant says ...
    assert write_risk(registry, **write) is Risk.DANGEROUS
    assert write_risk(registry, path=".gitconfig", content=planted) is Risk.DANGEROUS
    # ... and should the write get through anyway, git status still runs only git.
    assert (await call(registry, ctx, "file_write", **write)).ok
    assert (await call(registry, ctx, "file_write", path=".gitconfig", content=planted)).ok
    result = await run_allowlisted(registry, ctx, "git status")
    assert result.ok, result.output
    assert not (workspace / "fsmonitor-ran").exists()


async def test_attack_hooks_path_planted_in_git_config_never_runs_unasked(
    workspace: Path, ctx: ToolContext
) -> None:
    git(workspace, "init", "-q")
    (workspace / "tracked").write_text("a\n")
    git(workspace, "add", "tracked")
    registry = shell_registry(workspace, "git status")
    hook = {"path": "hooks/post-index-change", "content": "#!/bin/sh\ntouch hook-ran\n"}
    config = {"path": ".git/config", "content": "[core]\n\thooksPath = hooks\n", "append": True}
    alias = {"path": ".git/config", "content": "[alias]\n\tst = !touch alias-ran\n"}
    assert write_risk(registry, **config) is Risk.DANGEROUS
    assert write_risk(registry, **alias, append=True) is Risk.DANGEROUS
    assert write_risk(registry, path=".git/hooks/post-index-change", content="x") is (
        Risk.DANGEROUS
    )
    # Through another route: the hook is in place, executable, and git refreshes its
    # index (the tracked file's mtime changed), which is when post-index-change runs.
    assert (await call(registry, ctx, "file_write", **hook)).ok
    assert (await call(registry, ctx, "file_write", **config)).ok
    (workspace / "hooks/post-index-change").chmod(0o755)
    os.utime(workspace / "tracked", (1_000_000_000, 1_000_000_000))
    result = await run_allowlisted(registry, ctx, "git status")
    assert result.ok, result.output
    assert not (workspace / "hook-ran").exists()


async def test_attack_bare_repository_planted_without_dots_never_runs_unasked(
    workspace: Path, ctx: ToolContext
) -> None:
    # No dot anywhere: every write is plain write risk and needs no approval when
    # file_write is in [approvals] never. git must not take the workspace for a repository.
    registry = shell_registry(workspace, "git fetch origin")
    config = (
        '[remote "origin"]\n\turl = ext::sh -c touch% ext-ran\n[protocol "ext"]\n\tallow = always\n'
    )
    files = {
        "HEAD": "ref: refs/heads/main\n",
        "config": config,
        "objects/pack/README": "x\n",
        "refs/tags/README": "x\n",
    }
    for path, content in files.items():
        assert write_risk(registry, path=path, content=content) is Risk.WRITE
        assert (await call(registry, ctx, "file_write", path=path, content=content)).ok
    result = await run_allowlisted(registry, ctx, "git fetch origin")
    assert not (workspace / "ext-ran").exists()
    assert not result.ok
    assert "bare repository" in result.output


async def test_attack_dot_path_reached_through_a_symlink_is_refused(
    workspace: Path, ctx: ToolContext
) -> None:
    git(workspace, "init", "-q")
    before = (workspace / ".git/config").read_text()
    (workspace / "gitdir").symlink_to(".git")
    registry = shell_registry(workspace)
    args = {"path": "gitdir/config", "content": '[core]\n\tfsmonitor = "touch x"\n'}
    assert write_risk(registry, **args) is Risk.WRITE  # the name says nothing, so ...
    result = await call(registry, ctx, "file_write", **args)
    assert result.error_code is ErrorCode.PERMISSION_DENIED  # ... the write is refused
    assert ".git/config" in result.output
    assert (workspace / ".git/config").read_text() == before


async def test_shell_home_is_private_empty_and_removed(workspace: Path, ctx: ToolContext) -> None:
    registry = shell_registry(workspace)
    script = (
        'echo "$HOME"; ls -A "$HOME" | wc -l; stat -c %a "$HOME"; '
        'mkdir -p "$HOME/locked/in"; chmod 0 "$HOME/locked"'
    )
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", script])
    assert result.ok, result.output
    home, entries, mode = result.output.splitlines()[:3]
    assert not Path(home).is_relative_to(workspace)
    assert entries.strip() == "0"
    assert mode == "700"
    assert not Path(home).exists()


def test_attack_fsmonitor_through_a_daemon_with_file_write_in_never(tmp_path: Path) -> None:
    state = tmp_path / "st"
    workspace = state / "workspace"
    workspace.mkdir(parents=True)
    git(workspace, "init", "-q")
    before = (workspace / ".git/config").read_text()
    config = tmp_path / "config.toml"
    config.write_text(
        '[tools]\nprofile = "coding"\n'
        '[tools.shell]\nenabled = true\nallow_commands = ["git status"]\n'
        '[approvals]\nnever = ["file_write"]\n'
    )
    write = {
        "path": ".git/config",
        "content": '[core]\n\tfsmonitor = "touch fsmonitor-ran"\n',
        "append": True,
    }
    script = (
        f'/tool file_write {json.dumps(write)}\nn\n/tool shell_exec {{"command": "git status"}}\n'
    )
    result = run_echo_bot("chat", "--config", str(config), "--state-dir", str(state), input=script)
    assert result.returncode == 0, result.stderr
    assert not (workspace / "fsmonitor-ran").exists()
    assert "Approve file_write(" in result.stdout
    assert "APPROVAL_DENIED" in result.stdout
    assert "Approve shell_exec" not in result.stdout  # git status is allowlisted ...
    assert "exit code 0" in result.stdout  # ... and ran
    assert (workspace / ".git/config").read_text() == before


# ------------------------------------------------- item 5: " *" entries admit no options

STAR_ENTRIES = ("git *", "find *", "tar *")
OPTION_ATTACKS = [
    ["git", "-c", "alias.x=!touch git-alias-ran", "x"],
    ["find", ".", "-maxdepth", "0", "-exec", "touch", "find-exec-ran", "{}", "+"],
    ["find", ".", "-maxdepth", "0", "-fprint", "find-fprint-ran"],
    ["tar", "-cf", "/dev/null", "--checkpoint=1", "--checkpoint-action=exec=touch tar-ran", "."],
    ["git", "status", "--", "x"],
]


@pytest.mark.parametrize("argv", OPTION_ATTACKS)
def test_attack_star_entries_admit_no_options(
    workspace: Path, ctx: ToolContext, argv: list[str]
) -> None:
    tool = shell_registry(workspace, *STAR_ENTRIES).get("shell_exec")
    assert tool is not None
    assert tool.approval_override({"argv": argv}, ctx) is None
    assert tool.approval_override({"argv": [argv[0], "operand"]}, ctx) is False


def test_attack_star_entry_options_through_a_daemon_all_ask(tmp_path: Path) -> None:
    state = tmp_path / "st"
    workspace = state / "workspace"
    workspace.mkdir(parents=True)
    config = tmp_path / "config.toml"
    config.write_text(
        '[tools]\nprofile = "coding"\n'
        f"[tools.shell]\nenabled = true\nallow_commands = {json.dumps(list(STAR_ENTRIES))}\n"
    )
    attacks = OPTION_ATTACKS[:4]
    script = "".join(f"/tool shell_exec {json.dumps({'argv': argv})}\nn\n" for argv in attacks)
    result = run_echo_bot("chat", "--config", str(config), "--state-dir", str(state), input=script)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in workspace.iterdir()) == []  # no marker: nothing ran
    assert result.stdout.count("Approve shell_exec(") == len(attacks)


# ------------------------------------------------------------- item 13a: hard links


@pytest.mark.parametrize("append", [False, True])
async def test_attack_hard_link_to_a_file_outside_is_neither_read_nor_written(
    tmp_path: Path, workspace: Path, ctx: ToolContext, append: bool
) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("the owner's secret\n")
    os.link(secret, workspace / "notes.txt")
    registry = shell_registry(workspace)
    read = await call(registry, ctx, "file_read", path="notes.txt")
    assert read.error_code is ErrorCode.PERMISSION_DENIED
    assert "hard links" in read.output and "secret" not in read.output
    write = await call(
        registry, ctx, "file_write", path="notes.txt", content="planted\n", append=append
    )
    assert write.error_code is ErrorCode.PERMISSION_DENIED
    assert secret.read_text() == "the owner's secret\n"
    assert (workspace / "notes.txt").stat().st_nlink == 2


# ------------------------------------------------- item 13b: nothing outlives the call


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # killed but not yet reaped: a zombie
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


async def _wait_gone(pid: int) -> bool:
    for _ in range(400):  # a generous deadline for a loaded machine, not a timing check
        if _gone(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def _pids(workspace: Path, *names: str) -> list[int]:
    return [int((workspace / name).read_text()) for name in names]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# A new session, with its own child, that would touch a marker 30 s later.
ESCAPEE = (
    "setsid sh -c 'echo $$ > escapee.pid; sleep 30 & echo $! > sleeper.pid; wait; touch marker'"
)


async def test_attack_setsid_child_does_not_outlive_the_call(
    workspace: Path, ctx: ToolContext
) -> None:
    registry = shell_registry(workspace)
    script = f"{ESCAPEE} > /dev/null 2>&1 & while [ ! -s sleeper.pid ]; do sleep 0.01; done"
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", script])
    pids = _pids(workspace, "escapee.pid", "sleeper.pid")
    try:
        assert result.ok, result.output
        for pid in pids:
            assert await _wait_gone(pid), f"pid {pid} outlived the call"
    finally:
        _kill_all(pids)
    assert not (workspace / "marker").exists()


async def test_attack_setsid_child_holding_the_output_dies_at_the_timeout(
    workspace: Path, ctx: ToolContext
) -> None:
    registry = shell_registry(workspace, timeout=1)
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", f"{ESCAPEE} &"])
    pids = _pids(workspace, "escapee.pid", "sleeper.pid")
    try:
        assert result.error_code is ErrorCode.TIMEOUT
        for pid in pids:
            assert await _wait_gone(pid), f"pid {pid} outlived the call"
    finally:
        _kill_all(pids)


async def test_double_fork_orphan_does_not_outlive_the_call(
    workspace: Path, ctx: ToolContext
) -> None:
    registry = shell_registry(workspace)
    # The middle shell exits at once: the sleeper is an orphan from the start.
    script = "sh -c 'sleep 30 > /dev/null 2>&1 & echo $! > orphan.pid'"
    result = await call(registry, ctx, "shell_exec", argv=["sh", "-c", script])
    pids = _pids(workspace, "orphan.pid")
    try:
        assert result.ok, result.output
        assert await _wait_gone(pids[0])
    finally:
        _kill_all(pids)


async def _wait_for(path: Path) -> None:
    for _ in range(400):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


async def test_a_call_ending_spares_a_call_started_after_it(
    workspace: Path, ctx: ToolContext
) -> None:
    registry = shell_registry(workspace)
    wait = "while [ ! -e {0} ]; do sleep 0.01; done"
    first = asyncio.create_task(
        call(registry, ctx, "shell_exec", argv=["sh", "-c", "touch up; " + wait.format("go")])
    )
    await _wait_for(workspace / "up")
    second = asyncio.create_task(
        call(
            registry,
            ctx,
            "shell_exec",
            argv=["sh", "-c", f"touch go; {wait.format('done')}; echo finished"],
        )
    )
    # The first call ends (and sweeps) while the second, started after it, still runs.
    assert (await first).ok
    (workspace / "done").touch()
    result = await second
    assert result.ok, result.output
    assert result.output.startswith("finished")
