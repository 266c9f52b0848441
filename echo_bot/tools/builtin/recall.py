"""history_search: this chat's own whole history searched by its words, for what fell
out of the model's view (``store/recall.py``: full-text search on either engine). Only
what was said in this chat (by its people and by the bot), never another chat's, never
tool output; what it finds goes back to the model as data, as any tool's output."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, ClassVar

from ...store import Store
from ..base import Risk, Tool, ToolContext, ToolGroup, ToolResult

FOUND_MAX = 10  # messages one search returns
SHOWN_CHARS = 400  # characters of each found message
_ABOUT = re.compile(r"\b(?:about|for|mention(?:ed)?)\s+(?P<query>\S.*)$", re.I | re.S)


class HistorySearchTool(Tool):
    name: ClassVar[str] = "history_search"
    description: ClassVar[str] = (
        "Search this chat's whole history, older messages too (the ones you no longer see),"
        " by words: the matching messages with their dates, the best matches first."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
        "required": ["query"],
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.READ
    group: ClassVar[ToolGroup] = "basic"
    idempotent: ClassVar[bool] = True
    timeout: ClassVar[float] = 15.0
    triggers: ClassVar[tuple[str, ...]] = (
        "search the history", "search history", "what did i say about", "did i mention",
    )  # fmt: skip

    def __init__(self, store: Store) -> None:
        self.store = store

    def extract_args(self, text: str) -> dict[str, Any] | None:
        match = _ABOUT.search(text.strip().rstrip("?!."))
        return {"query": match.group("query")[:200]} if match else None

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        query = args["query"]
        found = await self.store.run(
            lambda tx: tx.recall.search(ctx.session_key, query, FOUND_MAX, leave_out=ctx.turn_id)
        )
        if not found:
            return ToolResult.success(f"Nothing in this chat's history matches {query!r}.", count=0)
        lines = []
        for item in found:
            when = datetime.fromtimestamp(item.created_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
            text = " ".join(item.content.split())
            if len(text) > SHOWN_CHARS:
                text = text[:SHOWN_CHARS] + "…"
            lines.append(f"[{when}] {item.role}: {text}")
        head = f"{len(found)} message(s) of this chat's history match {query!r}:"
        return ToolResult.success("\n".join([head, *lines]), count=len(found))
