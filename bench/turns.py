"""Turns through the whole core, beside a bare asyncio.Queue round trip.

In one process (pinned to one CPU by default), the real core runs as ``echo-bot run``
builds it — bus → inbox (SQLite) → dispatcher → agent with the rules brain → the tool
``current_time`` → outbox → delivery worker — with a no-op channel in place of a chat.
N sessions each send "what time is it?" and wait for the reply before sending the next
(a closed loop); one case with 1 session (latency), one with 16 (throughput). Beside
each, the floor: N senders doing a round trip through a bare ``asyncio.Queue`` and one
worker task, measured in the same run.

Prints turns/s and per-turn latency (publish → the reply reaching the channel) p50/p99
for both, and the overhead of a turn over the floor.

    python bench/turns.py               # 1 and 16 sessions, 10 s each after 2 s of warm-up
    python bench/turns.py --quick       # about 3 s
    python bench/turns.py --profile     # also print where the time goes (cProfile)

Last, an untimed run of one session with the store's statement trace on counts the SQL
statements and transactions (COMMITs) per turn, and lists them by kind.

    python bench/turns.py --reference   # also the store's floor for each case

``--reference`` adds, per session count, a row for the store's floor of this turn shape
(``bench/store_floor.py``): an untimed run of the same case with every statement traced,
then the same statements, in the same transactions, replayed by a bare ``sqlite3``
loop (a bare psycopg loop with ``--engine postgres``) in a fresh store. echo-bot's
turns/s over it is the ratio issue 49's targets are read off (a ratio holds from one
machine to another; a rate does not), with the statements and round trips per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.lean_turn import LeanCore  # noqa: E402
from bench.store_floor import (  # noqa: E402
    Floor,
    Trace,
    fresh_postgres_store,
    fresh_sqlite_store,
    postgres_floor,
    ratio,
    sent_by_the_store,
    sqlite_floor,
)
from echo_bot.app import Daemon  # noqa: E402
from echo_bot.bus import Capabilities  # noqa: E402
from echo_bot.config import LoadedConfig, parse_config  # noqa: E402
from echo_bot.events import (  # noqa: E402
    Address,
    MessageInbound,
    OutboundMessage,
    Receipt,
    Sender,
    new_id,
)
from echo_bot.runtime import build  # noqa: E402
from tests.postgres import drop_database  # noqa: E402

CHANNEL = "bench"
TEXT = "what time is it?"
TURN_TIMEOUT = 30.0  # one turn, at most
# What `bash .ci/postgres` sets up (and the tests use by default).
DEFAULT_POSTGRES = "postgresql://echo_bot_test:echo_bot_test@127.0.0.1:5432/postgres"


def config_text(sessions: int) -> str:
    return f"""
[bot]
max_concurrent_turns = {max(8, min(sessions, 1000))}
shutdown_timeout = "2s"

[brain]
kind = "rules"
"""


class NoopChannel:
    """Takes every reply at once; wakes the session waiting for it."""

    name = CHANNEL
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[OutboundMessage]] = {}
        self.sent = 0

    async def start(self, bus: object) -> None:
        pass

    async def stop(self) -> None:
        pass

    def health(self) -> dict[str, object]:
        return {"status": "ok"}

    async def send(self, message: OutboundMessage) -> Receipt:
        self.sent += 1
        future = self.waiting.pop(str(message.metadata.get("inbound_id", "")), None)
        if future is not None and not future.done():
            future.set_result(message)
        return Receipt(channel_message_id=str(self.sent))


@dataclass
class Result:
    turns: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    wrong: int = 0  # replies that are not the time
    timeouts: int = 0
    cpu: float = 0.0  # this process's CPU seconds (all threads) in the measured window

    @property
    def cpu_per_turn(self) -> float:
        """CPU ms per turn: steadier than turns/s on a machine others use too."""
        return self.cpu / self.turns * 1000 if self.turns else 0.0

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(p * len(data)))] * 1000 if data else 0.0


async def closed_loop(
    sessions: int,
    warmup: float,
    seconds: float,
    one_turn: object,
) -> Result:
    """``sessions`` senders, each doing turn after turn; only turns that start after the
    warm-up and end before the deadline count."""
    result = Result()
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup
    deadline = start + seconds

    async def sender(number: int) -> None:
        while loop.time() < deadline:
            began = time.perf_counter()
            began_loop = loop.time()
            try:
                ok = await one_turn(number)  # type: ignore[operator]
            except TimeoutError:
                result.timeouts += 1
                return
            ended = loop.time()
            if began_loop >= start and ended <= deadline:
                result.turns += 1
                result.latencies.append(time.perf_counter() - began)
                result.wrong += 0 if ok else 1

    async def cpu_clock() -> None:
        await asyncio.sleep(max(0.0, start - loop.time()))
        began = time.process_time()
        await asyncio.sleep(max(0.0, deadline - loop.time()))
        result.cpu = time.process_time() - began

    await asyncio.gather(cpu_clock(), *(sender(n) for n in range(sessions)))
    result.seconds = seconds
    return result


async def queue_floor(sessions: int, warmup: float, seconds: float) -> Result:
    """The floor: a round trip through a bare asyncio.Queue and one worker task."""
    requests: asyncio.Queue[tuple[asyncio.Queue[str], str]] = asyncio.Queue()

    async def worker() -> None:
        while True:
            reply_to, text = await requests.get()
            reply_to.put_nowait(text)

    replies = [asyncio.Queue[str]() for _ in range(sessions)]

    async def one_turn(number: int) -> bool:
        requests.put_nowait((replies[number], TEXT))
        return await replies[number].get() == TEXT

    task = asyncio.create_task(worker())
    try:
        return await closed_loop(sessions, warmup, seconds, one_turn)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass
class Target:
    """Which engine the core runs on: SQLite in each case's state dir, or a fresh
    PostgreSQL database per case made through ``admin_url`` (a role that may create
    databases)."""

    engine: str = "sqlite"
    admin_url: str | None = None
    made: list[str] = field(default_factory=list)

    def environ(self, state_dir: Path) -> dict[str, str]:
        if self.engine == "sqlite":
            return {}
        import psycopg

        assert self.admin_url is not None
        name = f"echo_bot_bench_{state_dir.name.replace('-', '_')}_{os.getpid()}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        url = urlunsplit(urlsplit(self.admin_url)._replace(path=f"/{name}"))
        return {"ECHO_BOT_DATABASE_URL": url}

    def counts(self, state_dir: Path, environ: dict[str, str]) -> dict[str, int]:
        queries = {
            "inbox": "SELECT COUNT(*) FROM inbox",
            "done": "SELECT COUNT(*) FROM inbox WHERE status = 'done'",
            "tool_calls": "SELECT COUNT(*) FROM tool_calls WHERE name = 'current_time'",
            "outbox_sent": "SELECT COUNT(*) FROM outbox WHERE status = 'sent'",
        }
        if self.engine == "sqlite":
            with contextlib.closing(sqlite3.connect(state_dir / "echo-bot.sqlite3")) as conn:
                return {k: conn.execute(q).fetchone()[0] for k, q in queries.items()}
        import psycopg

        with psycopg.connect(environ["ECHO_BOT_DATABASE_URL"]) as pg:
            return {k: pg.execute(q).fetchone()[0] for k, q in queries.items()}  # type: ignore[index]

    def cleanup(self) -> None:
        if not self.made:
            return

        for name in self.made:
            drop_database(self.admin_url or "", name)


TARGET = Target()


@contextlib.asynccontextmanager
async def running_core(
    sessions: int,
    state_dir: Path,
    statements: list[str] | None = None,
    trace: Trace | None = None,
) -> AsyncIterator[Callable[[int], Awaitable[bool]]]:
    """The daemon as ``echo-bot run`` builds it, and one turn of session N as a function.
    ``statements``: collect every SQL statement its store runs (traced); ``trace``: the
    same with their values, to replay them (``store_floor``)."""
    text = config_text(sessions) + f'\n[storage]\nengine = "{TARGET.engine}"\n'
    config = parse_config(tomllib.loads(text), "bench/turns.py")
    environ = TARGET.environ(state_dir)
    runtime = build(LoadedConfig(config=config, path=None), state_dir, environ)
    channel = NoopChannel()
    daemon = Daemon(
        runtime,
        channel_names=[],
        banner=False,
        extra_channels=[channel],
        freeze_heap=True,
    )
    run = asyncio.create_task(daemon.run())
    RUNNING.append(runtime.store.database)
    profile_store_thread(runtime.store.database)
    try:
        async with asyncio.timeout(30):
            bus = await daemon.wait_started()
        loop = asyncio.get_running_loop()
        if statements is not None or trace is not None:
            # On the connection that runs this job: the one the daemon's short
            # transactions use.
            await runtime.store.database.run(lambda db: set_trace(db.conn, statements, trace))
            if trace is not None:
                trace.instance = runtime.membership.name

        async def one_turn(number: int) -> bool:
            inbound = MessageInbound(
                address=Address(channel=CHANNEL, chat_id=f"s{number}"),
                sender=Sender(id=f"user{number}", name=f"user {number}"),
                text=TEXT,
                external_id=new_id(),
            )
            future: asyncio.Future[OutboundMessage] = loop.create_future()
            channel.waiting[inbound.id] = future
            await bus.publish(inbound)
            async with asyncio.timeout(TURN_TIMEOUT):
                reply = await future
            return reply.text.startswith("It is")

        yield one_turn
    finally:
        RUNNING.remove(runtime.store.database)
        daemon.request_stop()
        await asyncio.wait_for(run, 30)
        LAST_COUNTS[state_dir] = TARGET.counts(state_dir, environ)


LAST_COUNTS: dict[Path, dict[str, int]] = {}  # what each case's store held at its end
RUNNING: list[Any] = []  # the store engine of the core running now


def running_database() -> Any:
    return RUNNING[-1]


def set_trace(conn: Any, statements: list[str] | None, trace: Trace | None) -> None:
    if trace is None:
        conn.set_trace_callback(statements.append if statements is not None else None)
    elif TARGET.engine == "sqlite":
        conn.set_trace_callback(trace.sqlite)
    else:
        conn.set_trace_callback(trace.postgres, parameters=True)


async def floor_case(sessions: int, seconds: float, state_dir: Path) -> Floor:
    """The store's floor for this case's turn shape (``store_floor``): a run of
    ``seconds`` with every statement traced from the daemon's start, then the same
    statements replayed by a bare driver loop in a fresh store."""
    trace = Trace()
    async with running_core(sessions, state_dir, trace=trace) as one_turn:

        async def counted(number: int) -> bool:
            ok = await one_turn(number)
            trace.turns += 1
            return ok

        await closed_loop(sessions, 0.0, seconds, counted)
        await asyncio.sleep(0.2)  # the last replies' receipts
    replay = state_dir.parent / f"{state_dir.name}-floor"
    replay.mkdir()
    if TARGET.engine == "sqlite":
        path = replay / "echo-bot.sqlite3"
        await asyncio.to_thread(fresh_sqlite_store, path)
        return await asyncio.to_thread(sqlite_floor, trace, path)
    url = TARGET.environ(replay)["ECHO_BOT_DATABASE_URL"]
    await asyncio.to_thread(fresh_postgres_store, url)
    floor = await asyncio.to_thread(postgres_floor, trace, url)
    # And the fewest round trips the same statements can take: one per transaction.
    again = state_dir.parent / f"{state_dir.name}-pipelined"
    again.mkdir()
    url = TARGET.environ(again)["ECHO_BOT_DATABASE_URL"]
    await asyncio.to_thread(fresh_postgres_store, url)
    PIPELINED[sessions] = await asyncio.to_thread(postgres_floor, trace, url, pipelined=True)
    return floor


PIPELINED: dict[int, Floor] = {}  # PostgreSQL: each case's floor, a transaction a round trip
LEAN: dict[int, Result] = {}  # SQLite: each case's lean turn (bench/lean_turn.py)


async def lean_case(sessions: int, warmup: float, seconds: float, state_dir: Path) -> Result:
    """The same turn with the least Python around the same statements (a reference)."""
    path = state_dir / "echo-bot.sqlite3"
    await asyncio.to_thread(fresh_sqlite_store, path)
    core = LeanCore(path)
    try:

        async def one_turn(number: int) -> bool:
            answer = await core.turn(f"s{number}", f"user{number}", TEXT)
            return answer.startswith("It is")

        return await closed_loop(sessions, warmup, seconds, one_turn)
    finally:
        core.close()


async def core_case(
    sessions: int, warmup: float, seconds: float, state_dir: Path, profile: cProfile.Profile | None
) -> tuple[Result, dict[str, int]]:
    async with running_core(sessions, state_dir) as one_turn:
        if profile is not None:
            profile.enable()
            STORE_PROFILING.append(True)
        try:
            result = await closed_loop(sessions, warmup, seconds, one_turn)
        finally:
            if profile is not None:
                profile.disable()
                STORE_PROFILING.clear()
    return result, LAST_COUNTS[state_dir]


# --profile: the store thread's batches, profiled apart (cProfile sees one thread; on
# PostgreSQL every statement runs on the store thread, the loop only waits for it).
STORE_PROFILE = cProfile.Profile()
STORE_PROFILING: list[bool] = []


def profile_store_thread(engine: Any) -> None:
    run_batch = engine._run_batch

    def profiled(batch: Any) -> Any:
        if STORE_PROFILING:
            return STORE_PROFILE.runcall(run_batch, batch)
        return run_batch(batch)

    engine._run_batch = profiled


async def count_statements(state_dir: Path, turns: int) -> tuple[list[str], int | None]:
    """The SQL statements of ``turns`` turns of one session, after a few untraced ones
    (a session's first turn reads its history from the store, later ones do not), and
    on PostgreSQL the round trips they took: the times the store's connection waited
    for the server (``PgHandle.round_trips``; None on SQLite, which has no server)."""
    statements: list[str] = []
    async with running_core(1, state_dir, statements) as one_turn:
        database = running_database()
        for _ in range(5):
            await one_turn(0)
        statements.clear()
        before = await database.run(round_trips)
        for _ in range(turns):
            await one_turn(0)
        await asyncio.sleep(0.2)  # the last reply's receipt
        after = await database.run(round_trips)
    if before is None or after is None:
        return statements, None
    # The statements of the second read are not in ``statements``; their round trip is
    # not in ``after`` either (it is counted once they are sent).
    return statements, after - before


def round_trips(db: Any) -> int | None:
    return getattr(db, "round_trips", None)


def statement_kind(sql: str) -> str:
    """A statement with its values replaced, cut to its first 80 characters."""
    sql = re.sub(r"'[^']*'", "?", " ".join(sql.split()))
    return re.sub(r"\b\d+(\.\d+)?\b", "N", sql)[:80]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pin_to_one_cpu() -> str:
    """Run this process (and the store thread it starts) on one CPU."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity)"
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    return f"pinned to CPU {cpus[-1]} of {len(cpus)}"


async def amain(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="echo-bot-turns-"))
    profile = cProfile.Profile() if args.profile else None
    measured: list[tuple[int, Result, Result, dict[str, int]]] = []
    floors: dict[int, Floor] = {}
    try:
        for n, sessions in enumerate(args.sessions):
            floor = await queue_floor(sessions, args.warmup, args.duration)
            state = workdir / f"state-{n}"
            state.mkdir()
            # cProfile the largest case only (it is the throughput one).
            prof = profile if sessions == max(args.sessions) else None
            core, counts = await core_case(sessions, args.warmup, args.duration, state, prof)
            measured.append((sessions, floor, core, counts))
            if args.reference:
                traced_state = workdir / f"state-{n}-traced"
                traced_state.mkdir()
                floors[sessions] = await floor_case(sessions, args.duration, traced_state)
                if TARGET.engine == "sqlite":
                    lean_state = workdir / f"state-{n}-lean"
                    lean_state.mkdir()
                    LEAN[sessions] = await lean_case(
                        sessions, args.warmup, args.duration, lean_state
                    )
        traced_turns = 200
        traced = workdir / "state-traced"
        traced.mkdir()
        statements, trips = await count_statements(traced, traced_turns)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        TARGET.cleanup()

    rows = []
    for sessions, floor, core, _counts in measured:
        for label, r in (
            ("bare asyncio.Queue round trip (floor)", floor),
            ("echo-bot turn (bus → inbox → rules brain → current_time → outbox → channel)", core),
        ):
            rows.append(
                [
                    str(sessions),
                    label,
                    f"{r.turns:,}",
                    f"{r.rate:,.0f}",
                    f"{r.pct(0.50):.3f}",
                    f"{r.pct(0.99):.3f}",
                ]
            )
        overhead = core.pct(0.50) - floor.pct(0.50)
        rows.append([str(sessions), "**echo-bot − floor**", "", "", f"**{overhead:.3f}**", ""])
        store = floors.get(sessions)
        if store is not None:
            driver = "bare sqlite3" if TARGET.engine == "sqlite" else "bare psycopg"
            rows.append(
                [
                    str(sessions),
                    f"store floor: the same statements, {driver} (mean ms per turn)",
                    f"{store.turns:,}",
                    f"{store.rate:,.0f}",
                    f"{store.per_turn_ms:.3f}",
                    "",
                ]
            )
            rows.append(
                [
                    str(sessions),
                    "**echo-bot ÷ store floor** (turns/s; p50 overhead ÷ floor ms per turn)",
                    "",
                    f"**{ratio(core.rate, store.rate)}**",
                    f"**{ratio(overhead, store.per_turn_ms)}**",
                    "",
                ]
            )
        lean = LEAN.get(sessions)
        if lean is not None and store is not None:
            rows.append(
                [
                    str(sessions),
                    "lean turn: the same statements, the least Python (bench/lean_turn.py)",
                    f"{lean.turns:,}",
                    f"{lean.rate:,.0f}",
                    f"{lean.pct(0.50):.3f}",
                    f"{lean.pct(0.99):.3f}",
                ]
            )
            rows.append(
                [
                    str(sessions),
                    "lean turn ÷ store floor; echo-bot ÷ lean turn (turns/s)",
                    "",
                    f"{ratio(lean.rate, store.rate)}; {ratio(core.rate, lean.rate)}",
                    "",
                    "",
                ]
            )
        piped = PIPELINED.get(sessions)
        if piped is not None:
            rows.append(
                [
                    str(sessions),
                    "store floor, pipelined: a transaction a round trip (mean ms per turn)",
                    f"{piped.turns:,}",
                    f"{piped.rate:,.0f}",
                    f"{piped.per_turn_ms:.3f}",
                    "",
                ]
            )
            rows.append(
                [
                    str(sessions),
                    "echo-bot ÷ pipelined store floor (turns/s)",
                    "",
                    ratio(core.rate, piped.rate),
                    "",
                    "",
                ]
            )
    print(
        f"turns: {', '.join(str(s) for s in args.sessions)} concurrent session(s), "
        f"{args.duration:g} s measured after {args.warmup:g} s warm-up per case, {args.cpu}, "
        f"store: {TARGET.engine}\n"
    )
    print(table(["sessions", "case", "turns", "turns/s", "p50 ms", "p99 ms"], rows))
    print()
    # Only what the store sent: not what SQLite runs on its own, nor a statement
    # reported again as its triggers start (``store_floor.sent_by_the_store``). On
    # PostgreSQL the trace is the store's own, each statement once, with "?" for its
    # values: two alike in a row are two statements, not one reported twice.
    if TARGET.engine == "sqlite":
        sent: list[str] = []
        for sql in statements:
            if sent_by_the_store(sql, sent[-1] if sent else ""):
                sent.append(sql)
        statements = sent
    kinds = Counter(statement_kind(sql) for sql in statements)
    per_turn_statements = len(statements) / traced_turns
    single = min(measured, key=lambda m: m[0])
    overhead = single[2].pct(0.50) - single[1].pct(0.50)
    if floors:
        widest = max(measured, key=lambda m: m[0])
        wide_floor = floors[widest[0]]
        share = widest[2].rate / wide_floor.rate if wide_floor.rate else 0.0
        most = 25 if TARGET.engine == "sqlite" else 30
        print(
            f"Issue 49's targets on {TARGET.engine}: {widest[0]} sessions ≥ 0.5× the store"
            f" floor — {'met' if share >= 0.5 else 'MISSED'} ({share:.2f}×); statements per"
            f" turn ≤ {most} — {'met' if per_turn_statements <= most else 'MISSED'}"
            f" ({per_turn_statements:.1f})."
        )
        for sessions, store in sorted(floors.items()):
            print(
                f"- store floor, {sessions} session(s): {store.statements:,} statements in "
                f"{store.transactions:,} transactions replayed in {store.seconds:.2f} s; the "
                f"replayed store holds {store.done:,} inbound done ({store.turns:,} turns "
                "traced)"
            )
    else:
        print(
            f"p50 overhead over the asyncio.Queue floor: {overhead:.2f} ms with {single[0]} "
            "session(s) (with more sessions the latency is mostly waiting in line: "
            "sessions ÷ turns/s); --reference prints the store's floor and the targets."
        )
    for sessions, _floor, core, counts in measured:
        per_turn = 1000 / core.rate if core.rate else 0.0
        print(
            f"- {sessions} session(s): the store after the run (warm-up included) holds "
            f"{counts['inbox']} inbound, {counts['done']} done, {counts['tool_calls']} "
            f"current_time calls, {counts['outbox_sent']} replies sent; replies that were not "
            f"the time: {core.wrong}; turns over {TURN_TIMEOUT:g} s: {core.timeouts}; "
            f"{per_turn:.2f} ms of the core per turn; {core.cpu_per_turn:.3f} ms of CPU per "
            f"turn (this process, all threads: steadier than turns/s when others share "
            f"the CPU)"
        )
    commits = kinds.get("COMMIT", 0)
    waits = (
        f"{trips / traced_turns:.1f} round trips (the times the store waited for the server:"
        " a statement is sent with the others at the next read or COMMIT)"
        if trips is not None
        else "no round trips (SQLite runs in this process)"
    )
    print(
        f"\nSQL per turn (1 session, {traced_turns} turns traced): "
        f"{len(statements) / traced_turns:.1f} statements, "
        f"{commits / traced_turns:.1f} transactions (COMMITs), {waits}\n"
    )
    if trips is not None and floors:
        print(
            f"Issue 49's round trips on postgres: ≤ 10 per turn —"
            f" {'met' if trips / traced_turns <= 10 else 'MISSED'}"
            f" ({trips / traced_turns:.1f}).\n"
        )
    print(
        table(
            ["per turn", "statement"],
            [[f"{n / traced_turns:.2f}", f"`{kind}`"] for kind, n in kinds.most_common()],
        )
    )
    if profile is not None:
        print("\nWhere the time goes (cProfile of the largest case's measured window):\n")
        print_profile(profile, args.profile_lines)
        if STORE_PROFILE.getstats():
            print("\nThe store thread's batches, the same window:\n")
            print_profile(STORE_PROFILE, args.profile_lines)
    return 0


def print_profile(profile: cProfile.Profile, lines: int) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    print("```\n" + out.getvalue().strip() + "\n```")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 3 s in all")
    parser.add_argument("--duration", type=float, help="measured seconds per case (10)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds per case (2)")
    parser.add_argument(
        "--sessions", default="1,16", help="concurrent sessions, a case each (1,16)"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    parser.add_argument(
        "--engine", choices=["sqlite", "postgres"], default="sqlite", help="the store (sqlite)"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("ECHO_BOT_TEST_POSTGRES", DEFAULT_POSTGRES),
        help="postgres: a role that may create databases (one is made per case)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the largest case")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also the store's floor per case: the traced statements, bare driver loop",
    )
    parser.add_argument("--profile-lines", type=int, default=25)
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 1.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 0.3 if args.quick else 2.0
    args.duration = max(0.5, min(args.duration, 300.0))
    args.sessions = sorted({max(1, min(int(n), 1000)) for n in args.sessions.split(",")})
    args.cpu = "not pinned" if args.no_pin else pin_to_one_cpu()
    TARGET.engine, TARGET.admin_url = args.engine, args.database_url
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 1


if __name__ == "__main__":
    sys.exit(main())
