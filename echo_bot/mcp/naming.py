"""What a server's tool is called here and how risky it is taken to be."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from ..tools.base import Risk

SEPARATOR = "__"
MAX_NAME = 64  # the OpenAI function-name limit
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")

RiskSource = Literal["owner", "annotation", "default"]


def tool_name(server: str, tool: str) -> str:
    """``<server>__<tool>``, reduced to [A-Za-z0-9_-] and at most 64 characters."""
    return _NOT_ALLOWED.sub("_", f"{server}{SEPARATOR}{tool}")[:MAX_NAME]


def prefix(server: str) -> str:
    return f"{server}{SEPARATOR}"


def exposed(patterns: Sequence[str], tool: str) -> bool:
    """Whether the server's ``tool`` matches one of the owner's glob ``patterns``."""
    return any(fnmatch.fnmatchcase(tool, pattern) for pattern in patterns)


def risk_of(
    tool: str,
    owner: Mapping[str, str],
    annotations: Mapping[str, object] | None,
    *,
    trust_annotations: bool,
) -> tuple[Risk, RiskSource]:
    """The owner's word if given; else, when trusted, the server's annotations
    (readOnlyHint → read, destructiveHint false → write, anything else → dangerous: the
    MCP spec's own default is destructive); else write. Annotations come from the server
    and are untrusted: they are used only when the owner says so, and never where the
    owner named the tool."""
    if tool in owner:
        return Risk(owner[tool]), "owner"
    if not trust_annotations:
        return Risk.WRITE, "default"
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:
        return Risk.READ, "annotation"
    if hints.get("destructiveHint") is False:
        return Risk.WRITE, "annotation"
    return Risk.DANGEROUS, "annotation"
