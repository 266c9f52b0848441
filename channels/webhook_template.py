"""Filling route templates from a delivery — as data, never as code.

Only ``{payload[a][b]}``, ``{headers[Name]}`` and ``{route[name]}`` are understood (the
config rejects anything else). Values are inserted once and never re-read as
templates. A command-line string is split into arguments *before* filling, so a value
can never add arguments.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from echo_bot.config import TEMPLATE_FIELD

_KEYS = re.compile(r"\[([^\[\]{}]+)\]")
_PIECES = re.compile(r"\{\{|\}\}|" + TEMPLATE_FIELD.pattern)
MAX_VALUE_CHARS = 10_000


class MissingField(Exception):
    """A placeholder names something the delivery does not have."""


def lookup(sources: Mapping[str, Any], root: str, path: str) -> Any:
    value: Any = sources[root]
    for key in _KEYS.findall(path):
        if isinstance(value, Mapping):
            if key not in value:
                raise MissingField(f"{root}{path}")
            value = value[key]
        elif isinstance(value, list) and key.lstrip("-").isdigit():
            index = int(key)
            if not -len(value) <= index < len(value):
                raise MissingField(f"{root}{path}")
            value = value[index]
        else:
            raise MissingField(f"{root}{path}")
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | int | float):
        text = json.dumps(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True)
        except RecursionError:
            # Parsed within the interpreter's limit, but encoding it again from deeper in
            # the stack is not: say so instead of failing the delivery.
            text = "(a value nested too deeply to show)"
    return text[:MAX_VALUE_CHARS]


def fill(template: str, sources: Mapping[str, Any], wrap: bool = False) -> str:
    """Replace placeholders; with ``wrap`` each value is marked as untrusted data."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        value = _text(lookup(sources, match.group(1), match.group(2)))
        if not wrap:
            return value
        # A value must not close its own marker (or open a fake one).
        return "«" + value.replace("«", "‹").replace("»", "›") + "»"

    return _PIECES.sub(replace, template)


def fill_args(args: Any, sources: Mapping[str, Any]) -> Any:
    if isinstance(args, str):
        return fill(args, sources)
    if isinstance(args, list):
        return [fill_args(item, sources) for item in args]
    if isinstance(args, dict):
        return {key: fill_args(value, sources) for key, value in args.items()}
    return args


def tool_args(tool: str, args: dict[str, Any], sources: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's arguments for one delivery. A ``command`` string is split first."""
    args = dict(args)
    if tool == "shell_exec" and isinstance(args.get("command"), str):
        args["argv"] = shlex.split(args.pop("command"))
    return fill_args(args, sources)
