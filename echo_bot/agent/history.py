"""The recent history of active sessions, parsed once and kept between brain steps.

Reading a session's history back from the store (up to ``limit`` messages, each rebuilt
into ``ChatMessage``) for every brain step was most of the store's work in a turn. The
``messages`` table only ever grows by appends with an increasing ``seq`` (messages and
reset markers alike; nothing updates or deletes a row), so a cached copy stays exact by
reading just the rows after the newest ``seq`` it has seen, in the same transaction
that would have read the whole history.

``load`` runs inside a unit of work, which may run more than once or be rolled back:
it never changes the cache itself, and what it read is kept only once committed
(``tx.on_commit``).

**Exclusive** (``exclusive=True``, as the turn runner keeps it): only the daemon driving
a session writes its history, so a cached session is not read on at all. What the turn
runner appends it says (``added``), and the cache takes it on commit; a reset (``/new``)
drops the session (the store's ``HistoryReset``), so its next load reads it whole. With
several daemons on one store, another may have driven the session while this one did
not hold its lease: taking the lease after such a break drops the session too
(``Cluster.on_break``).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass

from ..conversation import ChatMessage
from ..store import Tx
from ..store.turns import RESET

# Bounds on what the cache holds; a session that falls out is read in full next time.
MAX_SESSIONS = 256
MAX_CHARS = 16_000_000


@dataclass
class _Entry:
    seq: int  # the newest row read, reset markers included
    reset_turn: str  # rows of the turn that asked for the last reset are not history
    messages: deque[ChatMessage]
    chars: int
    seqs: deque[int]  # each message's seq, in step with ``messages``


class HistoryCache:
    def __init__(
        self,
        limit: int,
        *,
        max_sessions: int = MAX_SESSIONS,
        max_chars: int = MAX_CHARS,
        exclusive: bool = False,
    ) -> None:
        if limit < 1:
            raise ValueError("a history of at least one message")
        self.limit = limit
        self.exclusive = exclusive
        # Rows ``added`` in a unit of work not committed yet, by session: its later loads
        # include them.
        self._added: weakref.WeakKeyDictionary[Tx, dict[str, list[tuple[int, ChatMessage]]]]
        self._added = weakref.WeakKeyDictionary()
        self.max_sessions = max_sessions
        self.max_chars = max_chars
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def load(self, tx: Tx, session_key: str) -> list[ChatMessage]:
        """The session's newest ``limit`` messages since its last reset, oldest first."""
        return [message for _seq, message in self.load_rows(tx, session_key)]

    def load_rows(self, tx: Tx, session_key: str) -> list[tuple[int, ChatMessage]]:
        """``load``, each message with its seq."""
        if self.exclusive:  # this unit of work's appends, told their seqs now (``added``)
            tx.turns.flush_messages(seqs_now=True)
        with self._lock:
            cached = self._entries.get(session_key)
            if cached is not None and self.exclusive:  # nobody else writes it: no read
                added = self._added.get(tx, {}).get(session_key)
                entry = _extended(cached, added) if added else cached
                return list(zip(entry.seqs, entry.messages, strict=True))
        if cached is None:
            entry = self._read_all(tx, session_key)
        else:
            entry = self._read_new(tx, session_key, cached)
        if entry is not cached:
            tx.on_commit(lambda: self._keep(session_key, entry))
        return list(zip(entry.seqs, entry.messages, strict=True))

    def peek(self, session_key: str, pending: list[ChatMessage]) -> list[ChatMessage] | None:
        """Exclusive only: the history a load would give once ``pending`` (the session's
        next messages, none a reset marker, not written yet) is appended; None when the
        session is not held."""
        with self._lock:
            cached = self._entries.get(session_key) if self.exclusive else None
            if cached is None:
                return None
            messages = list(cached.messages)
            reset_turn = cached.reset_turn
        messages += [m for m in pending if m.turn_id != reset_turn]
        return messages[-self.limit :]

    def added(self, tx: Tx, session_key: str, seq: int, message: ChatMessage) -> None:
        """``message`` was appended to the session's history as ``seq`` in ``tx`` (the
        turn runner's appends: ``exclusive`` keeps the cache by them)."""
        if not self.exclusive:
            return
        rows = self._added.setdefault(tx, {}).setdefault(session_key, [])
        if not rows:
            tx.on_commit(lambda: self._extend(session_key, rows))
        rows.append((seq, message))

    def _extend(self, session_key: str, rows: list[tuple[int, ChatMessage]]) -> None:
        """``rows``, committed, onto the session's entry (in place: readers copy it under
        the lock)."""
        with self._lock:
            cached = self._entries.pop(session_key, None)
            if cached is None:  # not kept
                return
            self._chars -= cached.chars
            # Read since (a newer load kept): as it is.
            entry = cached if cached.seq >= rows[0][0] else _add_rows(cached, rows)
            if entry.chars > self.max_chars:
                return
            self._entries[session_key] = entry  # the newest used: last to go
            self._chars += entry.chars
            self._evict()

    def _keep(self, session_key: str, entry: _Entry) -> None:
        """Cache what a committed unit of work read (the newer, if two read at once)."""
        with self._lock:
            old = self._entries.pop(session_key, None)
            if old is not None:
                self._chars -= old.chars
                if old.seq > entry.seq:
                    entry = old
            if entry.chars > self.max_chars:  # would only push every other session out
                return
            self._entries[session_key] = entry
            self._chars += entry.chars
            self._evict()

    def forget(self, session_key: str) -> None:
        with self._lock:
            entry = self._entries.pop(session_key, None)
            if entry is not None:
                self._chars -= entry.chars

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    # -- inside the transaction -----------------------------------------------------------
    def _read_all(self, tx: Tx, session_key: str) -> _Entry:
        mark = tx.turns.reset_mark(session_key)
        rows = tx.turns.history_rows(session_key, self.limit, mark)
        newest = tx.turns.newest_seq(session_key)
        messages = deque((m for _seq, m in rows), maxlen=self.limit)
        return _Entry(
            seq=newest,
            reset_turn=mark[1],
            messages=messages,
            chars=sum(_size(m) for m in messages),
            seqs=deque((seq for seq, _m in rows), maxlen=self.limit),
        )

    def _read_new(self, tx: Tx, session_key: str, cached: _Entry) -> _Entry:
        """``cached`` as it is with the rows after it; a copy, if there are any."""
        rows = tx.turns.messages_after(session_key, cached.seq)
        return _extended(cached, rows) if rows else cached

    def _evict(self) -> None:
        while self._entries and (
            len(self._entries) > self.max_sessions or self._chars > self.max_chars
        ):
            _key, old = self._entries.popitem(last=False)
            self._chars -= old.chars


def _extended(cached: _Entry, rows: list[tuple[int, ChatMessage]]) -> _Entry:
    """A copy of ``cached`` with ``rows`` (the session's next rows, in order) after it."""
    limit = cached.messages.maxlen
    copy = _Entry(
        seq=cached.seq,
        reset_turn=cached.reset_turn,
        messages=deque(cached.messages, maxlen=limit),
        chars=cached.chars,
        seqs=deque(cached.seqs, maxlen=limit),
    )
    return _add_rows(copy, rows)


def _add_rows(entry: _Entry, rows: list[tuple[int, ChatMessage]]) -> _Entry:
    """``entry`` with ``rows`` (the session's next rows, in order) appended, in place."""
    for seq, message in rows:
        entry.seq = seq
        if message.role == RESET:
            entry.messages.clear()
            entry.seqs.clear()
            entry.chars = 0
            entry.reset_turn = message.turn_id or ""
            continue
        if message.turn_id == entry.reset_turn:
            continue
        if len(entry.messages) == entry.messages.maxlen:
            entry.chars -= _size(entry.messages[0])
        entry.messages.append(message)
        entry.seqs.append(seq)
        entry.chars += _size(message)
    return entry


def _size(message: ChatMessage) -> int:
    return len(message.text or "") + sum(
        len(str(call.args)) + len(call.name) for call in message.tool_calls
    )
