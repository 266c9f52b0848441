"""The history cache always hands back exactly what the store's ``history()`` reads: across
appends, resets, trimming, writers on other connections, rollbacks, and its own bounds;
and, exclusive (the only writer: SQLite's one daemon), without reading the store again."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlite_utils import Database as SqlDb

from echo_bot.agent.history import HistoryCache
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.secrets import Masker
from echo_bot.store import Database, HistoryReset, Tx

SESSIONS = ["cli:a", "cli:b", "telegram:c"]
TURNS = ["t0", "t1", "t2"]  # few, so a turn often goes on after its reset


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Database]:
    db = Database(path)
    db.open_sync()
    try:
        yield db
    finally:
        db.close_sync()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with opened(tmp_path / "history.sqlite3") as database:
        yield database


def append(db: Database, key: str, turn_id: str, message: ChatMessage) -> None:
    def write(d: SqlDb) -> None:
        tx = Tx(d, Masker())
        tx.turns.append_message(key, turn_id, message)
        tx.flush()  # as Store.run ends a unit of work

    db.run_sync(write)


def reset(db: Database, key: str) -> None:
    db.run_sync(lambda d: Tx(d, Masker()).turns.reset_session(key))


def both(db: Database, cache: HistoryCache, key: str) -> tuple[list[ChatMessage], ...]:
    """The cache's answer and the store's, read in the same transaction (committed, so
    the cache keeps what it read, as ``Store.run`` has it)."""

    def read(d: SqlDb) -> tuple[list[ChatMessage], list[ChatMessage], Tx]:
        tx = Tx(d, Masker())
        return cache.load(tx, key), tx.turns.history(key, cache.limit), tx

    cached, stored, tx = db.run_sync(read)
    for callback in tx.after_commit:
        callback()
    return cached, stored


def append_through(
    db: Database, cache: HistoryCache, key: str, turn_id: str, message: ChatMessage
) -> None:
    """An append as the turn runner makes it: the cache told of it in the same unit of
    work, and keeping it once committed."""

    def write(d: SqlDb) -> Tx:
        tx = Tx(d, Masker())
        kept = replace(message, turn_id=turn_id)
        tx.turns.append_message(key, turn_id, message, lambda seq: cache.added(tx, key, seq, kept))
        tx.flush()
        return tx

    for callback in db.run_sync(write).after_commit:
        callback()


def reset_through(db: Database, cache: HistoryCache, key: str) -> None:
    """``/new`` as the daemon runs it: the store announces the reset, the cache forgets."""

    def write(d: SqlDb) -> Tx:
        tx = Tx(d, Masker())
        tx.turns.reset_session(key)
        return tx

    for event in db.run_sync(write).committed:
        if isinstance(event, HistoryReset):
            cache.forget(event.session_key)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


# -- the property -------------------------------------------------------------------------
texts = st.text(alphabet="abc xyz!é", max_size=12)
tool_calls = st.lists(
    st.builds(
        ToolCall,
        id=st.from_regex(r"call_[a-z0-9]{1,6}", fullmatch=True),
        name=st.sampled_from(["current_time", "send_message", "shell"]),
        args=st.dictionaries(st.sampled_from(["text", "n", "to"]), st.integers(-3, 3) | texts),
    ),
    min_size=1,
    max_size=3,
).map(tuple)
messages = st.one_of(
    st.builds(ChatMessage, role=st.just("user"), content=texts),
    st.builds(ChatMessage, role=st.just("assistant"), content=texts),
    st.builds(ChatMessage, role=st.just("assistant"), content=st.none(), tool_calls=tool_calls),
    st.builds(
        ChatMessage,
        role=st.just("tool"),
        content=texts,
        tool_call_id=st.just("call_x"),
        name=st.just("shell"),
    ),
)
session = st.sampled_from(SESSIONS[:2])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), session, st.sampled_from(TURNS), messages),
        st.tuples(st.just("reset"), session),
        st.tuples(st.just("load"), session),
        st.tuples(st.just("forget"), session),
    ),
    max_size=40,
)


def replayed(test: Callable[..., None]) -> Callable[..., None]:
    """A property over up to 200 lists of ``operations`` on a fresh store, with a history
    limit of 1 to 5 (``replay`` does the work)."""
    return settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )(given(ops=operations, limit=st.integers(min_value=1, max_value=5))(test))


@replayed
def test_cache_always_equals_history(tmp_path: Path, ops: list[Any], limit: int) -> None:
    replay(tmp_path / f"{uuid.uuid4().hex}.sqlite3", ops, limit, exclusive=False)


@replayed
def test_an_exclusive_cache_equals_history_without_reading_it_again(
    tmp_path: Path, ops: list[Any], limit: int
) -> None:
    replay(tmp_path / f"{uuid.uuid4().hex}.sqlite3", ops, limit, exclusive=True)


def replay(path: Path, ops: list[Any], limit: int, *, exclusive: bool) -> None:
    """``ops`` on a fresh store, the cache's answer checked against the store's at each
    load and at the end. Exclusive: appends and resets as the daemon makes them (the
    cache told of each), the only writer."""
    with opened(path) as db:
        cache = HistoryCache(limit, exclusive=exclusive)
        for op in ops:
            kind, key = op[0], op[1]
            if kind == "append" and exclusive:
                append_through(db, cache, key, op[2], op[3])
            elif kind == "append":
                append(db, key, op[2], op[3])
            elif kind == "reset" and exclusive:
                reset_through(db, cache, key)
            elif kind == "reset":
                reset(db, key)
            elif kind == "forget":
                cache.forget(key)
            else:
                cached, stored = both(db, cache, key)
                assert cached == stored, (key, ops)
                assert len(cached) <= limit
        for key in SESSIONS:
            cached, stored = both(db, cache, key)
            assert cached == stored, (key, ops)


def test_an_exclusive_cache_reads_nothing_for_a_session_it_holds(db: Database) -> None:
    key = "cli:a"
    cache = HistoryCache(5, exclusive=True)
    append_through(db, cache, key, "t1", user("hello"))
    both(db, cache, key)  # read whole once: kept
    append_through(db, cache, key, "t1", assistant("hi"))
    sent: list[str] = []

    def traced_load(d: SqlDb) -> list[ChatMessage]:
        d.conn.set_trace_callback(sent.append)
        try:
            tx = Tx(d, Masker())
            said = user("and now?")
            tx.turns.append_message(key, "t2", said, lambda seq: cache.added(tx, key, seq, said))
            return cache.load(tx, key)
        finally:
            d.conn.set_trace_callback(None)

    loaded = db.run_sync(traced_load)
    assert [m.content for m in loaded] == ["hello", "hi", "and now?"]
    # The append (reported again as each of its triggers starts) and the full-text
    # index's own statements ("--"): no read of the history.
    assert {s for s in sent if not s.startswith("--")} == {sent[0]}
    assert sent[0].startswith("INSERT INTO messages")


def test_an_exclusive_cache_keeps_nothing_of_a_rolled_back_append(db: Database) -> None:
    key = "cli:a"
    cache = HistoryCache(5, exclusive=True)
    append_through(db, cache, key, "t1", user("first"))
    both(db, cache, key)

    def append_then_fail(d: SqlDb) -> None:
        tx = Tx(d, Masker())
        ghost = user("ghost")
        tx.turns.append_message(key, "t2", ghost, lambda seq: cache.added(tx, key, seq, ghost))
        assert [m.content for m in cache.load(tx, key)] == ["first", "ghost"]
        raise ValueError("the job failed after the append")

    with pytest.raises(ValueError, match="after the append"):
        db.run_sync(append_then_fail)
    append_through(db, cache, key, "t2", user("real"))
    cached, stored = both(db, cache, key)
    assert cached == stored
    assert [m.content for m in cached] == ["first", "real"]


# -- other writers ------------------------------------------------------------------------
def test_rows_written_by_other_connections_show_up_in_the_next_load(db: Database) -> None:
    key = "cli:a"
    cache = HistoryCache(5)
    append(db, key, "t1", user("hello"))
    assert both(db, cache, key)[0] == [ChatMessage(role="user", content="hello", turn_id="t1")]
    # A management command: a second Database on the same file.
    with opened(db.path) as other:
        append(other, key, "t1", assistant("hi there"))
    # A plain sqlite3 connection (another process's view of the file).
    with contextlib.closing(sqlite3.connect(db.path, isolation_level=None)) as conn:
        plain = SqlDb(conn)
        conn.execute("BEGIN IMMEDIATE")
        tx = Tx(plain, Masker())
        tx.turns.append_message(key, "t2", user("and again"))
        tx.flush()
        conn.execute("COMMIT")
    cached, stored = both(db, cache, key)
    assert cached == stored
    assert [m.content for m in cached] == ["hello", "hi there", "and again"]
    # A reset written elsewhere empties the cached history too.
    with opened(db.path) as other:
        other.run_sync(lambda d: Tx(d, Masker()).turns.reset_session(key))
    assert both(db, cache, key) == ([], [])


# -- the reset rule -----------------------------------------------------------------------
@pytest.mark.parametrize("warm", [True, False])
def test_the_turn_that_asked_for_a_reset_is_not_part_of_the_new_history(
    db: Database, warm: bool
) -> None:
    key = "cli:a"
    cache = HistoryCache(5)
    append(db, key, "t1", user("remember 42"))
    append(db, key, "t1", assistant("noted"))
    append(db, key, "t2", user("/reset"))
    if warm:
        assert [m.content for m in both(db, cache, key)[0]] == ["remember 42", "noted", "/reset"]
    db.run_sync(lambda d: Tx(d, Masker()).turns.reset_session(key))
    append(db, key, "t2", assistant("Done, starting over."))  # the reset turn's own reply
    assert both(db, cache, key) == ([], [])
    append(db, key, "t3", user("what did I say?"))
    cached, stored = both(db, cache, key)
    assert cached == stored
    assert [(m.turn_id, m.content) for m in cached] == [("t3", "what did I say?")]


# -- forget, clear and the bounds ---------------------------------------------------------
@pytest.mark.parametrize("warm", [True, False])
def test_a_load_that_was_rolled_back_leaves_nothing_in_the_cache(db: Database, warm: bool) -> None:
    key = "cli:a"
    cache = HistoryCache(5)
    append(db, key, "t1", user("first"))
    if warm:
        both(db, cache, key)

    def append_load_then_fail(d: SqlDb) -> None:
        tx = Tx(d, Masker())
        tx.turns.append_message(key, "t2", user("ghost"))
        assert [m.content for m in cache.load(tx, key)] == ["first", "ghost"]
        raise ValueError("the job failed after the cache read")

    with pytest.raises(ValueError, match="after the cache read"):
        db.run_sync(append_load_then_fail)
    append(db, key, "t2", user("real"))  # may take the rolled-back row's seq
    cached, stored = both(db, cache, key)
    assert cached == stored
    assert [m.content for m in cached] == ["first", "real"]


def test_at_most_max_sessions_are_kept(db: Database) -> None:
    cache = HistoryCache(5, max_sessions=2)
    for i, key in enumerate(SESSIONS):
        append(db, key, f"t{i}", user(f"hello from {key}"))
    for key in SESSIONS:
        cached, stored = both(db, cache, key)
        assert cached == stored and len(cached) == 1
    assert len(cache) == 2
    # The evicted session is read in full again, and correctly.
    append(db, SESSIONS[0], "t9", assistant("welcome back"))
    cached, stored = both(db, cache, SESSIONS[0])
    assert cached == stored
    assert [m.content for m in cached] == ["hello from cli:a", "welcome back"]
    assert len(cache) == 2


def test_a_session_larger_than_max_chars_is_not_kept(db: Database) -> None:
    cache = HistoryCache(5, max_chars=100)
    append(db, "cli:small", "t1", user("short"))
    append(db, "cli:big", "t2", user("x" * 60))
    append(db, "cli:big", "t2", assistant("y" * 60))
    assert both(db, cache, "cli:small")[0] == both(db, cache, "cli:small")[1]
    assert len(cache) == 1
    cached, stored = both(db, cache, "cli:big")
    assert cached == stored and len(cached) == 2
    # 120 characters do not fit in 100: not kept, and the small session is not pushed out.
    assert len(cache) == 1
    # Trimmed to the limit, the session fits again and is kept.
    small_limit = HistoryCache(1, max_chars=100)
    cached, stored = both(db, small_limit, "cli:big")
    assert cached == stored == [ChatMessage(role="assistant", content="y" * 60, turn_id="t2")]
    assert len(small_limit) == 1


def test_a_history_of_no_messages_is_refused() -> None:
    with pytest.raises(ValueError):
        HistoryCache(0)
