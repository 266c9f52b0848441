"""What a model reads of a chat now: its memory notes and the newest messages of its
conversation that fit in ``[brain] context_chars`` — the very selection the prompt makes
(``brains/llm_prompt.build_messages``), shown to a person by ``/history`` and
``echo-bot history CHAT``. The rest of the conversation is in the store, out of the
model's view (``history_search`` finds it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import BrainConfig
from ..conversation import ChatMessage
from ..memory_notes import prompt_lines
from ..store import Tx
from .llm_prompt import DATA_CLOSE, DATA_OPEN, build_messages

SHOWN_CHARS = 300  # characters of each message a listing shows


@dataclass(frozen=True)
class ModelView:
    lines: list[str]  # one per message the model reads, oldest first
    in_view: int  # messages of the conversation in the prompt
    in_conversation: int  # messages since the last /new that were read
    notes: int
    summary: int  # characters of the running summary (0: none)
    chars: int  # characters of the prompt's messages, the system prompt left out
    budget: int


def model_view(
    system_prompt: str,
    history: Sequence[ChatMessage],
    notes: Sequence[str],
    budget: int,
    summary: str | None = None,
) -> ModelView:
    messages = build_messages(system_prompt, history, budget, notes, summary)[1:]
    lines = [_line(message) for message in messages]
    chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in messages)
    in_view = sum(1 for m in messages if m["role"] != "tool")
    in_conversation = sum(1 for m in history if m.role != "tool")
    return ModelView(lines, in_view, in_conversation, len(notes), len(summary or ""), chars, budget)


def _line(message: dict[str, Any]) -> str:
    role = message["role"]
    if role == "tool":
        content = str(message.get("content") or "")
        body = content.partition(f"{DATA_OPEN}\n")[2].removesuffix(f"\n{DATA_CLOSE}")
        who = "tool result"
    elif role == "assistant" and message.get("tool_calls"):
        names = ", ".join(c["function"]["name"] for c in message.get("tool_calls") or [])
        body, who = f"{message.get('content') or ''} (calls {names})".strip(), "bot"
    else:
        body, who = str(message.get("content") or ""), "you" if role == "user" else "bot"
    text = " ".join(body.split())
    if len(text) > SHOWN_CHARS:
        text = text[:SHOWN_CHARS] + "…"
    return f"{who}: {text}"


def describe(view: ModelView, *, newest: int | None = None) -> str:
    """The view as text: a head line, then the messages (only the ``newest`` ones when
    given, for a chat message)."""
    head = (
        f"The model reads {view.in_view} of the {view.in_conversation} messages since the"
        f" last /new ({view.chars:,} of {view.budget:,} characters)"
        + (f", this chat's {view.notes} memory note(s)" if view.notes else "")
        + (
            f", and a summary of the earlier ones ({view.summary:,} characters)."
            if view.summary
            else "."
        )
    )
    lines = view.lines
    if newest is not None and len(lines) > newest:
        lines = [
            f"… {len(lines) - newest} earlier line(s) in view not shown here",
            *lines[-newest:],
        ]
    return "\n".join([head, *lines])


def history_text(
    tx: Tx, session_key: str, brain: BrainConfig, *, limit: int, llm: bool, newest: int | None
) -> str:
    """``describe`` of the session's view as its model reads it (``llm``), read in
    ``tx``; with no model, how many messages the conversation holds."""
    rows = tx.turns.history_rows(session_key, limit)
    summary = tx.summaries.of(session_key)
    if summary is not None:  # carried as the summary instead
        rows = summary.after(rows)
    history = [message for _seq, message in rows]
    if not llm:
        count = sum(1 for m in history if m.role != "tool")
        return (
            "No model here: the offline rules answer from your latest message alone. This"
            f" chat's conversation since the last /new holds {count} message(s)."
        )
    notes = prompt_lines(tx.memory.of(session_key))
    text = summary.text if summary is not None else None
    view = model_view(brain.system_prompt, history, notes, brain.context_chars, text)
    return describe(view, newest=newest)
