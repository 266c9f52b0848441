"""What of a server's listing reaches the model: bounded, and marked as the server's.

A server's words (its tool's description, and every description and title inside the
tool's schema, at any depth) are cut to the server's caps and prefixed with the same
marker; what no validation reads (``$comment``, ``x-…`` keywords) is left out; a schema
nested deeper than MAX_SCHEMA_DEPTH, larger than the server's ``max_schema_bytes``, or
with a property name over MAX_NAME characters leaves its tool out.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import MCP_MAX_TOOLS

API_MAX_TOOLS = MCP_MAX_TOOLS  # the tools one model request may offer, ours included
MAX_SCHEMA_DEPTH = 40  # levels of JSON (objects and lists) in a tool's schema
# The server's words about its schema, marked wherever they are.
WORDS = frozenset({"description", "title"})
# Values, not words about them: kept as they are (the schema's size bounds them).
DATA = frozenset({"enum", "const", "default", "examples"})
# Keywords whose value maps names to schemas: there a key is a name, not a keyword.
NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
MAX_NAME = 64  # characters of a property's name


def marker(name: str, server: str) -> str:
    return f"[{name}: a tool of the MCP server {server}]"


def marked(text: str, name: str, server: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, after the server's marker."""
    said = " ".join(text.split())[:limit]
    return f"{marker(name, server)} {said}".rstrip()


def bounded_schema(schema: dict[str, Any], name: str, server: str, limit: int) -> dict[str, Any]:
    """A copy of ``schema`` whose descriptions and titles, at every depth, are marked
    and at most ``limit`` characters. ValueError when it nests deeper than
    MAX_SCHEMA_DEPTH (no check that recurses could walk it)."""

    def walk(node: Any, depth: int, names: bool = False) -> Any:
        """``names``: ``node``'s keys name properties (or definitions), each a schema."""
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"its schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, dict):
            copy: dict[str, Any] = {}
            for key, value in node.items():
                if names:
                    if len(str(key)) > MAX_NAME:
                        raise ValueError(f"a property name is over {MAX_NAME} characters")
                    copy[key] = walk(value, depth + 1)
                elif key in WORDS and isinstance(value, str):
                    copy[key] = marked(value, name, server, limit)
                elif key in DATA:
                    copy[key] = value
                elif key == "$comment" or str(key).startswith("x-"):
                    continue  # no validation reads them: the model is not shown them
                else:
                    copy[key] = walk(value, depth + 1, names=key in NAMED)
            return copy
        if isinstance(node, list):
            return [walk(item, depth + 1) for item in node]
        return node

    bounded: dict[str, Any] = walk(schema, 1)
    return bounded


def schema_bytes(schema: dict[str, Any]) -> int:
    """The size of ``schema`` as it is sent to the model (compact JSON)."""
    return len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode())


def declared_argv(schema: dict[str, Any]) -> set[str]:
    """The arguments the server says are a command line: properties of its schema with
    ``"x-argv": true``."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return set()
    return {
        name
        for name, sub in properties.items()
        if isinstance(name, str) and isinstance(sub, dict) and sub.get("x-argv") is True
    }
