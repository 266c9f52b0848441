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

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache, partial
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ..errors import NoSchema, StoreError, StoreUnavailable
from .engine import Session, ThreadedEngine
from .meta import WAKE_CHANNEL
from .schema import SchemaTooNew, has_schema, migrate
from .sql import POSTGRES, describe_url

CONNECT_TIMEOUT = 5  # seconds
CONNECTIONS_PER_DAEMON = 2  # the store thread's, and the LISTEN thread's
IDLE_IN_TRANSACTION = "5s"  # the longest a transaction of ours may sit idle (see _connect)
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
    index = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: Row(values, index)


@lru_cache(maxsize=2048)
def _placeholders(sql: str) -> str:
    """The store's ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


# PostgreSQL's text refuses U+0000, and its JSON types the escape \u0000 (SQLite takes
# both): a NUL a user or a model sent is stored as U+FFFD, in plain text and in JSON.
_JSON_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _without_nul(parameters: Sequence[Any]) -> Sequence[Any]:
    if not any(isinstance(p, str) and ("\x00" in p or "\\u0000" in p) for p in parameters):
        return parameters
    return [_nul_free(p) if isinstance(p, str) else p for p in parameters]


def _nul_free(text: str) -> str:
    text = text.replace("\x00", "\ufffd")
    return _JSON_NUL.sub(lambda m: m.group(1) + "\\ufffd", text) if "\\u0000" in text else text


class PgHandle:
    """What a job is given on PostgreSQL: ``sql.SqlDb``'s ``execute`` and ``conn``."""

    __slots__ = ("_conn", "_trace", "_trace_parameters")
    dialect = POSTGRES

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._trace: Callable[..., object] | None = None
        self._trace_parameters = False

    @property
    def conn(self) -> PgHandle:
        return self

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        if self._trace is not None:
            self._traced(sql, parameters, False)
        if not parameters:
            return self._conn.execute(sql)
        return self._conn.execute(_placeholders(sql), _without_nul(parameters))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]]) -> Any:
        rows = [_without_nul(p) for p in parameters]
        if self._trace is not None:
            self._traced(sql, rows, True)
        cursor = self._conn.cursor()
        cursor.executemany(_placeholders(sql), rows)
        return cursor

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


class PgSession:
    """The store thread's connection, its transaction control for ``run_begun``."""

    __slots__ = ("conn", "handle")
    errors = psycopg.Error

    def unavailable(self, exc: BaseException) -> bool:
        """The connection broke or the server is going away, not a statement that will
        fail again (a key too long for its index, a deadlock, a full disk)."""
        return (
            self.conn.broken
            or self.conn.closed
            or str(getattr(exc, "sqlstate", "") or "").startswith(_GONE)
        )

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.handle = conn, PgHandle(conn)

    def execute(self, sql: str) -> object:
        return self.handle.execute(sql)

    def alive(self) -> bool:
        status = self.conn.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def clean(self) -> bool:
        return self.conn.info.transaction_status == TransactionStatus.INTRANS


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
        return PgSession(conn)

    def _open(self, *, create: bool = True) -> None:
        session = self._connect(starting=True)
        try:
            session.execute("BEGIN")
            session.conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
            if not create and not has_schema(session.handle):
                raise NoSchema(
                    f"the database {self.where} has no echo-bot schema yet;"
                    " `echo-bot run` creates it"
                )
            migrate(session.handle)
            session.execute("COMMIT")
        except NoSchema:
            session.conn.close()
            raise
        except SchemaTooNew as exc:
            session.conn.close()
            raise StoreError(f"the database {self.where}: {exc}") from None
        except psycopg.Error as exc:
            session.conn.close()
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
            self._session.conn.close()
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
        if session is None or session.conn.broken or session.conn.closed:
            # Lost (the server restarted, the network broke): connect again for this
            # batch; if that fails too, the batch fails and the next one tries again.
            if session is not None:
                session.conn.close()
                self._session = None
            self._session = session = self._connect()
            log.warning("reconnected to the database %s", self.where)
        return session

    def _begin(self, session: Session) -> None:
        """BEGIN; when the connection turns out lost (the server restarted while it was
        idle), connect again and BEGIN on the new one: nothing of the batch was sent."""
        assert isinstance(session, PgSession)
        try:
            session.execute("BEGIN")
        except psycopg.OperationalError:
            if not (session.conn.broken or session.conn.closed):
                raise
            fresh = self._connect()
            session.conn.close()
            session.conn, session.handle = fresh.conn, fresh.handle
            log.warning("reconnected to the database %s", self.where)
            session.execute("BEGIN")

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
            " CONNECTION LIMIT), or put a pooler in front"
        )
    return text
