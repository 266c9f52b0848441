"""What the next summary request reads: the session's oldest messages the running
summary does not cover yet, oldest first, within one request's size.

A turn loads only the newest ``HISTORY_LIMIT`` messages; whatever lies between the
summary's end and that window (a long chat of short messages, or one that had no model
before) is read from the store here, so that it reaches the summary rather than neither
the summary nor the prompt. A page stops before the first message of a turn still
running or waiting for an approval: a call cut away from the prompt while it waits
would come back as a result without its call, and the model would ask for it again."""

from __future__ import annotations

from collections.abc import Sequence

from ..conversation import ChatMessage
from ..store import Tx

PAGE_ROWS = 400  # stored rows read for one page at most
Row = tuple[int, ChatMessage]


def _chars(message: ChatMessage) -> int:
    return len(message.content or "") + 16 if message.role in ("user", "assistant") else 0


def summary_page(
    tx: Tx,
    session_key: str,
    after: int,
    before: int | None,
    window: Sequence[Row],
    chars: int,
) -> list[Row]:
    """The rows to summarise next: those after ``after`` (the summary's end) stored
    before ``before`` (the loaded window's first seq; None: nothing beyond the window),
    then ``window``'s (the part of the window to summarise), up to ``chars`` of text
    (one row at least)."""
    rows = tx.turns.rows_between(session_key, after, before, PAGE_ROWS) if before else []
    if len(rows) < PAGE_ROWS:  # everything before the window read: the window's part next
        rows += [row for row in window if row[0] > after]
    page: list[Row] = []
    size = 0
    for row in rows:
        size += _chars(row[1])
        if page and size > chars:
            break
        page.append(row)
    waiting = tx.turns.unfinished({m.turn_id for _seq, m in page if m.turn_id is not None})
    for index, (_seq, message) in enumerate(page):
        if message.turn_id in waiting:
            return page[:index]
    return page
