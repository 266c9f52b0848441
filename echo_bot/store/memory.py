"""Memory notes: short facts a chat's model keeps (``memory_save``), shown to it in every
turn of that chat and never in another's. Per chat (its session key), bounded in count
and size; the owner lists and deletes them (``/memory``, ``echo-bot memory``)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from ..errors import EchoBotError
from .sql import SqlDb

NOTES_MAX = 50  # notes per chat
NOTE_CHARS = 500  # characters of one note


class MemoryFull(EchoBotError):
    """The chat holds NOTES_MAX notes already."""


@dataclass(frozen=True, slots=True)
class Note:
    id: str
    session_key: str
    text: str
    saved_by: str
    saved_at: float


class MemoryRepo:
    __slots__ = ("_db",)

    def __init__(self, db: SqlDb) -> None:
        self._db = db

    def save(self, session_key: str, text: str, saved_by: str, now: float | None = None) -> Note:
        """A note kept for ``session_key`` (the same text again: the note it is). Raises
        ``MemoryFull`` past NOTES_MAX and ``ValueError`` for a text that is empty or
        longer than NOTE_CHARS."""
        text = text.strip()
        if not text or len(text) > NOTE_CHARS:
            raise ValueError(f"a note is 1 to {NOTE_CHARS} characters")
        notes = self.of(session_key)
        same = next((note for note in notes if note.text == text), None)
        if same is not None:
            return same
        if len(notes) >= NOTES_MAX:
            raise MemoryFull(f"this chat keeps {NOTES_MAX} notes at most: forget one first")
        when = time.time() if now is None else now
        note = Note(secrets.token_hex(4), session_key, text, saved_by, when)
        self._db.execute(
            "INSERT INTO memory_notes (id, session_key, text, saved_by, saved_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [note.id, session_key, text, saved_by, note.saved_at],
        )
        return note

    def of(self, session_key: str) -> list[Note]:
        """The chat's notes, oldest first."""
        rows = self._db.execute(
            "SELECT id, session_key, text, saved_by, saved_at FROM memory_notes"
            " WHERE session_key = ? ORDER BY saved_at, id",
            [session_key],
        ).fetchall()
        return [Note(r[0], r[1], r[2], r[3], float(r[4])) for r in rows]

    def every(self) -> list[Note]:
        """Every chat's notes, by chat, oldest first (``echo-bot memory list``)."""
        rows = self._db.execute(
            "SELECT id, session_key, text, saved_by, saved_at FROM memory_notes"
            " ORDER BY session_key, saved_at, id"
        ).fetchall()
        return [Note(r[0], r[1], r[2], r[3], float(r[4])) for r in rows]

    def forget(self, note_id: str, session_key: str | None = None) -> Note | None:
        """The note deleted (only from ``session_key`` when given); None: no such note."""
        where, args = "id = ?", [note_id]
        if session_key is not None:
            where, args = "id = ? AND session_key = ?", [note_id, session_key]
        row = self._db.execute(
            f"SELECT id, session_key, text, saved_by, saved_at FROM memory_notes WHERE {where}",
            args,
        ).fetchone()
        if row is None:
            return None
        self._db.execute(f"DELETE FROM memory_notes WHERE {where}", args)
        return Note(row[0], row[1], row[2], row[3], float(row[4]))
