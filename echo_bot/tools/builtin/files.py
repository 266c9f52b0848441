"""file_read / file_write: files inside the workspace, and nowhere else.

Paths are checked twice: resolved and compared with the workspace root (``within``),
then opened one directory at a time with O_NOFOLLOW, so a symlink swapped in after the
check cannot lead outside either. A file with more than one hard link is neither read
nor written: its other name may be outside the workspace.

A write to a path that programs read as configuration or hooks — any path with a
component starting with "." (``.git/**``, ``.gitattributes``, ``.npmrc``, ``.env``…) —
is dangerous risk (``FileWriteTool.risk_for``), so it always asks, whatever
``[approvals] never`` or an "allow for a time" grant says: otherwise an approved write
could plant ``core.fsmonitor`` in ``.git/config`` and turn an allowlisted ``git status``
into any command. Such a path reached through a symlink with a plain name is refused.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import stat
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from ...errors import EchoBotError
from ...events import Address
from ...media.inbox import sent_by
from ..base import Effect, ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult, within

DEFAULT_READ_LIMIT = 256 * 1024
MAX_READ_LIMIT = 4 * 1024 * 1024
MAX_WRITE_CHARS = 1_000_000

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC


class _Refused(EchoBotError):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.result = ToolResult.failure(code, message)


def _relative(raw: str) -> PurePosixPath:
    if "\0" in raw:
        raise _Refused(ErrorCode.INVALID_PARAMETER, "the path contains a NUL character")
    path = PurePosixPath(raw)
    if path.is_absolute():
        raise _Refused(
            ErrorCode.PERMISSION_DENIED,
            f"{raw}: absolute paths are not allowed; give a path relative to the workspace",
        )
    return path


def _resolve_inside(root: Path, relative: PurePosixPath, raw: str) -> Path:
    try:
        resolved = (root / relative).resolve()
    except RuntimeError:  # Python 3.11 reports symlink loops this way
        raise _Refused(ErrorCode.INVALID_PARAMETER, f"{raw}: symlink loop") from None
    if not within(root, resolved):
        raise _Refused(ErrorCode.PERMISSION_DENIED, f"{raw}: outside the workspace")
    return resolved


def _open_dirs(root: Path, parts: tuple[str, ...], *, create: bool) -> int:
    """A directory fd for ``root/parts``, never following a symlink on the way."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _os_failure(raw: str, exc: OSError) -> ToolResult:
    if isinstance(exc, FileNotFoundError):
        return ToolResult.failure(ErrorCode.NOT_FOUND, f"{raw}: no such file in the workspace")
    if exc.errno == errno.ELOOP:
        return ToolResult.failure(
            ErrorCode.PERMISSION_DENIED, f"{raw}: symbolic links are not followed here"
        )
    if isinstance(exc, NotADirectoryError):
        return ToolResult.failure(ErrorCode.NOT_FOUND, f"{raw}: a parent is not a directory")
    if isinstance(exc, IsADirectoryError):
        return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"{raw} is a directory")
    if isinstance(exc, PermissionError):
        return ToolResult.failure(ErrorCode.PERMISSION_DENIED, f"{raw}: permission denied")
    return ToolResult.failure(ErrorCode.TOOL_ERROR, f"{raw}: {exc.strerror or exc}")


def _not_regular(raw: str) -> _Refused:
    return _Refused(ErrorCode.INVALID_PARAMETER, f"{raw} is not a regular file")


def config_like(parts: tuple[str, ...]) -> bool:
    """Whether a path with these components may be read by programs as config or hooks."""
    return any(part.startswith(".") for part in parts)


def _single_link(info: os.stat_result, raw: str) -> None:
    if info.st_nlink > 1:
        raise _Refused(
            ErrorCode.PERMISSION_DENIED,
            f"{raw} has {info.st_nlink} hard links; a file with more than one link is not "
            "read or written here (another name of it may be outside the workspace)",
        )


def read_workspace_file(
    workspace: Path, raw: str, limit: int
) -> tuple[bytes, os.stat_result] | ToolResult:
    """The first ``limit`` bytes of the regular file at workspace-relative ``raw`` and
    its stat, opened without following any symlink; or the failure as a result."""
    try:
        root = workspace.resolve()
        target = _resolve_inside(root, _relative(raw), raw)
        parts = target.relative_to(root).parts
        if not parts:
            raise _Refused(ErrorCode.INVALID_PARAMETER, f"{raw} is the workspace itself")
        dir_fd = _open_dirs(root, parts[:-1], create=False)
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
            fd = os.open(parts[-1], flags, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise _not_regular(raw)
            _single_link(info, raw)
            return handle.read(limit), info
    except _Refused as refused:
        return refused.result
    except OSError as exc:
        return _os_failure(raw, exc)


def workspace_file_effect(
    workspace: Path, raw: str, ctx: ToolContext, sends_to: Address | None = None
) -> Effect:
    """The effect of handing out the workspace file ``raw``: the owner's data, unless it
    is a file the requester sent (in their own inbox folder, judged on where the path
    resolves now, as the read will open it)."""
    try:
        root = workspace.resolve()
        target = _resolve_inside(root, _relative(raw), raw)
    except _Refused:
        target = None
    if target is not None:
        relative = PurePosixPath(*target.relative_to(root).parts)
        if sent_by(relative, ctx.origin.channel, ctx.user.id):
            return Effect(sends_to=sends_to)
    return Effect(sends_to=sends_to, discloses=f"the workspace file {raw}")


class FileReadTool(Tool):
    name: ClassVar[str] = "file_read"
    description: ClassVar[str] = (
        "Read a text file from the bot's workspace directory. Paths are relative to the "
        "workspace; nothing outside it can be read."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 4096},
            "max_bytes": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_READ_LIMIT,
                "description": f"Read at most this many bytes (default {DEFAULT_READ_LIMIT}).",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("path",)
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "coding"
    idempotent: ClassVar[bool] = True

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def effect(self, args: dict[str, Any], ctx: ToolContext) -> Effect:
        return workspace_file_effect(self.workspace, str(args.get("path", "")), ctx)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        limit = int(args.get("max_bytes") or DEFAULT_READ_LIMIT)
        return await asyncio.to_thread(self._read, args["path"], limit)

    def _read(self, raw: str, limit: int) -> ToolResult:
        read = read_workspace_file(self.workspace, raw, limit + 1)
        if isinstance(read, ToolResult):
            return read
        data, info = read
        truncated = len(data) > limit
        data = data[:limit]
        text = data.decode("utf-8", errors="replace")
        if truncated:
            text += (
                f"\n[truncated: showing the first {len(data)} of {info.st_size} bytes; "
                "use max_bytes for more]"
            )
        return ToolResult.success(
            text, path=raw, bytes=len(data), size=info.st_size, truncated=truncated
        )


class FileWriteTool(Tool):
    name: ClassVar[str] = "file_write"
    description: ClassVar[str] = (
        "Write (or append to) a text file in the bot's workspace directory, creating "
        "parent directories. Paths are relative to the workspace."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 4096},
            "content": {"type": "string", "maxLength": MAX_WRITE_CHARS},
            "append": {"type": "boolean", "default": False},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("path", "append")
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "coding"

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def grant_scope(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """A grant covers writes into one directory (the one the prompt showed), and
        appends only when the call appended."""
        folder = f"{PurePosixPath(str(args.get('path', ''))).parent}/"
        return f"{folder} (append)" if args.get("append") else folder

    def risk_for(self, args: dict[str, Any]) -> Risk:
        """Dangerous for a path programs may read as config or hooks (see the module)."""
        return (
            Risk.DANGEROUS
            if config_like(PurePosixPath(str(args.get("path", ""))).parts)
            else Risk.WRITE
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await asyncio.to_thread(
            self._write, args["path"], args["content"], bool(args.get("append", False))
        )

    def _write(self, raw: str, content: str, append: bool) -> ToolResult:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800") in the model's JSON
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER, "content holds characters that are not text"
            )
        try:
            relative = _relative(raw)
            name = relative.name
            if name in ("", ".", ".."):
                raise _Refused(ErrorCode.INVALID_PARAMETER, f"{raw}: not a file name")
            self.workspace.mkdir(parents=True, exist_ok=True)
            root = self.workspace.resolve()
            parent = _resolve_inside(root, relative.parent, raw)
            parts = parent.relative_to(root).parts
            if config_like((*parts, name)) and not config_like(relative.parts):
                raise _Refused(
                    ErrorCode.PERMISSION_DENIED,
                    f"{raw} leads to {PurePosixPath(*parts, name)} through a symbolic link; "
                    "write it by that name",
                )
            dir_fd = _open_dirs(root, parts, create=True)
            try:
                try:
                    existing: os.stat_result | None = os.stat(
                        name, dir_fd=dir_fd, follow_symlinks=False
                    )
                except FileNotFoundError:
                    existing = None
                if existing is not None and stat.S_ISLNK(existing.st_mode):
                    raise _Refused(
                        ErrorCode.PERMISSION_DENIED, f"{raw} is a symbolic link; not written"
                    )
                if existing is not None and not stat.S_ISREG(existing.st_mode):
                    raise _not_regular(raw)
                if existing is not None:
                    _single_link(existing, raw)
                if append:
                    _append(dir_fd, name, data, raw)
                else:
                    _replace(dir_fd, name, data, existing)
            finally:
                os.close(dir_fd)
        except _Refused as refused:
            return refused.result
        except OSError as exc:
            return _os_failure(raw, exc)
        verb = "Appended" if append else "Wrote"
        return ToolResult.success(
            f"{verb} {len(data)} bytes to {raw}.", path=raw, bytes=len(data), appended=append
        )


def _append(dir_fd: int, name: str, data: bytes, raw: str) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
    fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(raw)
        _single_link(info, raw)  # checked on the open file: a link made since counts
        handle.write(data)


def _replace(dir_fd: int, name: str, data: bytes, existing: os.stat_result | None) -> None:
    """Write a temp file next to ``name`` and rename it over: readers never see half."""
    temp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            if existing is not None:
                os.fchmod(handle.fileno(), stat.S_IMODE(existing.st_mode))
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    with suppress(OSError):
        os.fsync(dir_fd)
