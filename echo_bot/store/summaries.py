"""A session's running summary: what the model wrote of the oldest part of its
conversation, which the prompt carries instead of those messages (the messages stay in
the store). One per session, covering every message up to ``upto_seq``; it only ever
moves forward, so a summary made twice (a turn re-run after a crash, two daemons) is
kept once; a fresh conversation (/new) drops it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from .sql import SqlDb

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Summary:
    upto_seq: int  # the newest message it covers
    text: str

    def after(self, rows: Sequence[tuple[int, M]]) -> list[tuple[int, M]]:
        """The (seq, message) rows it does not cover: the prompt carries it instead."""
        return [(seq, message) for seq, message in rows if seq > self.upto_seq]


class SummaryRepo:
    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def of(self, session_key: str) -> Summary | None:
        row = self._db.execute(
            "SELECT upto_seq, text FROM summaries WHERE session_key = ?", [session_key]
        ).fetchone()
        return Summary(int(row[0]), row[1]) if row else None

    def keep(self, session_key: str, upto_seq: int, text: str) -> bool:
        """Whether this summary is kept: one covering less than the kept one is not."""
        cursor = self._db.execute(
            "INSERT INTO summaries (session_key, upto_seq, text, made_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(session_key) DO UPDATE SET upto_seq = excluded.upto_seq,"
            " text = excluded.text, made_at = excluded.made_at"
            " WHERE excluded.upto_seq > summaries.upto_seq",
            [session_key, upto_seq, text, time.time()],
        )
        return cursor.rowcount > 0

    def drop(self, session_key: str) -> None:
        self._db.execute("DELETE FROM summaries WHERE session_key = ?", [session_key])
