"""The tools that ship with echo-bot."""

from __future__ import annotations

from pathlib import Path

from ...config import ToolsConfig
from ..base import Tool
from .clock import CurrentTimeTool
from .files import FileReadTool, FileWriteTool
from .messaging import SendMessageTool
from .shell import ShellExecTool, argv_of
from .web import HttpRequestTool

__all__ = [
    "CurrentTimeTool",
    "FileReadTool",
    "FileWriteTool",
    "HttpRequestTool",
    "SendMessageTool",
    "ShellExecTool",
    "argv_of",
    "builtin_tools",
]


def builtin_tools(config: ToolsConfig, *, workspace: Path, timezone: str) -> list[Tool]:
    """Every built-in tool; switched-off ones say so through ``available()``."""
    return [
        CurrentTimeTool(timezone),
        SendMessageTool(),
        ShellExecTool(config.shell, workspace),
        FileReadTool(workspace),
        FileWriteTool(workspace),
        HttpRequestTool(config.http),
    ]
