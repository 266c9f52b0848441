"""Filling route templates from a delivery — as data, never as code.

Only ``{payload[a][b]}``, ``{headers[Name]}`` and ``{route[name]}`` are understood (the
config rejects anything else). Values are inserted once and never re-read as
templates. In an argument the tool declares a command line (its ``argv_args``: a list
of elements, or a string split like a shell would *before* filling, so a value can
never add arguments) a value that would begin an element with ``-`` is refused unless
the template put ``--`` before it, so a value can never become an option.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Mapping
from typing import Any

from echo_bot.config import TEMPLATE_FIELD
from echo_bot.errors import EchoBotError

_KEYS = re.compile(r"\[([^\[\]{}]+)\]")
_PIECES = re.compile(r"\{\{|\}\}|" + TEMPLATE_FIELD.pattern)
MAX_VALUE_CHARS = 10_000


class TemplateRefused(EchoBotError):
    """The delivery cannot fill the route's template; the sender gets a 422."""

    def __init__(self, answer: str, audited: str) -> None:
        super().__init__(audited)
        self.answer = answer  # told to the sender: never a payload value
        self.audited = audited


class MissingField(TemplateRefused):
    """A placeholder names something the delivery does not have."""

    def __init__(self, field: str) -> None:
        super().__init__(
            f"the payload has no {field} (needed by the route's template)", f"missing {field}"
        )


class OptionValue(TemplateRefused):
    """A filled value would begin a command-line argument with ``-``: an option."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"a delivery value would make {where} start with '-' (an option); values "
            "never become options unless the route's template puts '--' before them",
            f"option-like value in {where}",
        )


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


def fill_argv(argv: list[Any], sources: Mapping[str, Any], name: str = "argv") -> list[Any]:
    """Fill a command line; a value may never begin an argument with ``-``.

    An argument whose template starts with a placeholder (so its first character comes
    from the delivery) is refused when it comes out starting with ``-``, unless an
    earlier argument of the template is exactly ``--`` (the end of options).
    """
    filled: list[Any] = []
    options_ended = False
    for index, part in enumerate(argv):
        value = fill_args(part, sources)
        if isinstance(part, str):
            starts_with_value = TEMPLATE_FIELD.match(part) is not None
            if starts_with_value and not options_ended and str(value).startswith("-"):
                raise OptionValue(f"{name}[{index}]")
            options_ended = options_ended or part == "--"
        filled.append(value)
    return filled


def tool_args(
    args: dict[str, Any], sources: Mapping[str, Any], argv_args: Collection[str]
) -> dict[str, Any]:
    """The tool's arguments for one delivery. Those named in ``argv_args`` are command
    lines: a list is filled as one (``fill_argv``); a string is split like a shell would,
    filled as one, and joined again, quoted, so that splitting it gives exactly those
    elements."""
    filled: dict[str, Any] = {}
    for key, value in args.items():
        if key in argv_args and isinstance(value, list):
            filled[key] = fill_argv(value, sources, key)
        elif key in argv_args and isinstance(value, str):
            filled[key] = shlex.join(fill_argv(shlex.split(value), sources, key))
        else:
            filled[key] = fill_args(value, sources)
    return filled
