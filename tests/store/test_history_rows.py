"""History rows written by an older echo-bot still load, and read to the model as they
did: before schema 11 a user message's notes on its files were lines of its content;
now they are ``ChatMessage.files`` beside its words."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlite_utils import Database as SqlDb

from echo_bot.brains.llm_prompt import to_openai
from echo_bot.brains.rules import files_reply
from echo_bot.conversation import ChatMessage, FileNote
from echo_bot.secrets import Masker
from echo_bot.store import Database, Store
from echo_bot.store.schema import MIGRATIONS

KEY = "telegram:42"
WORDS = "look at this"
PHOTO = FileNote("photo", "inbox/telegram-42/2026-12-03/abcd-1-photo.jpg", "image/jpeg, 10.2 KB")
LOST = FileNote("document", None, "'big.iso' (25.0 MB) — it is over the size limit")
# What the code before schema 11 stored as the user's message: the same words and notes.
OLD_CONTENT = f"{WORDS}\n{PHOTO.line}\n{LOST.line}"


def old_store(path: Path) -> None:
    """A store as an echo-bot of schema 10 left it, with a user message that carried
    files, written by that version's INSERT."""
    conn = sqlite3.connect(path, isolation_level=None)
    db = SqlDb(conn)
    conn.execute("BEGIN")
    for step in MIGRATIONS[:10]:
        step(db)
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta(key, value) VALUES('schema_version', '10')")
    conn.execute(
        "INSERT INTO messages (session_key, turn_id, role, content, tool_calls, tool_call_id,"
        " name, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [KEY, "turn-old", "user", OLD_CONTENT, None, None, None, time.time()],
    )
    conn.execute("COMMIT")
    conn.close()


def test_a_row_from_before_files_loads_and_reads_to_the_model_as_before(tmp_path: Path) -> None:
    path = tmp_path / "echo-bot.sqlite3"
    old_store(path)
    store = Store(Database(path), Masker())
    store.open_sync()  # migrates to this version's schema
    try:
        new = ChatMessage(role="user", content=WORDS, files=(PHOTO, LOST))
        store.run_sync(lambda tx: tx.turns.append_message(KEY, "turn-new", new))
        old_row, new_row = store.run_sync(lambda tx: tx.turns.history(KEY))
    finally:
        store.close_sync()
    assert old_row.content == OLD_CONTENT and old_row.files == ()
    assert new_row.content == WORDS and new_row.files == (PHOTO, LOST)
    # Byte for byte what the model read before, for the old row and the new alike.
    assert to_openai(old_row) == to_openai(new_row) == {"role": "user", "content": OLD_CONTENT}


def test_files_alone_read_as_their_notes() -> None:
    """A message of files and no words: the notes are the whole message, as before."""
    message = ChatMessage(role="user", content="", files=(PHOTO,))
    assert message.text == PHOTO.line
    assert to_openai(message) == {"role": "user", "content": PHOTO.line}
    assert files_reply(message.files) == (
        "Your photo is saved in the workspace as "
        "inbox/telegram-42/2026-12-03/abcd-1-photo.jpg (image/jpeg, 10.2 KB)."
    )
    assert files_reply([LOST]) == (
        "I could not download your document: 'big.iso' (25.0 MB) — it is over the size limit."
    )
