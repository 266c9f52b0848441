"""The PostgreSQL engine: one database shared by any number of echo-bot instances.

Imported only when ``[storage] engine = "postgres"`` (the driver comes with the
``postgres`` extra). The driver is psycopg 3, used synchronously on the store thread:
a unit of work is a plain function running its statements one after another
(``fn(tx)``), the contract both engines keep, and every PostgreSQL round trip is off the
event loop by construction. asyncpg would make every repository a coroutine and add a
task switch per statement; see docs/ARCHITECTURE.md for the measurement.

Jobs are group-committed as on SQLite (``engine.run_begun``: a batch in one
transaction, run again with a savepoint per job when one fails, which PostgreSQL
needs: after a failed statement it refuses every other until a rollback). The
connection is opened at start (the schema migrated under an advisory lock, so
instances starting at once migrate once) and opened again before the next batch when
it was lost: while the database is unreachable each job fails with StoreUnavailable,
and nothing is acknowledged that was not committed. How several daemons share the work
of one database is ``echo_bot/cluster.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache, partial
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ..errors import NoSchema, StoreError, StoreUnavailable
from .engine import Session, ThreadedEngine
from .meta import WAKE_CHANNEL, notify_now
from .schema import SchemaBehind, SchemaTooNew, has_schema, migrate
from .sql import EXPECT_STATE, POSTGRES, describe_url

CONNECT_TIMEOUT = 5  # seconds
CONNECTIONS_PER_DAEMON = 2  # the store thread's, and the LISTEN thread's
IDLE_IN_TRANSACTION = "5s"  # the longest a transaction of ours may sit idle (see _connect)
# A transaction begun this soon after the last one ended is pipelined from its BEGIN;
# later, the BEGIN waits for the server (a dropped connection is found before the work).
FRESH_FOR = 1.0  # seconds
MAX_SYNCS = 1000  # after a failed statement, Syncs until every result is read (each reads some)
# pg_advisory_xact_lock key held while the schema is migrated ("echo" in ASCII).
MIGRATION_LOCK = 0x6563686F

T = TypeVar("T")

log = logging.getLogger(__name__)


class Row(tuple[Any, ...]):
    """A result row read by position or by column name, as ``sqlite3.Row`` is."""

    _index: dict[str, int]

    def __new__(cls, values: Sequence[Any], index: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _rows(cursor: Any) -> Any:
    """psycopg's row factory, called for every result (a write's too): the column names
    read off the result itself, their index made once per shape."""
    result = cursor.pgresult
    count = result.nfields if result is not None else 0
    index = _index(tuple(result.fname(i) for i in range(count))) if count else _NO_COLUMNS
    return lambda values: Row(values, index)


_NO_COLUMNS: dict[str, int] = {}


@lru_cache(maxsize=1024)
def _index(names: tuple[bytes, ...]) -> dict[str, int]:
    return {name.decode(): i for i, name in enumerate(names)}


@lru_cache(maxsize=2048)
def _placeholders(sql: str) -> str:
    """The store's ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


# PostgreSQL's text refuses U+0000, and its JSON types the escape \u0000 (SQLite takes
# both): a NUL a user or a model sent is stored as U+FFFD, in plain text and in JSON.
_JSON_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _without_nul(parameters: Sequence[Any]) -> Sequence[Any]:
    for p in parameters:  # a loop, not any(): this runs for every statement
        if isinstance(p, str) and ("\x00" in p or "\\u0000" in p):
            return [_nul_free(p) if isinstance(p, str) else p for p in parameters]
    return parameters


def _nul_free(text: str) -> str:
    text = text.replace("\x00", "\ufffd")
    return _JSON_NUL.sub(lambda m: m.group(1) + "\\ufffd", text) if "\\u0000" in text else text


class PgHandle:
    """What a job is given on PostgreSQL: ``sql.SqlDb``'s ``execute`` and ``conn``.

    Once the store is open its connection stays in psycopg's pipeline mode
    (``pipeline``). In a transaction begun ``lazy`` (``begin``) a statement is held
    back, not sent: a read of its cursor (``_Pending``: its rows, its row count) sends
    everything held back at once and waits for it (one round trip, ended by a Sync), and
    the COMMIT does the same for the rest. A statement whose result nobody reads (an
    INSERT, an UPDATE, a NOTIFY) costs no round trip of its own. Held back, not only
    pipelined, and every send ended by a Sync: between two round trips the server sees
    the transaction idle, so ``IDLE_IN_TRANSACTION`` still ends one whose daemon froze,
    and no row is locked by a statement that has not run yet. (Leaving pipeline mode,
    psycopg sends a Flush after the Sync, which stops the server's idle timer: hence
    the mode kept.) ``round_trips`` counts the waits."""

    __slots__ = (
        "_conn",
        "_ended_at",
        "_expected",
        "_held",
        "_in_pipeline",
        "_later",
        "_lazy",
        "_pipeline",
        "_trace",
        "_trace_parameters",
        "_wakes",
        "round_trips",
    )
    dialect = POSTGRES

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._trace: Callable[..., object] | None = None
        self._trace_parameters = False
        self._in_pipeline: Any = None  # psycopg's context manager, entered for good
        self._pipeline: psycopg.Pipeline | None = None
        self._held: list[_Pending] = []  # sent at the next read or COMMIT
        self._lazy = False
        # The transaction's expectations (``expect``) by the message the server fails
        # with, and its reads left for after the COMMIT (``read_later``).
        self._expected: dict[str, Exception] = {}
        self._later: list[tuple[_Pending, Callable[[Any], None]]] = []
        self._ended_at = 0.0  # monotonic, when the last transaction ended
        # What the transaction begun wakes in the other daemons (``wake``): one NOTIFY at
        # its COMMIT for all its jobs. None outside a transaction begun here.
        self._wakes: set[str] | None = None
        self.round_trips = 0

    @property
    def conn(self) -> PgHandle:
        return self

    def pipeline(self) -> None:
        """Put the connection in pipeline mode for good (after the schema is migrated:
        a migration may send several statements in one string, which the mode refuses)."""
        self._in_pipeline = self._conn.pipeline()
        self._pipeline = self._in_pipeline.__enter__()

    def close(self) -> None:
        """Leave pipeline mode (quietly: the connection may be lost already)."""
        in_pipeline, self._in_pipeline, self._pipeline = self._in_pipeline, None, None
        if in_pipeline is not None:
            with contextlib.suppress(psycopg.Error):
                in_pipeline.__exit__(None, None, None)

    @property
    def begun_unsent(self) -> bool:
        """A lazy transaction of which nothing has been sent yet, not even its BEGIN."""
        return bool(self._held) and self._held[0].sql == "BEGIN"

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        if self._trace is not None:
            self._traced(sql, parameters, False)
        if self._pipeline is not None:
            return self._hold(_Pending(self, sql, parameters, False))
        self.round_trips += 1
        if not parameters:
            return self._conn.execute(sql)
        return self._conn.execute(_placeholders(sql), _without_nul(parameters))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]]) -> Any:
        rows = [_without_nul(p) for p in parameters]
        if self._trace is not None:
            self._traced(sql, rows, True)
        if self._pipeline is not None:
            return self._hold(_Pending(self, sql, rows, True))
        self.round_trips += 1  # psycopg pipelines the rows itself
        cursor = self._conn.cursor()
        cursor.executemany(_placeholders(sql), rows)
        return cursor

    def expect(self, sql: str, parameters: Sequence[Any], error: Exception) -> None:
        """Run ``sql``, an ``echo_bot_expect`` whose message is the last parameter (given
        here): when the server fails it, ``error`` is raised instead, at the send
        (``sql.expect_row``)."""
        what = f"echo-bot expected #{len(self._expected)}"
        self._expected[what] = error
        self.execute(sql, [*parameters, what])

    def wake(self, kinds: Iterable[str]) -> None:
        """NOTIFY the other daemons of ``kinds`` at the COMMIT (``store/meta.notify``): one
        statement for every job of a batch. A job rolled back to its savepoint leaves its
        kinds in: a daemon woken for nothing looks and finds nothing."""
        if self._wakes is None:
            notify_now(self, kinds)
        else:
            self._wakes.update(kinds)

    def read_later(self, cursor: Any, read: Callable[[Any], None]) -> None:
        """``read(cursor)`` after the COMMIT if ``cursor`` is still held back, else now
        (``sql.read_later``)."""
        if isinstance(cursor, _Pending) and cursor.cursor is None:
            self._later.append((cursor, read))
        else:
            read(cursor)

    def _hold(self, pending: _Pending) -> Any:
        self._held.append(pending)
        if self._lazy:
            return pending
        self.send()
        return pending.cursor

    # -- the transaction -------------------------------------------------------------
    def begin(self, *, lazy: bool) -> None:
        """BEGIN; ``lazy``: what follows is held back (see the class doc). After a pause
        (``FRESH_FOR``) the BEGIN itself is sent and waited for: a connection the server
        dropped meanwhile is found there, before any work is."""
        self._lazy = False
        self._expected.clear()
        self._later.clear()
        self._wakes = set()
        if lazy and self._pipeline is not None and time.monotonic() - self._ended_at < FRESH_FOR:
            self._lazy = True
            self.execute("BEGIN")
            return
        self.execute("BEGIN")
        self._lazy = lazy and self._pipeline is not None

    def send(self) -> None:
        """Send what is held back and wait for all of it (one round trip); raise the first
        statement's error among them."""
        held = self._held
        if not held:
            return
        self._held = []
        self.round_trips += 1
        pipeline, conn = self._pipeline, self._conn
        assert pipeline is not None
        try:
            for pending in held:
                pending.send(conn)
        except BaseException as exc:
            # One could not be sent, or psycopg found an earlier one failed while sending
            # the next: what went is waited for all the same.
            with contextlib.suppress(psycopg.Error):
                self._sync(pipeline)
            self._raise_expected(exc)
            raise
        try:
            self._sync(pipeline)
        except psycopg.Error as exc:
            self._raise_expected(exc)
            raise

    def _sync(self, pipeline: psycopg.Pipeline) -> None:
        """Sync until every result sent for is in; raise the first error. psycopg raises
        a failed statement's error as soon as it reads it, possibly before the results
        after it (the Sync's too): the transaction's state is not known until they are."""
        error: psycopg.Error | None = None
        for _ in range(MAX_SYNCS):
            try:
                pipeline.sync()
            except psycopg.Error as exc:
                error = error or exc
                if self._conn.broken or self._conn.closed:
                    break
                continue
            break
        if error is not None:
            raise error

    def _raise_expected(self, exc: BaseException) -> None:
        """Raise the error an ``expect`` gave, if ``exc`` is its failing."""
        if isinstance(exc, psycopg.Error) and exc.sqlstate == EXPECT_STATE:
            expected = self._expected.get(exc.diag.message_primary or "")
            if expected is not None:
                raise expected from exc

    def end(self, sql: str) -> None:
        """COMMIT (with what is held back: one round trip) or ROLLBACK (what is held back
        is dropped unsent; nothing at all is sent if nothing was)."""
        wakes, self._wakes = self._wakes, None
        if wakes and sql == "COMMIT":  # held back with the rest, when they are
            notify_now(self, wakes)
        self._ended_at = time.monotonic()
        self._lazy = False
        later, self._later = self._later, []
        if sql == "COMMIT":
            try:
                self.execute(sql)
            finally:
                self._expected.clear()
            for pending, read in later:
                try:
                    read(pending)
                except Exception:  # committed all the same: the others are read
                    log.exception("reading a statement's result after the COMMIT failed")
            return
        self._expected.clear()
        begun_unsent, self._held = self.begun_unsent, []
        if not begun_unsent:
            self.execute(sql)

    def set_trace_callback(
        self, trace: Callable[..., object] | None, *, parameters: bool = False
    ) -> None:
        """Call ``trace(sql)`` before each statement, as ``sqlite3``'s does (bench/);
        ``parameters``: ``trace(sql, parameters, many)`` (``many``: an executemany's
        rows), for replaying the statements elsewhere."""
        self._trace, self._trace_parameters = trace, parameters

    def _traced(self, sql: str, parameters: Any, many: bool) -> None:
        assert self._trace is not None
        if self._trace_parameters:
            self._trace(sql, parameters, many)
        else:
            self._trace(sql)


class _Pending:
    """A statement held back in a lazy transaction (``PgHandle``): reading it sends it,
    with everything held back before and after it, unless it went already."""

    __slots__ = ("_handle", "cursor", "many", "parameters", "sql")

    def __init__(self, handle: PgHandle, sql: str, parameters: Any, many: bool) -> None:
        self._handle, self.sql, self.parameters, self.many = handle, sql, parameters, many
        self.cursor: psycopg.Cursor[Any] | None = None

    def send(self, conn: psycopg.Connection[Any]) -> None:
        cursor = self.cursor = conn.cursor()
        if self.many:
            cursor.executemany(_placeholders(self.sql), self.parameters)
        elif self.parameters:
            cursor.execute(_placeholders(self.sql), _without_nul(self.parameters))
        else:
            cursor.execute(self.sql)

    def _ready(self) -> psycopg.Cursor[Any]:
        if self.cursor is None:
            self._handle.send()
        assert self.cursor is not None
        return self.cursor

    @property
    def rowcount(self) -> int:
        return self._ready().rowcount

    @property
    def description(self) -> Any:
        return self._ready().description

    def fetchone(self) -> Any:
        return self._ready().fetchone()

    def fetchall(self) -> list[Any]:
        return self._ready().fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._ready())


class PgSession:
    """The store thread's connection, its transaction control for ``run_begun``."""

    __slots__ = ("conn", "handle", "read_only")
    errors = psycopg.Error

    def unavailable(self, exc: BaseException) -> bool:
        """The connection broke or the server is going away, not a statement that will
        fail again (a key too long for its index, a deadlock, a full disk). A server
        that refuses writes (25006: a standby, or a primary demoted by a failover, that
        a multi-host URL or a DNS name still points at) is away too, and its connection
        is given up (``read_only``): the next batch connects again, to the new primary."""
        state = str(getattr(exc, "sqlstate", "") or "")
        if state == _READ_ONLY:
            self.read_only = True
        return self.conn.broken or self.conn.closed or state.startswith(_GONE) or self.read_only

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.handle = conn, PgHandle(conn)
        self.read_only = False

    def close(self) -> None:
        self.handle.close()
        self.conn.close()

    def execute(self, sql: str) -> object:
        if sql in _ENDS:
            self.handle.end(sql)
            return None
        return self.handle.execute(sql)

    def alive(self) -> bool:
        if self.conn.broken:
            return False
        if self.handle.begun_unsent:  # its BEGIN goes with the first statement sent
            return True
        status = self.conn.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def clean(self) -> bool:
        # A lazy transaction's failed statement is found at the next send.
        if self.handle.begun_unsent:
            return not self.conn.broken
        return self.conn.info.transaction_status == TransactionStatus.INTRANS


_ENDS = frozenset(("COMMIT", "ROLLBACK"))


class PostgresDatabase(ThreadedEngine):
    """The PostgreSQL engine (see the module doc). Every job runs on the store thread."""

    engine = "postgres"

    def __init__(self, url: str, *, durability: str = "normal") -> None:
        super().__init__()
        self._thread_name = "echo-bot-postgres"
        self._url = url
        self._durability = durability
        self.where = describe_url(url)
        self._session: PgSession | None = None
        self._opened = False
        self._listener: threading.Thread | None = None
        self._stop_listening = threading.Event()
        # The server processes of this engine's own connections (the newest few): what
        # they notify, this process announced to its own parts at the commit already.
        self._own: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"PostgreSQL {self.where}"

    def listen(self, wake: Callable[[str], None]) -> None:
        """``wake(payload)`` (on a thread of its own) for every NOTIFY on the channel the
        daemons share but this engine's own, on a connection of its own; "*" each time
        it (re)connects."""
        if self._listener is not None:
            return
        self._listener = threading.Thread(
            target=self._listen, args=(wake,), name="echo-bot-postgres-listen", daemon=True
        )
        self._listener.start()

    def _listen(self, wake: Callable[[str], None]) -> None:
        while not self._stop_listening.is_set():
            try:
                with psycopg.connect(
                    self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                    keepalives=1, keepalives_idle=10, keepalives_interval=5,
                    keepalives_count=3, application_name="echo-bot listen",
                ) as conn:  # fmt: skip
                    conn.execute(f"LISTEN {WAKE_CHANNEL}")
                    wake("*")
                    while not self._stop_listening.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.pid not in self._own:  # another daemon's, or a command's
                                wake(note.payload)
            except psycopg.Error as exc:
                log.debug("listening for other daemons failed (%s); again in 1 s", exc)
                self._stop_listening.wait(1.0)

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        await self._submit(self._open, in_transaction=False)

    def open_sync(self, *, create: bool = True) -> None:
        """For management commands (no event loop)."""
        self._submit_sync(partial(self._open, create=create), in_transaction=False)

    def _connect(self, *, starting: bool = False) -> PgSession:
        """A new session. ``starting``: a refusal that waiting will not mend (wrong
        password, no such database or role) is a StoreError (the daemon stops with one
        line); everything else — and, once running, every refusal — StoreUnavailable
        (the work waits for the database)."""
        try:
            conn = psycopg.connect(
                self._url,
                autocommit=True,  # BEGIN and COMMIT are ours (engine.run_begun)
                connect_timeout=CONNECT_TIMEOUT,
                row_factory=_rows,
                application_name="echo-bot",
                # A network that drops packets fails a statement within about half a
                # minute instead of holding the store thread for the kernel's ~15.
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
                tcp_user_timeout=30_000,
            )
        except psycopg.ProgrammingError:  # a URL psycopg cannot read: its words may quote it
            raise StoreError(
                "the database URL is not valid (see storage.url_env): expected"
                " postgresql://user:password@host:5432/database"
            ) from None
        except psycopg.Error as exc:
            kind = StoreError if starting and _refused_for_good(exc) else StoreUnavailable
            raise kind(f"cannot reach the database {self.where}: {_reason(exc)}") from None
        except ValueError:
            raise StoreError("the database URL is not valid (see storage.url_env)") from None
        try:
            # A transaction of ours never waits on anything but this process between its
            # statements: one left open longer is a daemon frozen mid-transaction (a
            # paused VM, SIGSTOP). The server ends it, freeing the rows it locked, so the
            # daemons taking over its sessions are not stuck behind it for good.
            conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'")
            if self._durability == "full":
                conn.execute("SET synchronous_commit = on")
        except BaseException:
            conn.close()
            raise
        self._own = (*self._own[-7:], conn.info.backend_pid)
        session = PgSession(conn)
        if not starting:
            session.handle.pipeline()
        return session

    def _open(self, *, create: bool = True) -> None:
        session = self._connect(starting=True)
        try:
            session.execute("BEGIN")
            session.handle.execute("SELECT pg_advisory_xact_lock(?)", [MIGRATION_LOCK])
            if not create and not has_schema(session.handle):
                raise NoSchema(
                    f"the database {self.where} has no echo-bot schema yet;"
                    " `echo-bot run` creates it"
                )
            migrate(session.handle, only_check=not create)
            session.execute("COMMIT")
            session.handle.pipeline()
        except NoSchema:
            session.close()
            raise
        except (SchemaTooNew, SchemaBehind) as exc:
            session.close()
            raise StoreError(f"the database {self.where}: {exc}") from None
        except psycopg.Error as exc:
            session.close()
            raise StoreError(f"cannot open the database {self.where}: {_reason(exc)}") from None
        self._session, self._opened = session, True

    async def close(self) -> None:
        if self._worker is not None and not self._closed:
            await self._close_on_thread()

    def _close(self) -> None:
        self._stop_listening.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
            self._listener = None
        if self._session is not None:
            self._session.close()
            self._session = None
        self._opened = False

    # -- running work ----------------------------------------------------------------
    async def run(
        self,
        fn: Callable[[Any], T],
        *,
        slow: bool = False,
        after_commit: Callable[[T], None] | None = None,
    ) -> T:
        """Run ``fn(handle)`` in a transaction on the store thread; the result once
        committed (``slow`` changes nothing here: every job is off the loop)."""
        return await self._submit(fn, in_transaction=True, after_commit=after_commit)

    def _thread_session(self) -> Session | None:
        if not self._opened:
            return None
        session = self._session
        if session is None or session.conn.broken or session.conn.closed or session.read_only:
            # Lost (the server restarted, the network broke): connect again for this
            # batch; if that fails too, the batch fails and the next one tries again.
            if session is not None:
                session.close()
                self._session = None
            self._session = session = self._connect()
            log.warning("reconnected to the database %s", self.where)
        return session

    def _begin(self, session: Session, *, first: bool = True) -> None:
        """BEGIN, pipelined on a batch's first try (``PgHandle.begin``); when the
        connection turns out lost (the server restarted while it was idle), connect again
        and BEGIN on the new one: nothing of the batch was sent."""
        assert isinstance(session, PgSession)
        try:
            session.handle.begin(lazy=first)
        except psycopg.OperationalError:
            if not (session.conn.broken or session.conn.closed):
                raise
            fresh = self._connect()
            session.close()
            session.conn, session.handle = fresh.conn, fresh.handle
            log.warning("reconnected to the database %s", self.where)
            session.handle.begin(lazy=first)

    def _store_error(self, job: Any, exc: BaseException, session: Session | None) -> BaseException:
        if isinstance(exc, psycopg.Error) and job.wrap_errors:
            gone = session is not None and session.unavailable(exc)
            kind = StoreUnavailable if gone or isinstance(exc, StoreUnavailable) else StoreError
            error = kind(f"store error ({self.where}): {_reason(exc)}")
            error.__cause__ = exc
            return error
        return super()._store_error(job, exc, session)


# SQLSTATEs after which the same work may succeed if tried again: 08 connection
# exception, 57P0x the server shutting down or not yet accepting connections, and two
# daemons' transactions in each other's way (40001 serialisation failure, 40P01
# deadlock: the server rolled one back). Their jobs fail with StoreUnavailable, which
# the dispatcher retries from the turn's checkpoint.
_GONE = ("08", "57P01", "57P02", "57P03", "40001", "40P01")
_READ_ONLY = "25006"  # read_only_sql_transaction: a write sent to a standby

# SQLSTATEs of a refused connection that only a change of config mends.
_REFUSED_FOR_GOOD = {
    "28000",  # invalid authorization (no such role, not allowed in pg_hba.conf)
    "28P01",  # wrong password
    "3D000",  # no such database
    "42501",  # no privilege to connect
}


def _refused_for_good(exc: BaseException) -> bool:
    if getattr(exc, "sqlstate", None) in _REFUSED_FOR_GOOD:
        return True
    # At connect time psycopg may leave sqlstate unset; the server's words then.
    text = str(exc)
    return "password authentication failed" in text or (
        "does not exist" in text and ("database" in text or "role" in text)
    )


def _reason(exc: BaseException) -> str:
    """psycopg's message on one line (it may span several), with what to do about a
    full server."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if getattr(exc, "sqlstate", None) == "53300" or "too many connections" in text:
        text += (
            f" — the server's connection limit is reached; each echo-bot uses"
            f" {CONNECTIONS_PER_DAEMON}: raise max_connections (or the role's or database's"
            " CONNECTION LIMIT); a transaction pooler in front does not work yet"
            " (docs/SCALING.md)"
        )
    return text
