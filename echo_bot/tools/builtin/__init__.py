"""The tools that ship with echo-bot."""

from __future__ import annotations

from pathlib import Path

from ...config import ToolsConfig
from ...memory_notes import MemoryNotes
from ...scheduling.reminders import ReminderService
from ...store import Store
from ..base import Tool
from .clock import CurrentTimeTool
from .files import FileReadTool, FileWriteTool
from .memory import MemoryForgetTool, MemorySaveTool
from .messaging import Outlet, SendMessageTool
from .recall import HistorySearchTool
from .reminders import ReminderCancelTool, ReminderCreateTool, ReminderListTool
from .send_file import SendFileTool
from .shell import ShellExecTool, argv_of
from .web import HttpRequestTool

__all__ = [
    "CurrentTimeTool",
    "FileReadTool",
    "FileWriteTool",
    "HttpRequestTool",
    "SendFileTool",
    "SendMessageTool",
    "ShellExecTool",
    "argv_of",
    "builtin_tools",
]


def builtin_tools(
    config: ToolsConfig,
    *,
    workspace: Path,
    timezone: str,
    reminders: ReminderService | None = None,
    outgoing: Path | None = None,
    outlet: Outlet | None = None,
    store: Store | None = None,
) -> list[Tool]:
    """Every built-in tool; switched-off ones say so through ``available()``. The
    sending tools send through ``outlet`` (connected by the daemon once it runs)."""
    extra: list[Tool] = []
    if reminders is not None:
        extra = [
            ReminderCreateTool(reminders),
            ReminderListTool(reminders),
            ReminderCancelTool(reminders),
        ]
    if store is not None:  # what a chat keeps: its notes, its history searched
        notes = MemoryNotes(store)
        extra += [MemorySaveTool(notes), MemoryForgetTool(notes), HistorySearchTool(store)]
    return [
        *extra,
        CurrentTimeTool(timezone, chat_zone=reminders.timezone_for if reminders else None),
        SendMessageTool(outlet),
        SendFileTool(workspace, outgoing or workspace.parent / "outgoing", outlet),
        ShellExecTool(config.shell, workspace),
        FileReadTool(workspace),
        FileWriteTool(workspace),
        HttpRequestTool(config.http),
    ]
