"""The schema and its forward migrations. Append a migration; never edit an old one."""

from __future__ import annotations

from collections.abc import Callable

from sqlite_utils import Database


def _run_script(db: Database, script: str) -> None:
    # Not executescript(): it COMMITs first, and migrations run inside one transaction.
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _v1(db: Database) -> None:
    _run_script(
        db,
        """
        CREATE TABLE inbox (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            channel TEXT NOT NULL,
            session_key TEXT NOT NULL,
            external_id TEXT,
            payload TEXT NOT NULL,
            status TEXT NOT NULL,
            error TEXT,
            received_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE UNIQUE INDEX inbox_dedup ON inbox(channel, external_id)
            WHERE external_id IS NOT NULL;
        CREATE INDEX inbox_status ON inbox(status, seq);

        CREATE TABLE outbox (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            channel TEXT NOT NULL,
            chat_key TEXT NOT NULL,
            payload TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at REAL NOT NULL,
            last_error TEXT,
            created_at REAL NOT NULL,
            finished_at REAL
        );
        CREATE INDEX outbox_queue ON outbox(status, channel, chat_key, seq);

        CREATE TABLE receipts (
            outbound_id TEXT PRIMARY KEY,
            channel TEXT NOT NULL,
            channel_message_id TEXT,
            delivered_at REAL NOT NULL
        );

        CREATE TABLE messages (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            session_key TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            role TEXT NOT NULL,
            content TEXT,
            tool_calls TEXT,
            tool_call_id TEXT,
            name TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX messages_session ON messages(session_key, seq);

        CREATE TABLE turns (
            id TEXT PRIMARY KEY,
            session_key TEXT NOT NULL,
            trace_id TEXT NOT NULL,
            step INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );

        CREATE TABLE tool_calls (
            id TEXT PRIMARY KEY,
            turn_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            name TEXT NOT NULL,
            args TEXT NOT NULL,
            args_hash TEXT NOT NULL,
            status TEXT NOT NULL,
            approval_id TEXT,
            result TEXT,
            started_at REAL,
            finished_at REAL
        );
        CREATE INDEX tool_calls_turn ON tool_calls(turn_id, step, idx);
        CREATE INDEX tool_calls_approval ON tool_calls(approval_id);

        CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            turn_id TEXT NOT NULL,
            session_key TEXT NOT NULL,
            trace_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            args TEXT NOT NULL,
            args_hash TEXT NOT NULL,
            risk TEXT NOT NULL,
            requested_by TEXT NOT NULL,
            origin TEXT NOT NULL,
            prompt_to TEXT NOT NULL,
            prompt_outbound_id TEXT,
            status TEXT NOT NULL,
            verb TEXT,
            decided_by TEXT,
            decided_at REAL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE INDEX approvals_status ON approvals(status, expires_at);

        CREATE TABLE grants (
            session_key TEXT NOT NULL,
            tool TEXT NOT NULL,
            until REAL NOT NULL,
            approval_id TEXT NOT NULL,
            PRIMARY KEY (session_key, tool)
        );

        CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            ts REAL NOT NULL,
            trace_id TEXT,
            session_key TEXT,
            kind TEXT NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX audit_trace ON audit(trace_id, seq);
        """,
    )


def _v2(db: Database) -> None:
    """Users allowed at run time (pairing), one-time pairing codes, failed tries."""
    _run_script(
        db,
        """
        CREATE TABLE allowed_users (
            channel TEXT NOT NULL,
            user_id TEXT NOT NULL,
            added_at REAL NOT NULL,
            via TEXT NOT NULL,
            PRIMARY KEY (channel, user_id)
        );
        CREATE TABLE pairing_codes (
            code_hash TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            used_by TEXT,
            used_at REAL
        );
        CREATE TABLE pair_attempts (
            channel TEXT NOT NULL,
            user_id TEXT NOT NULL,
            ts REAL NOT NULL
        );
        CREATE INDEX pair_attempts_user ON pair_attempts(channel, user_id, ts);
        """,
    )


def _v3(db: Database) -> None:
    """Why a model's tool call could not be read (answered INVALID_PARAMETER)."""
    db.execute("ALTER TABLE tool_calls ADD COLUMN error TEXT")


def _v4(db: Database) -> None:
    """Reminders (the store is the source of truth; the scheduler is only the timer),
    at-most-once fire markers, per-chat timezones, and cron bookkeeping."""
    _run_script(
        db,
        """
        CREATE TABLE reminders (
            id TEXT PRIMARY KEY,
            chat TEXT NOT NULL,
            owner TEXT NOT NULL,
            text TEXT NOT NULL,
            timezone TEXT NOT NULL,
            recurrence TEXT,
            next_at REAL NOT NULL,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            fired_count INTEGER NOT NULL DEFAULT 0,
            last_fired_at REAL,
            trace_id TEXT
        );
        CREATE INDEX reminders_due ON reminders(status, next_at);
        CREATE INDEX reminders_chat ON reminders(chat, status);
        CREATE TABLE reminder_fires (
            reminder_id TEXT NOT NULL,
            occurrence REAL NOT NULL,
            fired_at REAL NOT NULL,
            late_by REAL NOT NULL,
            outcome TEXT NOT NULL,
            PRIMARY KEY (reminder_id, occurrence)
        );
        CREATE TABLE chat_settings (
            session_key TEXT PRIMARY KEY,
            timezone TEXT
        );
        CREATE TABLE cron_state (
            job TEXT PRIMARY KEY,
            last_occurrence REAL NOT NULL
        );
        """,
    )


def _v5(db: Database) -> None:
    """A short summary of each inbound's outcome (the reply), for delivery status."""
    db.execute("ALTER TABLE inbox ADD COLUMN result TEXT")


def _v6(db: Database) -> None:
    """Which process wrote each inbound (NULL: a management command, or older rows): a
    daemon's dispatcher polls only for the rows it was not told about in memory."""
    db.execute("ALTER TABLE inbox ADD COLUMN instance TEXT")


def _v7(db: Database) -> None:
    """Token use since a moment (the daily LLM budget, read on every LLM step) by index,
    not by reading the whole audit log."""
    db.execute("CREATE INDEX audit_kind_ts ON audit(kind, ts)")


MIGRATIONS: list[Callable[[Database], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7]


def migrate(db: Database) -> int:
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    if version > len(MIGRATIONS):
        raise RuntimeError(
            f"the store has schema version {version}, newer than this echo-bot "
            f"({len(MIGRATIONS)}); upgrade echo-bot"
        )
    for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
        step(db)
        db.execute(
            "INSERT INTO meta(key, value) VALUES('schema_version', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [str(number)],
        )
    return len(MIGRATIONS)
