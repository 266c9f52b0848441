"""What both engines share: jobs, the store thread that group-commits them, and how a
batch runs inside one transaction.

An engine hands ``run_begun`` a ``Session`` — its connection's transaction control —
and the batch. The jobs of a batch run one after another with no savepoint between
them; if one raises, the transaction is rolled back and the batch runs again, each job
in a savepoint of its own, so the failing one is rolled back alone (a savepoint per
job, every time, cost 10–15 % of a turn on SQLite; PostgreSQL needs them anyway to go on
after a failed statement). So a job may run more than once before it commits and must act only
through its connection: ``Tx.on_commit`` is for what is to happen once committed.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from ..errors import StoreError, StoreUnavailable

T = TypeVar("T")

MAX_BATCH = 128  # jobs committed together at most
SAVEPOINT = "echo_bot_job"

JobDone = tuple["Job", bool, Any]  # (job, ok, result or error)

log = logging.getLogger(__name__)


class Job:
    """One piece of work for the store and where its outcome goes."""

    __slots__ = (
        "after_commit",
        "fn",
        "future",
        "handed_off",
        "in_transaction",
        "loop",
        "wrap_errors",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        in_transaction: bool,
        wrap_errors: bool,
        loop: asyncio.AbstractEventLoop | None,
        after_commit: Callable[[Any], None] | None = None,
    ) -> None:
        self.fn = fn
        self.after_commit = after_commit
        self.in_transaction = in_transaction
        self.wrap_errors = wrap_errors
        self.loop = loop
        # A loop job the loop passed to the store thread (SQLite: its write lock was taken).
        self.handed_off = False
        self.future: asyncio.Future[Any] | concurrent.futures.Future[Any] = (
            loop.create_future() if loop is not None else concurrent.futures.Future()
        )


class Session(Protocol):
    """A connection's transaction control, as ``run_begun`` needs it."""

    handle: Any  # what each job is given

    @property
    def errors(self) -> type[BaseException] | tuple[type[BaseException], ...]:
        """The driver's exception classes."""
        ...

    def unavailable(self, exc: BaseException) -> bool:
        """Whether the driver's ``exc`` means the store cannot be reached now (then a
        StoreUnavailable: the same work may succeed once it is back)."""
        ...

    def execute(self, sql: str) -> object: ...

    def alive(self) -> bool:
        """The transaction still exists (SQLite ends it itself on disk full)."""
        ...

    def clean(self) -> bool:
        """Alive, and every statement in it succeeded (PostgreSQL refuses more after a
        failed one)."""
        ...


_STOP = object()


class ThreadedEngine(abc.ABC):
    """The store thread: jobs queued from any thread or loop, run in batches, one
    transaction each, on the connection ``_thread_session`` gives."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job | object] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        self._closed = False
        self._handed_off = 0  # loop jobs the store thread has not finished yet
        self._thread_name = "echo-bot-store"
        self._away: str | None = None  # why the last batch found the store unavailable

    # -- what each engine has ------------------------------------------------------------
    engine = ""  # "sqlite" | "postgres"
    path: Path | None = None  # SQLite's file; None for a server

    def describe(self) -> str:
        """Where the store is, for people (never a password)."""
        return str(self.path)

    def health(self) -> dict[str, object]:
        """For /healthz: degraded while the last batch found the store unavailable."""
        away = self._away
        return {"status": "ok"} if away is None else {"status": "degraded", "error": away}

    @abc.abstractmethod
    async def open(self) -> None:
        """Open the store (a daemon's: on its event loop)."""

    @abc.abstractmethod
    def open_sync(self, *, create: bool = True) -> None:
        """Open the store for a management command (no event loop). ``create=False``:
        where there is no echo-bot store yet, change nothing and raise NoSchema."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish what is queued, close the connections, end the store thread."""

    def close_sync(self) -> None:
        if self._worker is None or self._closed:
            return
        try:
            self._submit_sync(self._close, in_transaction=False)
        finally:
            self._stop_worker()
        if self._worker is not None:
            self._worker.join()

    async def _close_on_thread(self) -> None:
        """Run ``_close`` on the store thread (after every job queued before it), then
        end the thread."""
        try:
            await self._submit(self._close, in_transaction=False)
        finally:
            self._stop_worker()
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join)

    @abc.abstractmethod
    def _close(self) -> None:
        """Close the connections, on the store thread."""

    @abc.abstractmethod
    async def run(
        self,
        fn: Callable[[Any], T],
        *,
        slow: bool = False,
        after_commit: Callable[[T], None] | None = None,
    ) -> T:
        """``fn(handle)`` in a transaction; its result once committed."""

    # -- for the engines -------------------------------------------------------------
    @abc.abstractmethod
    def _thread_session(self) -> Session | None:
        """The store thread's session, None when there is none (not open)."""

    def _begin(self, session: Session, *, first: bool = True) -> None:
        """BEGIN. ``first``: the batch's first try (PostgreSQL pipelines it)."""
        session.execute("BEGIN")

    def _store_error(self, job: Job, exc: BaseException, session: Session | None) -> BaseException:
        return store_error(job, exc, session)

    # -- running work ----------------------------------------------------------------
    def run_sync(self, fn: Callable[[Any], T]) -> T:
        """``run`` for management commands without an event loop (driver errors as is).

        Refused on a thread that runs an event loop: it would block the loop (and, on
        SQLite, wait for the whole busy timeout when called inside a loop job that holds
        the write lock)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._submit_sync(fn, in_transaction=True, wrap_errors=False)
        raise StoreError("run_sync called on an event loop's thread: await run() instead")

    async def _submit(
        self,
        fn: Callable[..., T],
        *,
        in_transaction: bool,
        after_commit: Callable[[T], None] | None = None,
    ) -> T:
        job = Job(
            fn,
            in_transaction=in_transaction,
            wrap_errors=True,
            loop=asyncio.get_running_loop(),
            after_commit=after_commit,
        )
        self._enqueue(job)
        return cast(T, await cast("asyncio.Future[Any]", job.future))

    def _submit_sync(
        self, fn: Callable[..., T], *, in_transaction: bool, wrap_errors: bool = True
    ) -> T:
        job = Job(fn, in_transaction=in_transaction, wrap_errors=wrap_errors, loop=None)
        self._enqueue(job)
        return cast(T, job.future.result())

    def _enqueue(self, job: Job) -> None:
        with self._worker_lock:
            if self._closed:
                raise StoreError("the store is closed")
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._serve, name=self._thread_name, daemon=True
                )
                self._worker.start()
            self._jobs.put(job)

    def _stop_worker(self) -> None:
        with self._worker_lock:
            self._closed = True
            self._jobs.put(_STOP)

    def _serve(self) -> None:
        held: Job | object | None = None
        while True:
            job = held if held is not None else self._jobs.get()
            held = None
            if job is _STOP:
                return
            assert isinstance(job, Job)
            if not job.in_transaction:
                self._deliver([(job, *_call(job.fn))])
                continue
            batch = [job]
            while len(batch) < MAX_BATCH:
                try:
                    following = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if following is _STOP or not cast(Job, following).in_transaction:
                    held = following
                    break
                batch.append(following)  # type: ignore[arg-type]
            try:
                outcomes = self._run_batch(batch)
            except BaseException as exc:  # nothing may leave a caller waiting forever
                outcomes = [(j, False, exc) for j in batch]
            self._note_away(outcomes)
            try:
                self._deliver(outcomes)
            except BaseException:  # the store thread must go on serving
                log.exception("handing store results back failed")

    def _note_away(self, outcomes: list[JobDone]) -> None:
        """/healthz's word on the store: away while a batch finds it so, back at the
        next batch of which a job went through."""
        away = next((v for _j, ok, v in outcomes if isinstance(v, StoreUnavailable)), None)
        if away is not None:
            self._away = str(away)
        elif any(ok for _j, ok, _v in outcomes):
            self._away = None

    def _run_batch(self, batch: list[Job]) -> list[JobDone]:
        """Run the jobs in one transaction on the store thread's connection."""
        # A cancelled caller's job is not run (its outcome only settles the count).
        live: list[Job] = []
        dropped: list[JobDone] = []
        for job in batch:
            if job.future.cancelled():
                dropped.append((job, False, None))
            else:
                live.append(job)
        if not live:
            return dropped
        for together in (True, False):
            try:
                session = self._thread_session()
            except Exception as exc:  # PostgreSQL: the connection was lost, and still is
                return dropped + [(job, False, self._store_error(job, exc, None)) for job in live]
            if session is None:
                refused = StoreError("the store is not open")
                return dropped + [(job, False, refused) for job in live]
            try:
                self._begin(session, first=together)
            except Exception as exc:
                failed = [(job, False, self._store_error(job, exc, session)) for job in live]
                return dropped + failed
            # BEGIN may have waited for a lock (SQLite: up to the busy timeout): a caller
            # that gave up meanwhile is not run either.
            dropped += [(job, False, None) for job in live if job.future.cancelled()]
            live = [job for job in live if not job.future.cancelled()]
            if not live:
                session.execute("ROLLBACK")
                return dropped
            outcomes = run_begun(session, live, together=together and len(live) > 1)
            if outcomes is not None:
                return dropped + outcomes
        raise AssertionError("the second pass always has outcomes")

    def _deliver(self, outcomes: list[JobDone]) -> None:
        """Hand each job its outcome: one wake-up per event loop for the whole batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[JobDone]] = {}
        for outcome in outcomes:
            job = outcome[0]
            if job.loop is None:
                settle(outcome)
            else:
                by_loop.setdefault(job.loop, []).append(outcome)
        for loop, some in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                loop.call_soon_threadsafe(self._settle_all, some)

    def _settle_all(self, outcomes: list[JobDone]) -> None:
        """On the jobs' loop, after the COMMIT: run each committed job's
        ``after_commit``, then set each future, in the order the jobs ran. Every
        outcome is settled whatever a hook raises (a BaseException is raised again
        once all are)."""
        raised: BaseException | None = None
        for job, ok, value in outcomes:
            if ok and job.after_commit is not None:
                try:
                    job.after_commit(value)
                except Exception:  # committed all the same
                    log.exception("a store job's after-commit hook failed")
                except BaseException as exc:
                    raised = raised or exc
        for outcome in outcomes:
            if outcome[0].handed_off:
                outcome[0].handed_off = False
                self._handed_off -= 1
            try:
                settle(outcome)
            except Exception:  # one bad outcome must not leave the others waiting
                log.exception("handing a store result back failed")
                if not outcome[0].future.done():
                    outcome[0].future.set_exception(StoreError("store error: no result"))
        if raised is not None:
            raise raised


def run_begun(session: Session, batch: list[Job], *, together: bool) -> list[JobDone] | None:
    """Run the jobs in the transaction just begun, then COMMIT; an outcome for each.

    ``together``: one after another with nothing between them, betting that none
    fails. If one raises, the transaction is rolled back and None returned: the caller
    begins again and runs the batch with ``together=False``, each job in a savepoint of
    its own, so the failing one is rolled back alone. (A savepoint per job cost 10–15 %
    of a turn's CPU on SQLite: it copies every page a job first touches into its
    sub-journal.) So a job may run more than once before it commits (up to four times:
    a loop batch that fails, then finds the write lock taken, runs again on the store
    thread): it must act only through its connection — see ``Tx.on_commit`` for what is
    to happen once committed."""
    alone = len(batch) == 1 or together
    outcomes: list[JobDone] = []
    culprit: Job | None = None
    try:
        for job in batch:
            culprit = job
            done = _run_job(session, job, alone=alone, together=together)
            if done is None:
                return None
            outcomes.append(done)
        culprit = None
        if session.alive():  # not when a lone job failed and was rolled back
            session.execute("COMMIT")
    except Exception as exc:
        if culprit is None and together and not session.unavailable(exc):
            # Pipelined (PostgreSQL), a failed statement is found at the COMMIT, whose
            # job is not known: the batch runs again, each job in a savepoint.
            _roll_back(session)
            return None
        return _rolled_back(session, batch, culprit, exc)
    except BaseException as exc:
        return _rolled_back(session, batch, culprit, exc)
    return outcomes


def _run_job(session: Session, job: Job, *, alone: bool, together: bool) -> JobDone | None:
    """One job of ``run_begun``'s batch (in a savepoint of its own unless ``alone``): its
    outcome; None when it failed in a ``together`` batch, whose transaction is then
    rolled back. What it raises loses the whole transaction."""
    execute = session.execute
    if not alone:
        execute(f"SAVEPOINT {SAVEPOINT}")
    try:
        value = job.fn(session.handle)
        if not session.clean():
            _unclean(session)
    except Exception as exc:
        if not session.alive():  # the engine rolled all of it back
            raise
        if together:
            execute("ROLLBACK")
            return None
        execute("ROLLBACK" if alone else f"ROLLBACK TO {SAVEPOINT}")
        if not alone:
            execute(f"RELEASE {SAVEPOINT}")
        return (job, False, store_error(job, exc, session))
    if not alone:
        execute(f"RELEASE {SAVEPOINT}")
    return (job, True, value)


def _unclean(session: Session) -> None:
    """A job returned, but its transaction is not as it should be: raise why."""
    if not session.alive():
        # The job caught an error after which the engine rolled the transaction back:
        # what the batch did before is gone.
        raise StoreError("store error: the transaction was rolled back")
    # PostgreSQL: one of its statements failed and the job went on.
    raise StoreError("store error: a statement of this job failed")


def _rolled_back(
    session: Session, batch: list[Job], culprit: Job | None, exc: BaseException
) -> list[JobDone]:
    """The transaction is lost (or would not commit, or a job raised something that is
    not an error): nothing of the batch is stored. The job that raised (``culprit``)
    gets its error; the others are told their work was rolled back with it."""
    _roll_back(session)
    error = store_error(culprit or batch[0], exc, session)
    kind = StoreUnavailable if isinstance(error, StoreUnavailable) else StoreError
    rolled_back = kind(f"store error: rolled back with another job ({exc!r})")
    return [
        (job, False, error if job is culprit or culprit is None else rolled_back) for job in batch
    ]


def _roll_back(session: Session) -> None:
    if session.alive():
        try:
            session.execute("ROLLBACK")
        except Exception:  # the connection broke too: the server rolls it back
            log.debug("ROLLBACK after a failed batch failed", exc_info=True)


def _call(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except BaseException as exc:
        return False, exc


def store_error(job: Job, exc: BaseException, session: Session | None) -> BaseException:
    """The driver's errors as StoreError — StoreUnavailable for those that mean the
    store is away — unless the job asked for them as they are."""
    if job.wrap_errors and session is not None and isinstance(exc, session.errors):
        kind = StoreUnavailable if session.unavailable(exc) else StoreError
        error = kind(f"store error: {' '.join(str(exc).split()) or type(exc).__name__}")
        error.__cause__ = exc
        return error
    return exc


def settle(outcome: JobDone) -> None:
    job, ok, value = outcome
    future = job.future
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    elif isinstance(value, StopIteration):  # a future refuses StopIteration
        error = RuntimeError(f"store job raised {value!r}")
        error.__cause__ = value
        future.set_exception(error)
    else:
        future.set_exception(value)
