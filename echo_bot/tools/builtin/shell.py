"""shell_exec: run one program in the workspace, never through a shell.

The child gets a scrubbed environment (no tokens or keys from ours), its own session,
and bounded output capture; when the call ends, every process it started is killed
(``procs``: the daemon is a child subreaper and sweeps the call's processes).

**An approved write never becomes code execution.** Programs read configuration and
hooks from the directory they run in and from ``$HOME``; a write the owner approved
(or allowed for a time, or listed in ``[approvals] never``) must not turn an
allowlisted ``git status`` into a command of the writer's choice. Hence:

- ``file_write`` to a path with a dot component (``.git/**``, ``.gitattributes``,
  ``.npmrc``, …) is dangerous risk and always asks (``files.config_like``);
- ``HOME`` is a fresh, empty, private directory outside the workspace for each call,
  removed after it;
- git's system and global config are switched off (``GIT_CONFIG_NOSYSTEM``,
  ``GIT_CONFIG_GLOBAL=/dev/null``) and, as defence in depth, the keys that make git
  run a command are forced off with ``GIT_CONFIG_COUNT`` (command-line scope, which
  beats every config file): ``core.fsmonitor``, ``core.hooksPath``,
  ``core.attributesFile``, ``credential.helper``, ``protocol.ext.allow``, and
  ``safe.bareRepository=explicit`` (git >= 2.38), so a bare repository planted in the
  workspace without any dot (``HEAD``, ``config``, ``objects/``, ``refs/``) is never
  picked up.

Allowlisted programs that run workspace code by design (``make``, ``npm test``,
``pytest``, ``python3 -m …``, which imports from the working directory first) turn
any write into code; do not allowlist them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import signal
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar

from ...config import Config, ShellToolConfig
from ..base import Effect, ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult
from .procs import CallProcesses

log = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# Extra arguments of a "prefix *" allowlist entry must not contain any of these. The
# program never sees a shell, but an auto-approved line should not even look like one.
SHELL_METACHARACTERS = frozenset(";&|`$<>()\n\r")
# Forced on every git a call runs (command-line scope: no config file can undo them).
GIT_FORCED_CONFIG = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.attributesFile", "/dev/null"),
    ("credential.helper", ""),  # an empty value drops every helper named before it
    ("protocol.ext.allow", "never"),
    ("safe.bareRepository", "explicit"),
)
_CHUNK = 64 * 1024
_SETTLE_SECONDS = 2.0  # well inside the registry's extra 5 s


def _operand(part: str) -> bool:
    """An argument a " *" allowlist entry admits: not an option, not shell-looking, and
    not a path out of the workspace (absolute, or through ``..``): ``cat *`` reads the
    workspace's files unasked, never ``/etc/shadow`` or ``../config.toml``."""
    return (
        not part.startswith(("-", "/"))
        and not SHELL_METACHARACTERS.intersection(part)
        and ".." not in part.split("/")
    )


def child_environment(home: str) -> dict[str, str]:
    """The whole environment of a call's program: nothing of ours, git locked down."""
    env = {
        "PATH": SAFE_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_COUNT": str(len(GIT_FORCED_CONFIG)),
    }
    for index, (key, value) in enumerate(GIT_FORCED_CONFIG):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def _remove_home(home: str) -> None:
    """Remove a call's HOME, also directories its processes made unwritable."""
    for root, dirs, _ in os.walk(home):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):  # its processes are gone: nothing swaps it now
                with suppress(OSError):
                    os.chmod(path, 0o700)
    shutil.rmtree(home, ignore_errors=True)


def argv_of(args: dict[str, Any]) -> list[str]:
    """The argument vector of a call: ``argv`` as given, or ``command`` split like a shell.

    Raises ValueError for a malformed command line (e.g. an unclosed quote) or an empty one.
    """
    if "argv" in args:
        argv = [str(part) for part in args["argv"]]
    else:
        argv = shlex.split(str(args.get("command", "")))
    if not argv or not argv[0]:
        raise ValueError("the command is empty")
    if any("\0" in part for part in argv):
        raise ValueError("the command contains a NUL character")
    return argv


class _Capture:
    """At most ``limit`` bytes of one stream; the rest is read and dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(_CHUNK):
            room = self.limit - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace").rstrip("\n")
        return text + "\n[output truncated]" if self.truncated else text


def _render(out: _Capture, err: _Capture, returncode: int | None) -> str:
    parts = []
    if out.data or out.truncated:
        parts.append(out.text())
    if err.data or err.truncated:
        parts.append("stderr:\n" + err.text())
    if returncode is not None:
        parts.append(_exit_text(returncode))
    return "\n".join(parts)


def _exit_text(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"exit code {returncode} (killed by {name})"


def _kill_group(pid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _settle(proc: asyncio.subprocess.Process, out: _Capture, err: _Capture) -> None:
    """Reap a killed child. wait() also waits for the pipes to close, so read them to EOF
    (every writer in the group is dead); a process that left the group may keep them open,
    hence the grace period."""
    try:
        async with asyncio.timeout(_SETTLE_SECONDS):
            await asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))
            await proc.wait()
    except TimeoutError:
        log.warning("shell_exec: pid %d left its output pipes open after the kill", proc.pid)
        # Process has no public close(); without this the pipes stay open until GC.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()


class ShellExecTool(Tool):
    name: ClassVar[str] = "shell_exec"
    description: ClassVar[str] = (
        "Run one program in the bot's workspace directory and return its output and exit "
        "code. There is no shell: pipes, redirects, globs and $variables are not "
        "interpreted. Give either argv (a list of strings) or command (a command line "
        "split like a shell would)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8192},
                "minItems": 1,
                "maxItems": 256,
                "description": "Program and arguments, e.g. ['git', 'status'].",
            },
            "command": {
                "type": "string",
                "minLength": 1,
                "maxLength": 8192,
                "description": "A command line such as 'git status --short'.",
            },
        },
        "oneOf": [{"required": ["argv"]}, {"required": ["command"]}],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("argv", "command")
    argv_args: ClassVar[tuple[str, ...]] = ("argv", "command")
    risk: ClassVar[Risk] = Risk.DANGEROUS
    group: ClassVar[ToolGroup] = "coding"
    idempotent: ClassVar[bool] = False

    def __init__(self, config: ShellToolConfig, workspace: Path) -> None:
        self.workspace = workspace
        self._take(config)

    def reload(self, config: Config) -> list[str]:
        """``allow_commands``, the timeout and the output cap change live (switching the
        tool on or off needs a restart: it is in or out of the registry)."""
        self._take(config.tools.shell)
        return []

    def _take(self, config: ShellToolConfig) -> None:
        self.config = config
        # The registry's own deadline stays behind ours, so our kill runs first.
        self.timeout = config.timeout.total_seconds() + 5  # type: ignore[misc]
        self._exact: list[list[str]] = []
        self._prefixes: list[list[str]] = []
        for entry in config.allow_commands:
            wildcard = entry.endswith(" *")
            try:
                parsed = shlex.split(entry[:-2] if wildcard else entry)
            except ValueError:
                log.warning("tools.shell.allow_commands: cannot parse %r; ignored", entry)
                continue
            if parsed:
                (self._prefixes if wildcard else self._exact).append(parsed)

    def available(self) -> bool:
        return self.config.enabled

    def allowed(self, argv: list[str]) -> bool:
        """Whether ``argv`` is on the owner's allowlist (exactly, or by a "prefix *" entry).

        A trailing " *" admits further operands only: arguments that do not start with
        "-" (so no option, no "--") and contain no shell metacharacter. Options must be
        spelled in the entry itself, so ``git -c alias.x=!cmd x``, ``find . -exec``
        and ``tar --checkpoint-action=exec=cmd`` never match ``git *``/``find *``/``tar *``.
        """
        if argv in self._exact:
            return True
        return any(
            argv[: len(prefix)] == prefix and all(map(_operand, argv[len(prefix) :]))
            for prefix in self._prefixes
        )

    def approval_override(self, args: dict[str, Any], ctx: ToolContext) -> bool | None:
        try:
            argv = argv_of(args)
        except ValueError:
            return None
        return False if self.allowed(argv) else None

    def effect(self, args: dict[str, Any], ctx: ToolContext) -> Effect:
        """A command's output is the owner's: it runs in their workspace (``git log -p``,
        ``ls *``), so it is handed only where the owner's files are (an allowlisted
        command asked by someone else asks the approvers first)."""
        try:
            shown = shlex.join(argv_of(args))
        except ValueError:
            shown = "a command"
        shown = shown if len(shown) <= 80 else shown[:79] + "…"
        return Effect(discloses=f"the output of {shown} run in the workspace")

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            argv = argv_of(args)
        except ValueError as exc:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"cannot run that: {exc}")
        await asyncio.to_thread(self.workspace.mkdir, parents=True, exist_ok=True)
        # A private, empty HOME per call: nothing in the workspace is read as ~/.gitconfig
        # and friends, and nothing one call leaves there reaches the next.
        home = await asyncio.to_thread(tempfile.mkdtemp, prefix="echo-bot-home-")
        try:
            return await self._run(argv, home)
        finally:
            await asyncio.to_thread(_remove_home, home)

    async def _run(self, argv: list[str], home: str) -> ToolResult:
        calls = CallProcesses()
        try:
            proc = await calls.start(
                *argv,
                cwd=self.workspace,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=child_environment(home),
            )
        except FileNotFoundError:
            return ToolResult.failure(
                ErrorCode.NOT_FOUND, f"program not found: {argv[0]} (PATH is {SAFE_PATH})"
            )
        except PermissionError:
            return ToolResult.failure(
                ErrorCode.TOOL_ERROR, f"cannot execute {argv[0]}: permission denied"
            )
        except OSError as exc:
            return ToolResult.failure(ErrorCode.TOOL_ERROR, f"cannot start {argv[0]}: {exc}")
        try:
            return await self._collect(proc, argv, calls)
        finally:
            await calls.sweep(final=True)

    async def _collect(
        self, proc: asyncio.subprocess.Process, argv: list[str], calls: CallProcesses
    ) -> ToolResult:
        limit = self.config.max_output
        out, err = _Capture(limit), _Capture(limit)
        seconds = self.config.timeout.total_seconds()
        finished = False
        try:
            async with asyncio.timeout(seconds):
                await asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))
                await proc.wait()
            finished = True
        except TimeoutError:
            pass
        finally:
            if not finished:  # timed out or cancelled: take everything it started down
                _kill_group(proc.pid)
                await calls.sweep()  # also what left the group and holds the pipes
                await _settle(proc, out, err)
        if not finished:
            partial = _render(out, err, None)
            return ToolResult.failure(
                ErrorCode.TIMEOUT,
                f"{argv[0]} did not finish within {seconds:g} s and was killed"
                + (f"; output so far:\n{partial}" if partial else ""),
                argv=argv,
            )
        returncode = proc.returncode if proc.returncode is not None else -1
        return ToolResult(
            ok=returncode == 0,
            output=_render(out, err, returncode),
            data={
                "exit_code": returncode,
                "argv": argv,
                "truncated": out.truncated or err.truncated,
            },
        )
