"""Webhook ingest: echo-bot's signed webhook route beside a bare aiohttp handler.

Two servers, each in its own process, each loaded for a bounded time by a load
generator in yet another process (``wrk`` with a Lua script when it is installed,
else an aiohttp client), on 127.0.0.1 only:

(a) a bare aiohttp server whose handler reads the body, parses the JSON and answers 200;
(b) ``echo-bot run`` with one bearer-signed webhook route that calls the read tool
    ``current_time`` (no ``deliver_to``): each delivery is committed to the inbox before
    it is answered 202, and the daemon runs its turns meanwhile.

Every request carries a different body, so no delivery is a duplicate. Prints requests/s,
p50/p99 latency and the server's CPU time per request for both, the ratio b/a, and how
long (b) takes afterwards to run the turns still queued when the load ended.

With ``--reference`` three more bare servers run in between: (a) plus one SQLite commit
per request (on a worker thread), (a) plus group commit on a worker thread, and (a) plus
group commit on the event-loop thread (echo-bot's store engine, without the rest of
echo-bot) — what the storage scheme alone costs here, and the limit for (b).

    python bench/webhook_ingest.py                # 10 s per case
    python bench/webhook_ingest.py --reference    # and the three SQLite references
    python bench/webhook_ingest.py --quick        # about 2 s per case
    python bench/webhook_ingest.py --profile F    # and a cProfile of (b)'s event loop
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port, stop  # noqa: E402

SECRET = "bench-webhook-secret"
SECRET_ENV = "BENCH_WEBHOOK_SECRET"
ROUTE = "bench"
# Deliveries go round-robin to this many routes (bench-0, bench-1, …): a route accepts at
# most 100,000 a minute (the config's bound on rate_limit), less than one route could
# take in a run. One turn at a time runs for all of them, as for one route.
ROUTES = 8
# What `bash .ci/postgres` sets up (and the tests use by default).
DEFAULT_POSTGRES = "postgresql://echo_bot_test:echo_bot_test@127.0.0.1:5432/postgres"
MAX_CLIENT_REQUESTS = 5_000_000  # the Python load client stops here whatever the time

WRK_SCRIPT = r"""
-- Signed POSTs, each with a body of its own (so none is deduplicated).
local counter = 0
local prefix = "x"
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local routes = 1

function init(args)
  prefix = args[1] or "x"
  routes = tonumber(args[3] or "1")
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. (args[2] or "")
end

function request()
  counter = counter + 1
  local body = '{"event":"bench","run":"' .. prefix .. '","thread":' .. tid ..
    ',"n":' .. counter .. ',"note":"a delivery of a modest size, like a small event"}'
  return wrk.format(nil, "/hooks/bench-" .. (counter % routes), nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK-JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Case (a): the bare aiohttp server (run in its own process: --serve-bare)
# ---------------------------------------------------------------------------------------


def serve_bare(port: int, mode: str = "plain", workdir: str = "") -> None:
    """``plain``: parse the JSON, answer 200. The references (``--reference``) also store
    each body in SQLite (WAL, synchronous=NORMAL, one connection) before answering 202:
    ``commit`` with one transaction per request on a worker thread, ``group`` with
    everything queued in one transaction on a worker thread, ``loop`` the same group
    commit on the event-loop thread: the requests of one loop iteration are queued, then
    one callback drains the queue, inserts them all (executemany), COMMITs and answers
    them all — no thread hop (the store engine's scheme, without the rest of echo-bot).
    ``store``: ``loop`` into echo-bot's own schema (its migrations, its inbox INSERT, a
    row of the size echo-bot writes): what echo-bot's inbox allows, with none of the
    Python around it — the floor for (b)."""
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    from aiohttp import web

    executor = ThreadPoolExecutor(max_workers=1)
    conn: sqlite3.Connection | None = None
    queued: list[tuple[tuple[Any, ...], asyncio.Future[None]]] = []
    writer: list[asyncio.Task[None]] = []
    flush_scheduled = False
    insert = "INSERT INTO t (id, body) VALUES (?, ?)"
    if mode == "store":
        insert, store_row = echo_bot_inbox(Path(workdir) / "reference-store.sqlite3")
    if mode != "plain":
        conn = sqlite3.connect(
            Path(workdir) / f"reference-{mode}.sqlite3",
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (seq INTEGER PRIMARY KEY, id TEXT UNIQUE, body)")

    def commit(rows: list[tuple[Any, ...]]) -> None:
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows)
        conn.execute("COMMIT")

    async def write_queued() -> None:
        nonlocal queued
        loop = asyncio.get_running_loop()
        while queued:
            batch, queued = queued, []
            await loop.run_in_executor(executor, commit, [row for row, _f in batch])
            for _row, future in batch:
                future.set_result(None)

    def flush_on_loop() -> None:
        nonlocal queued, flush_scheduled
        flush_scheduled = False
        batch, queued = queued, []
        try:
            commit([row for row, _f in batch])
        except Exception as exc:
            for _row, future in batch:
                future.set_exception(exc)
        else:
            for _row, future in batch:
                future.set_result(None)

    async def handle(request: web.Request) -> web.Response:
        nonlocal flush_scheduled
        body = await request.read()
        payload = json.loads(body)
        if mode == "plain":
            return web.json_response({"status": "ok", "keys": len(payload)})
        key = hashlib.sha256(body).hexdigest()
        row: tuple[Any, ...] = (
            store_row(request.match_info["route"], key) if mode == "store" else (key, body.decode())
        )
        loop = asyncio.get_running_loop()
        if mode == "commit":
            await loop.run_in_executor(executor, commit, [row])
        elif mode in ("loop", "store"):
            future = loop.create_future()
            queued.append((row, future))
            if not flush_scheduled:
                flush_scheduled = True
                loop.call_soon(flush_on_loop)
            await future
        else:
            future = loop.create_future()
            queued.append((row, future))
            if not writer or writer[0].done():
                writer[:] = [asyncio.create_task(write_queued())]
            await future
        return web.json_response({"status": "accepted", "keys": len(payload)}, status=202)

    app = web.Application()
    app.router.add_post("/hooks/{route}", handle)
    app.router.add_get("/healthz", lambda _r: _ok())
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def echo_bot_inbox(path: Path) -> tuple[str, Callable[[str, str], tuple[Any, ...]]]:
    """A store at ``path`` made by echo-bot's own migrations; its inbox INSERT, and a row
    for a delivery on a route as echo-bot writes it (the payload of the size of the
    message echo-bot stores, ids and key fresh)."""
    import secrets

    from echo_bot.events import Address, Sender, ToolCallInbound, ToolCallRequest
    from echo_bot.store.db import Database
    from echo_bot.store.inbox import _INSERT_NEW

    store = Database(path)
    store.open_sync()
    store.close_sync()
    sample = ToolCallInbound(
        address=Address(channel="webhook", chat_id=ROUTE),
        sender=Sender(id=f"webhook:{ROUTE}", name=ROUTE),
        external_id="K" * 80,
        deliver_to=None,
        metadata={"route": ROUTE},
        tool_call=ToolCallRequest(tool="current_time", args={}),
    ).model_dump_json()

    def row(route: str, key: str) -> tuple[Any, ...]:
        now = time.time()
        inbound_id = secrets.token_hex(16)
        external_id = f"{route}:sha256:{key}"
        payload = sample.replace("K" * 80, external_id)
        return (inbound_id, "tool_call", "webhook", f"webhook:{route}", external_id, payload,
                "accepted", now, now, None)  # fmt: skip

    return _INSERT_NEW, row


async def _ok() -> object:
    from aiohttp import web

    return web.json_response({"status": "ok"})


# ---------------------------------------------------------------------------------------
# Case (b): echo-bot run with a signed webhook route
# ---------------------------------------------------------------------------------------


def daemon_config(port: int) -> str:
    routes = "".join(
        f"""
[[webhook.routes]]
name = "{ROUTE}-{n}"
auth = "bearer"
secret_env = "{SECRET_ENV}"
rate_limit = 100000
tool = "current_time"
"""
        for n in range(ROUTES)
    )
    return f"""
[bot]
shutdown_timeout = "1s"
max_concurrent_turns = 1

[brain]
kind = "rules"

[http]
host = "127.0.0.1"
port = {port}

[webhook]
enabled = true

[storage]
engine = "{"postgres" if POSTGRES_URL else "sqlite"}"
{routes}"""


# --engine postgres: the database made for this run (None: SQLite in the state dir).
POSTGRES_URL: str | None = None


def daemon_env() -> dict[str, str]:
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({"PYTHONUNBUFFERED": "1", SECRET_ENV: SECRET})
    if POSTGRES_URL:
        env["ECHO_BOT_DATABASE_URL"] = POSTGRES_URL
    return env


def inbox_counts(state_dir: Path) -> dict[str, int]:
    if POSTGRES_URL:
        import psycopg

        with psycopg.connect(POSTGRES_URL) as pg:
            found = pg.execute("SELECT status, COUNT(*) FROM inbox GROUP BY status").fetchall()
        return {str(status): int(count) for status, count in found}
    path = state_dir / "echo-bot.sqlite3"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT status, COUNT(*) FROM inbox GROUP BY status").fetchall()
    finally:
        conn.close()
    return {status: count for status, count in rows}


UNFINISHED = ("accepted", "running", "waiting_approval")


def drain_note(state_dir: Path, at_end: dict[str, int], timeout: float) -> str:
    """Wait (up to ``timeout`` s) for the turns still queued when the load ended; say how
    long they took. Under a flood ingest comes first: the backlog runs afterwards."""
    left = sum(at_end.get(s, 0) for s in UNFINISHED)
    began = time.monotonic()
    while left and time.monotonic() - began < timeout:
        time.sleep(0.5)
        left = sum(inbox_counts(state_dir).get(s, 0) for s in UNFINISHED)
    took = time.monotonic() - began
    backlog = sum(at_end.get(s, 0) for s in UNFINISHED)
    rate = (backlog - left) / took if took else 0.0
    if not left:
        return f"backlog after the load: {backlog} turns, drained in {took:.1f} s ({rate:,.0f}/s)"
    return (
        f"backlog after the load: {backlog} turns, {left} still queued after {took:.0f} s "
        f"({rate:,.0f}/s; all would take about {backlog / rate:.0f} s)"
        if rate
        else f"backlog after the load: {backlog} turns, none finished within {took:.0f} s"
    )


def profiled_daemon(out: str, argv: list[str]) -> int:
    """``echo-bot`` ``argv`` in this process; SIGUSR1 starts a cProfile of the event-loop
    thread, SIGUSR2 stops it and writes the stats to ``out`` (``--profile``)."""
    import cProfile

    from echo_bot.cli.main import main as echo_bot_main

    profiler = cProfile.Profile()

    def start(_signum: int, _frame: object) -> None:
        profiler.enable()

    def finish(_signum: int, _frame: object) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, finish)
    return echo_bot_main(argv)


def print_profile(path: str, limit: int = 40) -> None:
    import pstats

    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)


# ---------------------------------------------------------------------------------------
# Load generators
# ---------------------------------------------------------------------------------------


@dataclass
class Load:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    failed: int  # non-2xx answers and socket errors

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def run_wrk(url: str, seconds: float, connections: int, prefix: str, workdir: Path) -> Load:
    script = workdir / "signed_post.lua"
    script.write_text(WRK_SCRIPT)
    cmd = [
        "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
        "--timeout", "10s", "-s", str(script), url, "--", prefix, SECRET, str(ROUTES),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRK-JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{out.stdout}\n{out.stderr}")
    data = json.loads(line.removeprefix("WRK-JSON "))
    failed = sum(data[k] for k in ("connect", "read", "write", "status", "timeout"))
    return Load(
        requests=data["requests"] - data["status"],
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        failed=failed,
    )


def run_python_client(url: str, seconds: float, connections: int, prefix: str) -> Load:
    cmd = [sys.executable, __file__, "--client", url, str(seconds), str(connections), prefix]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x for x in out.stdout.splitlines() if x.startswith("CLIENT-JSON ")), None)
    if line is None:
        raise RuntimeError(f"the load client printed no summary:\n{out.stdout}\n{out.stderr}")
    return Load(**json.loads(line.removeprefix("CLIENT-JSON ")))


async def client_main(url: str, seconds: float, connections: int, prefix: str) -> None:
    """The aiohttp load client (its own process): ``connections`` workers posting
    signed, unique bodies until the time is up."""
    import aiohttp

    latencies: list[float] = []
    failed = 0
    counter = 0
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {SECRET}"}
    deadline = time.perf_counter() + seconds
    base = url.split("/hooks/", 1)[0]

    async def worker(session: aiohttp.ClientSession, number: int) -> None:
        nonlocal failed, counter
        while time.perf_counter() < deadline and counter < MAX_CLIENT_REQUESTS:
            counter += 1
            body = json.dumps({"event": "bench", "run": prefix, "thread": number, "n": counter})
            route = f"{base}/hooks/{ROUTE}-{counter % ROUTES}"
            began = time.perf_counter()
            try:
                async with session.post(route, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status < 300
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - began)
            else:
                failed += 1

    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=10)
    began = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session, n) for n in range(connections)))
    elapsed = time.perf_counter() - began
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0
        )

    result = Load(len(latencies), elapsed, pct(0.50), pct(0.99), failed)
    print("CLIENT-JSON " + json.dumps(result.__dict__), flush=True)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    load: Load
    cpu_us: float  # server CPU time per answered request


def load_case(
    name: str,
    proc: subprocess.Popen[bytes],
    url: str,
    args: argparse.Namespace,
    workdir: Path,
    measuring: Callable[[bool], None] | None = None,
) -> Case:
    """``measuring(True)`` just before the measured load, ``measuring(False)`` after."""
    prefix = f"{name}-{time.time_ns()}"
    generate = (
        (lambda s, p: run_wrk(url, s, args.connections, p, workdir))
        if args.generator == "wrk"
        else (lambda s, p: run_python_client(url, s, args.connections, p))
    )
    if args.warmup > 0:
        generate(args.warmup, prefix + "-warm")
    if measuring is not None:
        measuring(True)
    before = cpu_seconds(proc.pid)
    load = generate(args.duration, prefix)
    used = cpu_seconds(proc.pid) - before
    if measuring is not None:
        measuring(False)
    return Case(name, load, used / load.requests * 1e6 if load.requests else 0.0)


def run(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="echo-bot-ingest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    cases: list[Case] = []
    notes: list[str] = []
    try:
        # (a) bare aiohttp; with --reference, also bare aiohttp + SQLite commits
        modes = ["plain", "commit", "group", "loop", "store"] if args.reference else ["plain"]
        for mode in modes:
            port = free_port()
            bare = subprocess.Popen(
                [sys.executable, __file__, "--serve-bare", str(port), mode, str(workdir)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(bare)
            wait_http(f"http://127.0.0.1:{port}/healthz", bare, 30)
            url = f"http://127.0.0.1:{port}/hooks/{ROUTE}-0"
            cases.append(load_case(mode, bare, url, args, workdir))
            stop(bare)

        # (b) echo-bot run
        port = free_port()
        state = workdir / "state"
        config = workdir / "echo-bot.toml"
        config.write_text(daemon_config(port))
        log = (workdir / "daemon.log").open("wb")
        command = ["run", "--config", str(config), "--state-dir", str(state)]
        profile = Path(args.profile).resolve() if args.profile else None
        if profile is not None:  # echo-bot's own main, profiled during the measured load
            command = [__file__, "--profiled-daemon", str(profile), *command]
        else:
            command = ["-m", "echo_bot", *command]
        daemon = subprocess.Popen(
            [sys.executable, *command],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env=daemon_env(), cwd=ROOT,
        )  # fmt: skip
        procs.append(daemon)
        wait_http(f"http://127.0.0.1:{port}/healthz", daemon, 60)

        def measuring(on: bool) -> None:
            if profile is not None:
                daemon.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)

        url = f"http://127.0.0.1:{port}/hooks/{ROUTE}-0"
        case_b = load_case("b", daemon, url, args, workdir, measuring)
        cases.append(case_b)
        before_stop = inbox_counts(state)
        notes.append(drain_note(state, before_stop, args.drain_timeout))
        if profile is not None:
            notes.append(f"profile of the measured load (event-loop thread): {profile}")
        code = stop(daemon)
        log.close()
        counts = inbox_counts(state)
        committed = sum(counts.values())
        answered = case_b.load.requests
        notes.append(
            f"echo-bot committed {committed} deliveries (warm-up included; {answered} answered"
            f" 2xx in the measured window); turns finished by the end of the load: "
            f"{before_stop.get('done', 0)}, still queued: "
            f"{before_stop.get('accepted', 0) + before_stop.get('running', 0)}; "
            f"daemon exit code {code}"
        )
        if committed < answered:
            notes.append("**fewer rows committed than deliveries acknowledged — a bug**")
    finally:
        for proc in procs:
            stop(proc)
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    a, b = cases[0], cases[-1]
    labels = {
        "plain": "(a) bare aiohttp: parse JSON, 200",
        "commit": "reference: (a) + one SQLite commit per request (worker thread), 202",
        "group": "reference: (a) + group commit to SQLite on a worker thread, 202",
        "loop": "reference: (a) + group commit to SQLite on the event-loop thread, 202",
        "store": "store floor: the event-loop group commit into echo-bot's inbox, 202",
        "b": "(b) echo-bot webhook: bearer, commit, 202"
        + (" (PostgreSQL)" if POSTGRES_URL else ""),
    }
    rows = [
        [
            labels[c.name],
            f"{c.load.requests:,}",
            f"{c.load.rate:,.0f}",
            f"{c.load.p50_ms:.2f}",
            f"{c.load.p99_ms:.2f}",
            str(c.load.failed),
            f"{c.cpu_us:.0f}",
            f"{c.load.rate / a.load.rate:.2f}" if a.load.rate else "",
        ]
        for c in cases
    ]
    ratio = b.load.rate / a.load.rate if a.load.rate else 0.0
    rows.append(
        [
            "**b/a**",
            "",
            f"**{ratio:.2f}**",
            f"{b.load.p50_ms / a.load.p50_ms:.2f}×" if a.load.p50_ms else "",
            f"{b.load.p99_ms / a.load.p99_ms:.2f}×" if a.load.p99_ms else "",
            "",
            f"{b.cpu_us / a.cpu_us:.2f}×" if a.cpu_us else "",
            "",
        ]
    )
    header = [
        "case", "requests", "req/s", "p50 ms", "p99 ms", "failed", "server CPU µs/req",
        "req/s ÷ (a)",
    ]  # fmt: skip
    print(
        f"webhook ingest: {args.generator}, {args.connections} connections, "
        f"{args.duration:g} s per case (+{args.warmup:g} s warm-up), 127.0.0.1\n"
    )
    print(table(header, rows))
    print()
    print(f"Target: b/a ≥ 0.85 — {'met' if ratio >= 0.85 else 'MISSED'} ({ratio:.2f}).")
    named = {c.name: c for c in cases}
    loop_case, floor = named.get("loop"), named.get("store")
    if loop_case is not None and loop_case.load.rate and not POSTGRES_URL:
        of_loop = b.load.rate / loop_case.load.rate
        print(
            "Issue 49's target: b ≥ 0.85× the event-loop group-commit reference — "
            f"{'met' if of_loop >= 0.85 else 'MISSED'} ({of_loop:.2f}×; server CPU a request "
            f"{b.cpu_us:.0f} against {loop_case.cpu_us:.0f} µs)."
        )
    if floor and loop_case and floor.load.rate and loop_case.load.rate and not POSTGRES_URL:
        print(
            f"- b ÷ the store floor (echo-bot's own inbox): {b.load.rate / floor.load.rate:.2f}×"
            f"; the store floor ÷ the reference: {floor.load.rate / loop_case.load.rate:.2f}×"
        )
    for note in notes:
        print(f"- {note}")
    if args.profile and Path(args.profile).exists():
        print()
        print_profile(args.profile)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 2 s per case")
    parser.add_argument("--duration", type=float, help="seconds of load per case (10)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up load per case (2)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--generator", choices=["auto", "wrk", "python"], default="auto",
        help="wrk when installed (auto), else an aiohttp client in its own process",
    )  # fmt: skip
    parser.add_argument("--workdir", help="keep the state, config and daemon log here")
    parser.add_argument(
        "--reference", action="store_true",
        help="also bare aiohttp + one SQLite commit per request, + group commit on a"
        " worker thread, and + group commit on the event-loop thread",
    )  # fmt: skip
    parser.add_argument(
        "--drain-timeout", type=float,
        help="seconds to wait after the load for echo-bot's queued turns (120; --quick 20)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", metavar="FILE",
        help="cProfile echo-bot's event-loop thread during the measured load into FILE"
        " (pstats; slows it down) and print its top entries",
    )  # fmt: skip
    parser.add_argument(
        "--engine", choices=["sqlite", "postgres"], default="sqlite", help="(b)'s store"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("ECHO_BOT_TEST_POSTGRES", DEFAULT_POSTGRES),
        help="postgres: a role that may create databases (one is made for the run)",
    )
    parser.add_argument("--profiled-daemon", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.profiled_daemon:
        return profiled_daemon(args.profiled_daemon[0], args.profiled_daemon[1:])
    if args.serve_bare:
        port, mode, workdir = args.serve_bare
        serve_bare(int(port), mode, workdir)
        return 0
    if args.client:
        url, seconds, connections, prefix = args.client
        asyncio.run(client_main(url, float(seconds), int(connections), prefix))
        return 0
    if args.duration is None:
        args.duration = 2.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 2.0
    args.duration = max(1.0, min(args.duration, 120.0))
    if args.drain_timeout is None:
        args.drain_timeout = 20.0 if args.quick else 120.0
    if args.generator == "auto":
        args.generator = "wrk" if shutil.which("wrk") else "python"
    if args.engine == "sqlite":
        return run(args)
    return on_postgres(args)


def on_postgres(args: argparse.Namespace) -> int:
    """``run`` with (b) on a PostgreSQL database made for it (and dropped after)."""
    import psycopg

    global POSTGRES_URL
    name = f"echo_bot_bench_ingest_{os.getpid()}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    POSTGRES_URL = urlunsplit(urlsplit(args.database_url)._replace(path=f"/{name}"))
    try:
        return run(args)
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
