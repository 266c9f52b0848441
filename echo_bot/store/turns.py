"""Turn checkpoints: history messages, turns, and the tool calls of each step.

A step (the brain's reply with its tool calls) is committed before any call runs, and a
side-effecting call is marked "started" before it runs and "done" after, so recovery
after a crash knows exactly which calls may have happened.
"""

from __future__ import annotations

import builtins
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ..conversation import ChatMessage, FileNote, ToolCall
from ..events import InboundStatus
from ..statuses import CallStatus, TurnStatus
from .committed import HistoryReset
from .sql import SqlDb, expect_change, read_later

if TYPE_CHECKING:
    from .tx import Tx


@dataclass(frozen=True, slots=True)
class TurnRow:
    id: str
    session_key: str
    trace_id: str
    step: int
    status: TurnStatus

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TurnStatus(self.status))


@dataclass(frozen=True, slots=True)
class CallRow:
    id: str
    turn_id: str
    step: int
    idx: int
    name: str
    args: dict[str, Any]
    args_hash: str
    status: CallStatus
    approval_id: str | None
    result: dict[str, Any] | None
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", CallStatus(self.status))


RESET = "reset"  # a marker row: history starts after the newest one


def _message(row: Any) -> ChatMessage:
    _seq, role, content, calls, call_id, name, turn_id, files = row
    tool_calls = tuple(ToolCall.from_json(c) for c in json.loads(calls)) if calls else ()
    # A row stored before files had a column has its notes as lines of its content.
    notes = tuple(FileNote.from_json(f) for f in json.loads(files)) if files else ()
    return ChatMessage(
        role=role,
        content=content,
        tool_calls=tool_calls,
        tool_call_id=call_id,
        name=name,
        turn_id=turn_id,
        files=notes,
    )


def _tell_seqs(told: list[Callable[[int], None] | None], cursor: Any) -> None:
    # Seqs are given in the order of the VALUES; RETURNING's order is the engine's own.
    seqs = sorted(int(row[0]) for row in cursor.fetchall())
    for on_seq, seq in zip(told, seqs, strict=True):
        if on_seq is not None:
            on_seq(seq)


class TurnRepo:
    """Turns, their history (messages) and their tool calls: the checkpoint."""

    __slots__ = ("_appends", "_db", "_pending", "_sets", "_tx")

    def __init__(self, db: SqlDb, tx: Tx | None = None) -> None:
        self._db, self._tx = db, tx
        # Calls added in this unit of work, not inserted yet: by id, their columns. They
        # are settled (approved, waiting, finished) before the commit, so each is
        # inserted once as it ends up (``flush``) rather than inserted, then updated.
        self._pending: dict[str, dict[str, Any]] = {}
        # Changes to turns (``set``), by turn: one UPDATE each at the end.
        self._sets: dict[str, dict[str, Any]] = {}
        # History rows appended, not inserted yet: one INSERT for all (``flush_messages``).
        self._appends: list[tuple[list[Any], Callable[[int], None] | None]] = []

    def get(self, turn_id: str) -> TurnRow | None:
        self.flush()
        raw = self._db.execute(
            "SELECT id, session_key, trace_id, step, status FROM turns WHERE id = ?", [turn_id]
        ).fetchone()
        return TurnRow(*raw) if raw else None

    def of_inbound(self, inbound_id: str) -> tuple[InboundStatus, TurnRow | None] | None:
        """The inbound's status and its turn (None before it has one) in one read; None
        when there is no such inbound. A turn has its inbound's id."""
        self.flush()
        raw = self._db.execute(
            "SELECT i.status, t.id, t.session_key, t.trace_id, t.step, t.status FROM inbox i"
            " LEFT JOIN turns t ON t.id = i.id WHERE i.id = ?",
            [inbound_id],
        ).fetchone()
        if raw is None:
            return None
        return InboundStatus(raw[0]), TurnRow(*raw[1:]) if raw[1] is not None else None

    def add(self, turn_id: str, session_key: str, trace_id: str) -> bool:
        """A new turn, running at step 0; False (and nothing written) when it exists."""
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO turns (id, session_key, trace_id, step, status, created_at, updated_at)"
            " VALUES (?, ?, ?, 0, 'running', ?, ?) ON CONFLICT(id) DO NOTHING",
            [turn_id, session_key, trace_id, now, now],
        )
        return bool(cursor.rowcount == 1)

    def add_new(self, turn_id: str, session_key: str, trace_id: str, error: Exception) -> None:
        """``add``; raise ``error`` when the turn exists — on PostgreSQL at the unit of
        work's next wait (``sql.expect_change``)."""
        now = time.time()
        expect_change(
            self._db,
            "INSERT INTO turns (id, session_key, trace_id, step, status, created_at, updated_at)"
            " VALUES (?, ?, ?, 0, 'running', ?, ?) ON CONFLICT(id) DO NOTHING",
            [turn_id, session_key, trace_id, now, now],
            error,
        )

    def create(self, turn_id: str, session_key: str, trace_id: str) -> TurnRow:
        """``add``; the turn as it is stored (the one there already, if it existed)."""
        if not self.add(turn_id, session_key, trace_id):
            row = self.get(turn_id)
            assert row is not None
            return row
        return TurnRow(turn_id, session_key, trace_id, 0, TurnStatus.RUNNING)

    def set(
        self, turn_id: str, *, step: int | None = None, status: TurnStatus | None = None
    ) -> None:
        """Change the turn; written with the unit of work's end, every change to it in
        one UPDATE (``flush``)."""
        sets = self._sets.setdefault(turn_id, {})
        sets["updated_at"] = time.time()
        if step is not None:
            sets["step"] = step
        if status is not None:
            sets["status"] = status

    def append_message(
        self,
        session_key: str,
        turn_id: str,
        message: ChatMessage,
        on_seq: Callable[[int], None] | None = None,
    ) -> None:
        """Append ``message`` to the session's history. Inserted with the unit of work's
        other appends in one statement, at its end or before a read of the history
        (``flush_messages``); ``on_seq(seq)`` is told its seq once committed."""
        values = [
            session_key,
            turn_id,
            message.role,
            message.content,
            json.dumps([c.to_json() for c in message.tool_calls]) if message.tool_calls else None,
            message.tool_call_id,
            message.name,
            json.dumps([f.to_json() for f in message.files]) if message.files else None,
            time.time(),
        ]
        self._appends.append((values, on_seq))

    def flush_messages(self, *, seqs_now: bool = False) -> None:
        """Insert the appended history rows, in order (their seqs follow it). Each
        ``on_seq`` is told its seq once committed (``sql.read_later``: on PostgreSQL no
        wait of its own), or ``seqs_now``, at once."""
        while self._appends:
            chunk, self._appends = (
                self._appends[:_ROWS_PER_INSERT],
                self._appends[_ROWS_PER_INSERT:],
            )
            marks = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
            cursor = self._db.execute(
                "INSERT INTO messages (session_key, turn_id, role, content, tool_calls,"
                f" tool_call_id, name, files, created_at) VALUES {marks} RETURNING seq",
                [value for values, _on_seq in chunk for value in values],
            )
            told = [on_seq for _values, on_seq in chunk]
            if not any(told):
                continue
            if seqs_now:
                _tell_seqs(told, cursor)
            else:
                read_later(self._db, cursor, partial(_tell_seqs, told))

    def reset_session(self, session_key: str) -> None:
        self.flush_messages()
        # The marker carries the turn that asked for the reset (the one whose user message
        # is the newest): that turn's own reply is not part of the fresh conversation.
        self._db.execute(
            "INSERT INTO messages (session_key, turn_id, role, created_at) VALUES (?, COALESCE("
            "(SELECT turn_id FROM messages WHERE session_key = ? ORDER BY seq DESC LIMIT 1), ''),"
            " ?, ?)",
            [session_key, session_key, RESET, time.time()],
        )
        if self._tx is not None:
            self._tx.announce(HistoryReset(session_key))

    def history(self, session_key: str, limit: int = 200) -> list[ChatMessage]:
        """The session's newest messages since its last reset, oldest first."""
        return [message for _seq, message in self.history_rows(session_key, limit)]

    def reset_mark(self, session_key: str) -> tuple[int, str]:
        """The seq of the session's newest reset marker and the turn that asked for it."""
        self.flush_messages()
        mark = self._db.execute(
            "SELECT seq, turn_id FROM messages WHERE session_key = ? AND role = ?"
            " ORDER BY seq DESC LIMIT 1",
            [session_key, RESET],
        ).fetchone()
        return (mark[0], mark[1] or "") if mark else (0, "")

    def history_rows(
        self, session_key: str, limit: int, mark: tuple[int, str] | None = None
    ) -> list[tuple[int, ChatMessage]]:
        """``history`` with each message's seq (what a cache reads on from); ``mark``: the
        session's ``reset_mark`` when the caller has read it already."""
        self.flush_messages()
        since, reset_turn = mark if mark is not None else self.reset_mark(session_key)
        rows = self._db.execute(
            "SELECT seq, role, content, tool_calls, tool_call_id, name, turn_id, files"
            " FROM messages WHERE session_key = ? AND seq > ? AND turn_id != ?"
            " ORDER BY seq DESC LIMIT ?",
            [session_key, since, reset_turn, limit],
        ).fetchall()
        return [(row[0], _message(row)) for row in reversed(rows)]

    def rows_between(
        self, session_key: str, after: int, before: int | None, limit: int
    ) -> list[tuple[int, ChatMessage]]:
        """The session's history rows (since its last reset, as ``history_rows``) with
        ``after < seq < before`` (``before`` None: no upper end), oldest first, at most
        ``limit``: what a summary reads beyond the window a turn loads."""
        since, reset_turn = self.reset_mark(session_key)
        rows = self._db.execute(
            "SELECT seq, role, content, tool_calls, tool_call_id, name, turn_id, files"
            " FROM messages WHERE session_key = ? AND seq > ? AND seq < ? AND turn_id != ?"
            " ORDER BY seq LIMIT ?",
            [session_key, max(since, after), before if before is not None else 2**62,
             reset_turn, limit],
        ).fetchall()  # fmt: skip
        return [(row[0], _message(row)) for row in rows]

    def unfinished(self, turn_ids: builtins.set[str]) -> builtins.set[str]:
        """Which of ``turn_ids`` are still running or waiting for an approval."""
        if not turn_ids:
            return set()
        self.flush()
        ids = sorted(turn_ids)
        marks = ",".join("?" for _ in ids)
        rows = self._db.execute(
            f"SELECT id FROM turns WHERE id IN ({marks}) AND status IN (?, ?)",
            [*ids, TurnStatus.RUNNING.value, TurnStatus.WAITING.value],
        ).fetchall()
        return {r[0] for r in rows}

    def newest_seq(self, session_key: str) -> int:
        """The seq of the session's newest row (reset markers included), 0 when none."""
        self.flush_messages()
        row = self._db.execute(
            "SELECT MAX(seq) FROM messages WHERE session_key = ?", [session_key]
        ).fetchone()
        return int(row[0] or 0)

    def messages_after(self, session_key: str, seq: int) -> list[tuple[int, ChatMessage]]:
        """Every row of the session after ``seq``, reset markers included, oldest first."""
        self.flush_messages()
        rows = self._db.execute(
            "SELECT seq, role, content, tool_calls, tool_call_id, name, turn_id, files"
            " FROM messages WHERE session_key = ? AND seq > ? ORDER BY seq",
            [session_key, seq],
        ).fetchall()
        return [(row[0], _message(row)) for row in rows]

    def add_calls(
        self, turn_id: str, step: int, calls: list[tuple[ToolCall, str]]
    ) -> list[CallRow]:
        """Store the step's calls as planned; the rows as ``calls_of_step`` would read them.
        Written with the unit of work's end (``flush``), as ``set_call`` left them."""
        rows = []
        for idx, (call, args_hash) in enumerate(calls):
            args = json.dumps(call.args, sort_keys=True)
            self._pending[call.id] = {
                "id": call.id, "turn_id": turn_id, "step": step, "idx": idx,
                "name": call.name, "args": args, "args_hash": args_hash,
                "status": CallStatus.PLANNED, "error": call.error, "approval_id": None,
                "result": None, "started_at": None, "finished_at": None,
            }  # fmt: skip
            rows.append(
                CallRow(
                    id=call.id,
                    turn_id=turn_id,
                    step=step,
                    idx=idx,
                    name=call.name,
                    args=json.loads(args),
                    args_hash=args_hash,
                    status=CallStatus.PLANNED,
                    approval_id=None,
                    result=None,
                    error=call.error,
                )
            )
        return rows

    def flush(self) -> None:
        """Write what this unit of work held back: its history rows, the calls it added,
        as they are now, and each turn's changes."""
        self.flush_messages()
        if self._pending:
            pending, self._pending = list(self._pending.values()), {}
            self._db.conn.executemany(
                f"INSERT INTO tool_calls ({', '.join(_PENDING_COLUMNS)})"
                f" VALUES ({', '.join('?' for _ in _PENDING_COLUMNS)})",
                [[row[column] for column in _PENDING_COLUMNS] for row in pending],
            )
        sets, self._sets = self._sets, {}
        for turn_id, changes in sets.items():
            assigned = ", ".join(f"{column} = ?" for column in changes)
            self._db.execute(
                f"UPDATE turns SET {assigned} WHERE id = ?", [*changes.values(), turn_id]
            )

    def calls_of_step(self, turn_id: str, step: int) -> list[CallRow]:
        self.flush()
        rows = self._db.execute(
            f"SELECT {_CALL_COLUMNS} FROM tool_calls WHERE turn_id = ? AND step = ? ORDER BY idx",
            [turn_id, step],
        ).fetchall()
        return [_call_row(r) for r in rows]

    def set_call(
        self,
        call_id: str,
        status: CallStatus,
        *,
        result: dict[str, Any] | None = None,
        approval_id: str | None = None,
    ) -> None:
        now = time.time()
        pending = self._pending.get(call_id)
        if pending is not None:  # added in this unit of work: inserted as it ends up
            pending["status"] = status
            if status == CallStatus.STARTED:
                pending["started_at"] = now
            if result is not None:
                pending["result"], pending["finished_at"] = json.dumps(result), now
            if approval_id is not None:
                pending["approval_id"] = approval_id
            return
        sets = ["status = ?"]
        args: list[Any] = [status]
        if status == CallStatus.STARTED:
            sets.append("started_at = ?")
            args.append(now)
        if result is not None:
            sets += ["result = ?", "finished_at = ?"]
            args += [json.dumps(result), now]
        if approval_id is not None:
            sets.append("approval_id = ?")
            args.append(approval_id)
        self._db.execute(f"UPDATE tool_calls SET {', '.join(sets)} WHERE id = ?", [*args, call_id])

    def taken_and_repeats(
        self, turn_id: str, ids: list[str], hashes: list[str]
    ) -> tuple[builtins.set[str], int]:
        """Which of ``ids`` a stored call uses already, and how often the most repeated of
        ``hashes`` was called in this turn: in one read."""
        self.flush()
        if not ids or not hashes:  # `IN ()` is no SQL to PostgreSQL
            return self.taken(ids), self._repeats(turn_id, hashes)
        id_marks = ",".join("?" for _ in ids)
        hash_marks = ",".join("?" for _ in hashes)
        rows = self._db.execute(
            f"SELECT 0, id FROM tool_calls WHERE id IN ({id_marks}) UNION ALL"
            " SELECT 1, args_hash FROM tool_calls WHERE turn_id = ?"
            f" AND args_hash IN ({hash_marks})",
            [*ids, turn_id, *hashes],
        ).fetchall()
        taken = {value for part, value in rows if part == 0}
        counts = Counter(value for part, value in rows if part == 1)
        return taken, max(counts.values(), default=0)

    def call_count(self, *, started: bool = False) -> int:
        """How many tool calls the store holds, of every turn; ``started``: only those
        whose run began."""
        self.flush()
        where = " WHERE started_at IS NOT NULL" if started else ""
        return int(self._db.execute(f"SELECT COUNT(*) FROM tool_calls{where}").fetchone()[0])

    def every_turn(self) -> list[TurnRow]:
        """Every turn the store holds, of every session."""
        self.flush()
        rows = self._db.execute(
            "SELECT id, session_key, trace_id, step, status FROM turns ORDER BY created_at, id"
        ).fetchall()
        return [TurnRow(*row) for row in rows]

    def every_call(self) -> list[CallRow]:
        """Every tool call the store holds, of every turn, turn by turn and step by step."""
        self.flush()
        rows = self._db.execute(
            f"SELECT {_CALL_COLUMNS} FROM tool_calls ORDER BY turn_id, step, idx"
        ).fetchall()
        return [_call_row(r) for r in rows]

    def every_message(self) -> list[ChatMessage]:
        """Every row of every session's history (reset markers included), oldest first."""
        self.flush_messages()
        rows = self._db.execute(
            "SELECT seq, role, content, tool_calls, tool_call_id, name, turn_id, files"
            " FROM messages ORDER BY seq"
        ).fetchall()
        return [_message(row) for row in rows]

    def taken(self, ids: list[str]) -> builtins.set[str]:
        """Which of ``ids`` are already used by a stored tool call (none: no statement)."""
        if not ids:
            return set()
        self.flush()
        marks = ",".join("?" for _ in ids)
        rows = self._db.execute(f"SELECT id FROM tool_calls WHERE id IN ({marks})", ids).fetchall()
        return {r[0] for r in rows}

    def _repeats(self, turn_id: str, hashes: list[str]) -> int:
        """How often the most repeated of ``hashes`` was already called in this turn."""
        if not hashes:
            return 0
        marks = ",".join("?" for _ in hashes)
        row = self._db.execute(
            f"SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM tool_calls WHERE turn_id = ?"
            f" AND args_hash IN ({marks}) GROUP BY args_hash) AS counted",
            [turn_id, *hashes],
        ).fetchone()
        return int(row[0] or 0)


_ROWS_PER_INSERT = 100  # 9 values each, under SQLite's oldest limit of 999 variables
_PENDING_COLUMNS = (
    "id", "turn_id", "step", "idx", "name", "args", "args_hash", "status", "error",
    "approval_id", "result", "started_at", "finished_at",
)  # fmt: skip
_CALL_COLUMNS = "id, turn_id, step, idx, name, args, args_hash, status, approval_id, result, error"


def _call_row(r: Any) -> CallRow:
    return CallRow(
        id=r[0],
        turn_id=r[1],
        step=r[2],
        idx=r[3],
        name=r[4],
        args=json.loads(r[5]),
        args_hash=r[6],
        status=r[7],
        approval_id=r[8],
        result=json.loads(r[9]) if r[9] else None,
        error=r[10],
    )
