"""A small MCP server for the tests, on the ``mcp`` SDK's own server side: notes kept as
files in ``NOTES_DIR``, plus tools that misbehave on purpose. Run as a real process:

    python tests/fakes/mcp_notes_server.py stdio
    python tests/fakes/mcp_notes_server.py http     # prints PORT=<n>, serves /mcp

Tools: ``list_notes`` (read-only by its annotations), ``add_note`` (not destructive),
``purge`` (no annotations), ``picture`` (an image), ``fail`` (isError), ``crash`` (the
process exits mid-call), ``hang`` (sleeps; a cancellation is written to
``NOTES_DIR/cancelled``), ``block`` (sleeps without yielding: a synchronous tool),
``grow`` (adds a tool, then says the list changed), ``env``
(the environment it was given), ``ask_model`` and ``ask_user`` (ask the client for
sampling, elicitation). With
``NOTES_BAD_SCHEMA=1`` it also lists ``broken``, whose schema is no JSON Schema. With
``NOTES_START_DELAY=S`` it sleeps S seconds before it reads its first message (a server
slow to start, as one fetched by ``npx`` on its first run is).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

NOTES = Path(os.environ.get("NOTES_DIR", "."))
PNG = (  # a 1×1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
NOTHING = {"type": "object", "properties": {}, "additionalProperties": False}


def _tools() -> dict[str, types.Tool]:
    listed = [
        types.Tool(
            name="list_notes",
            description="List the notes by title.",
            input_schema=NOTHING,
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="add_note",
            description="Add a note.",
            input_schema={
                "type": "object",
                "properties": {
                    "title": {"type": "string", "minLength": 1},
                    "text": {"type": "string"},
                },
                "required": ["title", "text"],
                "additionalProperties": False,
            },
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False),
        ),
        types.Tool(name="purge", description="Delete every note.", input_schema=NOTHING),
        types.Tool(
            name="picture",
            description="A picture.",
            input_schema=NOTHING,
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(name="fail", description="Fails.", input_schema=NOTHING),
        types.Tool(name="crash", description="Exits mid-call.", input_schema=NOTHING),
        types.Tool(
            name="hang",
            description="Takes its time.",
            input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
        ),
        types.Tool(
            name="block",
            description="Works without answering anything else meanwhile.",
            input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="grow",
            description="Adds the tool `extra`.",
            input_schema=NOTHING,
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="env",
            description="The environment.",
            input_schema=NOTHING,
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(name="ask_model", description="Asks for sampling.", input_schema=NOTHING),
        types.Tool(name="ask_user", description="Asks for elicitation.", input_schema=NOTHING),
    ]
    if os.environ.get("NOTES_BAD_SCHEMA") == "1":
        # An object whose property type is no JSON-Schema type: the client must leave
        # this tool out, not the server.
        listed.append(
            types.Tool(
                name="broken",
                description="Its schema is not one.",
                input_schema={"type": "object", "properties": {"x": {"type": "nonsense"}}},
            )
        )
    return {t.name: t for t in listed}


TOOLS = _tools()


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


async def list_tools(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=list(TOOLS.values()), next_cursor=None)


async def call_tool(
    ctx: ServerRequestContext, params: types.CallToolRequestParams
) -> types.CallToolResult:
    args: dict[str, Any] = params.arguments or {}
    name = params.name
    if name == "list_notes":
        titles = sorted(p.stem for p in NOTES.glob("*.note"))
        return types.CallToolResult(content=[text("\n".join(titles) or "(no notes)")])
    if name == "add_note":
        path = NOTES / f"{args['title']}.note"
        path.write_text(args["text"])
        with (NOTES / "added.log").open("a") as log:  # one line per call that ran
            log.write(args["title"] + "\n")
        return types.CallToolResult(content=[text(f"added {args['title']}")])
    if name == "purge":
        for path in NOTES.glob("*.note"):
            path.unlink()
        return types.CallToolResult(content=[text("purged")])
    if name == "picture":
        image = types.ImageContent(type="image", data=PNG, mime_type="image/png")
        return types.CallToolResult(content=[text("a picture:"), image])
    if name == "fail":
        return types.CallToolResult(content=[text("the notes are locked")], is_error=True)
    if name == "crash":
        (NOTES / "crashed").write_text("")
        os._exit(3)
    if name == "hang":
        (NOTES / "hanging").write_text("")
        with (NOTES / "hang.log").open("a") as log:  # one line per call that started
            log.write("hang\n")
        try:
            await anyio.sleep(float(args.get("seconds", 3600)))
        except anyio.get_cancelled_exc_class():
            (NOTES / "cancelled").write_text("")
            raise
        return types.CallToolResult(content=[text("done hanging")])
    if name == "block":  # a synchronous tool: the server answers no ping meanwhile
        time.sleep(float(args.get("seconds", 1)))
        return types.CallToolResult(content=[text("done blocking")])
    if name == "grow":
        TOOLS["extra"] = types.Tool(name="extra", description="Added later.", input_schema=NOTHING)
        await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=[text("grown")])
    if name == "env":
        return types.CallToolResult(content=[text(json.dumps(dict(os.environ)))])
    if name == "ask_model":
        try:
            await ctx.session.create_message(
                messages=[types.SamplingMessage(role="user", content=text("hi"))],
                max_tokens=10,
                related_request_id=ctx.request_id,
            )
        except MCPError as exc:
            return types.CallToolResult(content=[text(f"declined: {exc.message}")], is_error=True)
        return types.CallToolResult(content=[text("the client sampled")])
    if name == "ask_user":
        try:
            await ctx.session.elicit_form(
                message="Which notebook?",
                requested_schema={"type": "object", "properties": {"n": {"type": "string"}}},
                related_request_id=ctx.request_id,
            )
        except MCPError as exc:
            return types.CallToolResult(content=[text(f"declined: {exc.message}")], is_error=True)
        return types.CallToolResult(content=[text("the user answered")])
    if name == "extra":
        return types.CallToolResult(content=[text("extra ran")])
    raise MCPError(code=types.INVALID_PARAMS, message=f"no tool {name}")


SERVER = Server("notes", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)
OPTIONS = SERVER.create_initialization_options(NotificationOptions(tools_changed=True))


async def stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await SERVER.run(read, write, OPTIONS)


async def http() -> None:
    import uvicorn

    app = SERVER.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(os.environ.get("NOTES_PORT", "0"))))
    print(f"PORT={sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    await server.serve(sockets=[sock])


if __name__ == "__main__":
    time.sleep(float(os.environ.get("NOTES_START_DELAY", "0")))
    anyio.run(stdio if sys.argv[1:] == ["stdio"] else http)
