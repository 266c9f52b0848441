"""What a text becomes in Matrix: ``body`` (the text as a person reads it) and, where it
is formatted, ``formatted_body`` (``org.matrix.custom.html``, written and read back by
``channels/html.py``). Masking, the misleading-link rule and splitting are the pipeline's
(``echo_bot.richtext.parts``), done on the text a person sees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from channels.html import shown_html, to_html
from echo_bot.richtext.model import Formatted
from echo_bot.richtext.splitting import Unit

MAX_BODY = 16_000  # characters of one event's text
MAX_EVENT = 60_000  # bytes of an event's content as JSON (Synapse caps an event at 64 KiB)


@dataclass(frozen=True)
class MatrixText:
    """Matrix's wire: an ``m.room.message`` content."""

    limit: int = MAX_BODY
    unit: Unit = "chars"

    def wire(self, part: Formatted) -> dict[str, Any]:
        content = {"msgtype": "m.text", "body": part.text}
        if part.spans:
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = to_html(part)
        return content

    def visible(self, wire: dict[str, Any]) -> str:
        return f"{wire['body']}\n{shown_html(wire.get('formatted_body', ''))}"

    def fits(self, wire: dict[str, Any]) -> bool:
        return len(json.dumps(wire).encode()) <= MAX_EVENT


TEXT = MatrixText()


def replacement(event_id: str, new: dict[str, Any]) -> dict[str, Any]:
    """An edit (``m.replace``) of ``event_id`` into ``new``; clients that know no edits
    show the ``* ``-marked fallback."""
    content = {**new, "body": f"* {new['body']}", "m.new_content": new,
               "m.relates_to": {"rel_type": "m.replace", "event_id": event_id}}  # fmt: skip
    if "formatted_body" in new:
        content["formatted_body"] = f"* {new['formatted_body']}"
    return content
