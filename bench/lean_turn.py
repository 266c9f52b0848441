"""The leanest turn this design allows on SQLite: issue 49's reference for its step-4
ratio (echo-bot ÷ its store floor), printed by ``turns.py --reference``.

The same turn as ``turns.py``'s ("what time is it?" → the rules brain's match →
``current_time`` → the reply on a no-op channel), with everything echo-bot keeps for
it: the inbound stored (deduplicated) before the turn starts, the two checkpoints —
the start with the step, the result with the answer — committed before the reply is
handed to the channel, the history, the audit rows masked, the outbox row and its
receipt. The same 20 statements in the same transactions as echo-bot's turn (the same
rows: two audit rows in the first checkpoint, three in the second; the history INSERT
without ``RETURNING seq``, which nothing here reads), into a store made by echo-bot's
own migrations (its indexes, its full-text triggers), and the
real work of the rules brain (``match_tool``, the tool's ``extract_args``), of
``current_time`` and of the masker.

What it leaves out is echo-bot's structure: one coroutine per turn calls everything
directly (no bus, dispatcher, runner, executor, delivery worker), plain dicts and
tuples instead of pydantic models, SQL written inline instead of repositories, and a
group commit on the loop's thread (the jobs of one loop iteration, one transaction)
without savepoints, retries, fencing, caches, metrics or hooks. It is not a product: it
is what the statements plus the least Python around them cost, the bound a leaner core
could approach.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from echo_bot.brains.rules import match_tool
from echo_bot.events import Address, Sender, new_id
from echo_bot.secrets import Masker
from echo_bot.tools.base import ToolContext
from echo_bot.tools.builtin.clock import CurrentTimeTool

CHANNEL = "bench"


class GroupCommit:
    """The jobs queued in one loop iteration, run in one transaction on the loop's
    thread, their futures answered after the COMMIT."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.queued: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self.scheduled = False

    def run(self, job: Callable[[sqlite3.Connection], Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.queued.append((job, future))
        if not self.scheduled:
            self.scheduled = True
            loop.call_soon(self.flush)
        return future

    def flush(self) -> None:
        self.scheduled = False
        batch, self.queued = self.queued, []
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            results = [job(conn) for job, _future in batch]
            conn.execute("COMMIT")
        except BaseException as exc:
            conn.execute("ROLLBACK")
            for _job, future in batch:
                future.set_exception(exc)
            return
        for (_job, future), result in zip(batch, results, strict=True):
            future.set_result(result)


_INSERT_INBOX = (
    "INSERT INTO inbox (id, kind, channel, session_key, external_id, payload, status,"
    " received_at, updated_at, instance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT DO NOTHING"
)
_MESSAGES = (
    "INSERT INTO messages (session_key, turn_id, role, content, tool_calls, tool_call_id,"
    " name, files, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?), (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_AUDIT = "INSERT INTO audit (ts, trace_id, session_key, kind, data) VALUES (?, ?, ?, ?, ?)"


class LeanCore:
    """Turns as one coroutine each, on a store at ``path`` (made by echo-bot)."""

    def __init__(self, path: Path) -> None:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        self.conn = conn
        self.commits = GroupCommit(conn)
        self.tool = CurrentTimeTool("UTC")
        self.tools = [self.tool]
        self.masker = Masker()
        self.sent = 0

    def close(self) -> None:
        self.conn.close()

    def _audit(
        self, now: float, trace: str, key: str, kind: str, data: dict[str, Any]
    ) -> list[Any]:
        return [now, trace, key, kind, json.dumps(self.masker.mask_data(data), default=str)]

    async def turn(self, chat: str, sender: str, text: str) -> str:
        key, trace, inbound_id = f"{CHANNEL}:{chat}", new_id(), new_id()
        received = datetime.now(UTC)
        payload = json.dumps(
            {
                "id": inbound_id,
                "address": {"channel": CHANNEL, "chat_id": chat, "thread_id": None},
                "sender": {"id": sender, "name": sender},
                "received_at": received.isoformat(),
                "external_id": new_id(),
                "trace_id": trace,
                "kind": "message",
                "text": text,
            }
        )
        now = time.time()
        row = (inbound_id, "message", CHANNEL, key, new_id(), payload, "accepted",
               received.timestamp(), now, None)  # fmt: skip
        if not await self.commits.run(lambda c: c.execute(_INSERT_INBOX, row).rowcount == 1):
            return ""  # a duplicate
        # The rules brain's step: the tool its triggers match, its arguments.
        found = match_tool(text, self.tools)
        assert found is not None
        tool, score = found
        args = tool.extract_args(text) or {}
        call_id = new_id()
        calls_json = json.dumps([{"id": call_id, "name": tool.name, "args": args}])
        args_json = json.dumps(args, sort_keys=True)
        args_hash = hashlib.sha256(args_json.encode()).hexdigest()

        def started(c: sqlite3.Connection) -> None:
            now = time.time()
            changed = c.execute(
                "UPDATE inbox SET status = 'running', error = NULL, updated_at = ?"
                " WHERE id = ? AND status IN ('accepted', 'running', 'waiting_approval')",
                [now, inbound_id],
            )
            assert changed.rowcount == 1
            c.execute(
                "INSERT INTO turns (id, session_key, trace_id, step, status, created_at,"
                " updated_at) VALUES (?, ?, ?, 0, 'running', ?, ?) ON CONFLICT(id) DO NOTHING",
                [inbound_id, key, trace, now, now],
            )
            c.execute(
                _MESSAGES,
                [key, inbound_id, "user", text, None, None, None, None, now,
                 key, inbound_id, "assistant", None, calls_json, None, None, None, now],
            )  # fmt: skip
            c.execute(
                "INSERT INTO tool_calls (id, turn_id, step, idx, name, args, args_hash, status,"
                " error, approval_id, result, started_at, finished_at)"
                " VALUES (?, ?, 0, 0, ?, ?, ?, 'approved', NULL, NULL, NULL, NULL, NULL)",
                [call_id, inbound_id, tool.name, args_json, args_hash],
            )
            c.execute(
                _AUDIT + ", (?, ?, ?, ?, ?)",
                self._audit(now, trace, key, "turn.started",
                            {"inbound_id": inbound_id, "kind": "message", "address": key,
                             "sender": sender, "text": text})
                + self._audit(now, trace, key, "brain.decision",
                              {"brain": "rules", "step": 0, "route_reason": f"score {score}",
                               "tool_calls": [{"name": tool.name, "args": args}]}),
            )  # fmt: skip

        await self.commits.run(started)
        ctx = ToolContext(
            trace_id=trace,
            session_key=key,
            origin=Address(channel=CHANNEL, chat_id=chat),
            user=Sender(id=sender, name=sender),
            turn_id=inbound_id,
        )
        result = await tool.run(args, ctx)
        answer = self.masker.mask(result.output)
        result_json = json.dumps({"ok": result.ok, "output": answer, "data": result.data})
        outbound_id = new_id()
        reply = json.dumps(
            {
                "id": outbound_id,
                "to": {"channel": CHANNEL, "chat_id": chat, "thread_id": None},
                "text": answer,
                "kind": "reply",
                "trace_id": trace,
                "metadata": {"inbound_id": inbound_id},
            }
        )

        def answered(c: sqlite3.Connection) -> None:
            now = time.time()
            c.execute(
                "UPDATE tool_calls SET status = 'done', result = ?, finished_at = ? WHERE id = ?",
                [result_json, now, call_id],
            )
            c.execute(
                "INSERT INTO outbox (id, channel, chat_key, payload, status, next_attempt_at,"
                " created_at) VALUES (?, ?, ?, ?, 'queued', ?, ?)",
                [outbound_id, CHANNEL, key, reply, now, now],
            )
            c.execute(
                "UPDATE inbox SET status = 'done', error = NULL, result = COALESCE(?, result),"
                " updated_at = ? WHERE id = ?",
                [answer, now, inbound_id],
            )
            c.execute(
                _MESSAGES,
                [key, inbound_id, "tool", answer, None, call_id, tool.name, None, now,
                 key, inbound_id, "assistant", answer, None, None, None, None, now],
            )  # fmt: skip
            c.execute(
                "UPDATE turns SET updated_at = ?, step = 1, status = 'done' WHERE id = ?",
                [now, inbound_id],
            )
            c.execute(
                _AUDIT + ", (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)",
                self._audit(now, trace, key, "tool.result",
                            {"call_id": call_id, "tool": tool.name, "args": args,
                             "ok": result.ok, "output": answer})
                + self._audit(now, trace, key, "brain.decision",
                              {"brain": "rules", "step": 1, "text": answer})
                + self._audit(now, trace, key, "turn.finished",
                              {"status": "done", "reply": answer, "error": None}),
            )  # fmt: skip

        await self.commits.run(answered)
        # Handed to the channel (a no-op here), then its receipt, in a later batch.
        self.sent += 1
        receipt = str(self.sent)

        def delivered(c: sqlite3.Connection) -> None:
            now = time.time()
            c.execute(
                "UPDATE outbox SET status = 'sent', attempts = attempts + 1, finished_at = ?"
                " WHERE id = ?",
                [now, outbound_id],
            )
            c.execute(
                "INSERT INTO receipts (outbound_id, channel, channel_message_id, delivered_at)"
                " VALUES (?, ?, ?, ?)",
                [outbound_id, CHANNEL, receipt, now],
            )

        self.commits.run(delivered)
        return answer
