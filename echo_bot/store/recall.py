"""Recall: a chat's own history searched by its words, also what fell out of the model's
view (``history_search``). Full-text search on both engines, behind the store's
boundary: SQLite's FTS5 (``messages_fts``, kept by a trigger on ``messages``),
PostgreSQL's ``to_tsvector`` with a GIN index. Only what people and the model said is
searched (user and assistant messages), never tool output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .sql import POSTGRES, SqlDb, dialect

WORDS_MAX = 12  # words of a query used
_WORD = re.compile(r"\w+", re.UNICODE)
# The expression PostgreSQL's index is on: a query must use the same to hit it.
PG_VECTOR = "to_tsvector('simple', COALESCE(content, ''))"
SEARCHED_ROLES = "('user', 'assistant')"


@dataclass(frozen=True, slots=True)
class Found:
    role: str
    content: str
    created_at: float


def query_words(query: str) -> list[str]:
    """The words of ``query`` (letters and digits only: no search syntax reaches the
    engine), lower-cased, each once, at most WORDS_MAX."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:WORDS_MAX]


class RecallRepo:
    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def search(
        self, session_key: str, query: str, limit: int = 10, *, leave_out: str = ""
    ) -> list[Found]:
        """The chat's messages with any of the query's words, the best matches first
        (then the newest); ``leave_out``: a turn whose messages are not searched (the
        one asking)."""
        words = query_words(query)
        if not words:
            return []
        if dialect(self._db) == POSTGRES:
            rows = self._db.execute(
                f"SELECT role, content, created_at FROM messages"
                f" WHERE session_key = ? AND turn_id != ? AND role IN {SEARCHED_ROLES}"
                f" AND {PG_VECTOR} @@ to_tsquery('simple', ?)"
                f" ORDER BY ts_rank({PG_VECTOR}, to_tsquery('simple', ?)) DESC, seq DESC"
                " LIMIT ?",
                [session_key, leave_out, " | ".join(words), " | ".join(words), limit],
            ).fetchall()
        else:
            match = " OR ".join(f'"{word}"' for word in words)
            rows = self._db.execute(
                "SELECT m.role, m.content, m.created_at FROM messages_fts"
                " JOIN messages m ON m.seq = messages_fts.rowid"
                " WHERE messages_fts MATCH ? AND m.session_key = ? AND m.turn_id != ?"
                " ORDER BY bm25(messages_fts), m.seq DESC LIMIT ?",
                [match, session_key, leave_out, limit],
            ).fetchall()
        return [Found(r[0], r[1] or "", float(r[2])) for r in rows]
