"""A small MCP server to try echo-bot's MCP support with: notes, one Markdown file each,
in one folder. It reads and writes nothing else, and never replaces or deletes a note.

    [[mcp.servers]]
    name = "notes"
    command = ["python3", "-m", "echo_bot.examples.notes_server"]
    env = { NOTES_DIR = "~/notes" }
    risk = { list_notes = "read", read_note = "read" }

Tools: ``list_notes`` and ``read_note`` (read-only), ``add_note`` (a new note; a title
that exists is refused). ``NOTES_DIR`` (default ``~/notes``) is made if missing, readable
by its owner only. A title is up to 64 letters, digits, spaces, ``-``, ``_`` and ``.``,
beginning with a letter, digit or ``_``: a file name in that folder, never a path.
Symbolic links there are not followed.

It speaks MCP over stdio with the SDK's server side, so it needs the ``mcp`` extra
(``pip install 'echo-bot[mcp]'``), as echo-bot's MCP support does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from .. import __version__
from ..errors import EchoBotError

TITLE = re.compile(r"\w[\w .-]{0,63}")
MAX_TEXT = 100_000  # characters of a note
SUFFIX = ".md"
NOTHING: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
TITLE_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "description": "The note's title: letters, digits, spaces, '-', '_', '.'.",
}
TOOLS = [
    types.Tool(
        name="list_notes",
        description="List the notes by title.",
        input_schema=NOTHING,
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="read_note",
        description="Read the note with this title.",
        input_schema={
            "type": "object",
            "properties": {"title": TITLE_SCHEMA},
            "required": ["title"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="add_note",
        description="Add a note with a new title (an existing note is never replaced).",
        input_schema={
            "type": "object",
            "properties": {
                "title": TITLE_SCHEMA,
                "text": {"type": "string", "maxLength": MAX_TEXT},
            },
            "required": ["title", "text"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False),
    ),
]


class Refused(EchoBotError):
    """What the caller asked for cannot be done: its reason, for the caller."""


def notes_dir() -> Path:
    folder = Path(os.environ.get("NOTES_DIR") or "~/notes").expanduser()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def note_path(folder: Path, title: object) -> Path:
    if not isinstance(title, str) or not TITLE.fullmatch(title) or title != title.strip():
        raise Refused(
            "a title is up to 64 letters, digits, spaces, '-', '_' and '.', beginning with"
            " a letter, digit or '_'"
        )
    return folder / f"{title}{SUFFIX}"


def list_notes(folder: Path) -> str:
    titles = sorted(
        p.name.removesuffix(SUFFIX)
        for p in folder.iterdir()
        if p.name.endswith(SUFFIX) and not p.is_symlink() and p.is_file()
    )
    return "\n".join(titles) or "(no notes)"


def read_note(folder: Path, title: object) -> str:
    path = note_path(folder, title)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise Refused(f"there is no note {title}") from None
    except OSError as exc:
        raise Refused(f"the note {title} cannot be read ({exc.strerror})") from None
    with open(fd, encoding="utf-8", errors="replace") as file:
        return file.read(MAX_TEXT)


def add_note(folder: Path, title: object, text: object) -> str:
    path = note_path(folder, title)
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise Refused(f"the text is a string of at most {MAX_TEXT} characters")
    try:  # O_EXCL: neither an existing note nor a link in its place is written through
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise Refused(f"a note {title} exists already: choose another title") from None
    with open(fd, "w", encoding="utf-8") as file:
        file.write(text)
    return f"added {title}"


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


async def on_list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS, next_cursor=None)


async def on_call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    args: dict[str, Any] = params.arguments or {}
    folder = notes_dir()
    try:
        if params.name == "list_notes":
            answer = list_notes(folder)
        elif params.name == "read_note":
            answer = read_note(folder, args.get("title"))
        elif params.name == "add_note":
            answer = add_note(folder, args.get("title"), args.get("text"))
        else:
            raise Refused(f"there is no tool {params.name}")
    except Refused as exc:
        return types.CallToolResult(content=[text(str(exc))], is_error=True)
    return types.CallToolResult(content=[text(answer)])


SERVER: Server[Any] = Server(
    "echo-bot example notes",
    version=__version__,
    on_list_tools=on_list_tools,
    on_call_tool=on_call_tool,
)


async def serve() -> None:
    notes_dir()  # made at start: the folder is there before the first call
    async with stdio_server() as (read, write):
        await SERVER.run(read, write, SERVER.create_initialization_options())


def main() -> None:
    anyio.run(serve)


if __name__ == "__main__":
    main()
