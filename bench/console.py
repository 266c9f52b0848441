"""The web console: how soon an open page sees a new request, and what a page costs.

In one process: the real daemon (SQLite in a temp dir, or ``--postgres URL``) with the
console on, a signed-in client holding the live queue open (``/console/events``, real
HTTP on loopback), and the CLI chat asking for a write that needs approval, one after
another. For each request: the time from its COMMIT (the store's ``ApprovalRequested``,
on the daemon's loop) to the client reading the queue event that shows it; the request
is then denied through the console's form, so the queue stays one deep.

The floor, measured in the same run: the same commit-to-client path through a bare
aiohttp Server-Sent-Events handler on the same loop that writes a fixed line on each
commit (no session check, no store read, no template): what any design pays for the
wake-up and the socket.

Then the pages: with ``--audit-rows`` rows in the audit log, each page is fetched
``--pages`` times and its server time read from the ``Server-Timing`` header
(from the request reaching the handler to the response made: session, store reads,
template): p50/p95 per page.

    python bench/console.py            # 200 requests, 5,000 audit rows, 200 fetches
    python bench/console.py --quick    # 30 requests, 1,000 rows, 40 fetches
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from echo_bot.app import Daemon  # noqa: E402
from echo_bot.config import LoadedConfig, parse_config  # noqa: E402
from echo_bot.console.auth import ConsoleUser, link_url, new_link  # noqa: E402
from echo_bot.runtime import build  # noqa: E402
from echo_bot.store import ApprovalRequested  # noqa: E402
from tests.fakes.channel import RecordingChannel  # noqa: E402

CONFIG = """
[http]
port = 0
[console]
enabled = true
decision_rate = 1000
[tools]
profile = "coding"
"""
OWNER = ConsoleUser(channel="echo-bot", id="bench", name="bench")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
TIMING = re.compile(r"app;dur=([0-9.]+)")
PAGES = ("/console/", "/console/history", "/console/audit", "/console/status")


@asynccontextmanager
async def daemon(state_dir: Path, postgres: str | None) -> AsyncIterator[Daemon]:
    raw = tomllib.loads(CONFIG)
    env: dict[str, str] = {}
    if postgres:
        raw["storage"] = {"engine": "postgres"}
        env["ECHO_BOT_DATABASE_URL"] = postgres
    loaded = LoadedConfig(config=parse_config(raw), path=state_dir / "bench.toml")
    runtime = build(loaded, state_dir, env)
    channel = RecordingChannel("cli")
    bot = Daemon(runtime, channel_names=[], banner=False, extra_channels=[channel])
    task = asyncio.create_task(bot.run())
    await asyncio.wait_for(bot.wait_started(), 30)
    bot.bench_channel = channel  # type: ignore[attr-defined]
    try:
        yield bot
    finally:
        bot.request_stop()
        await asyncio.wait_for(task, 30)


async def next_event(stream: aiohttp.ClientResponse, kind: str) -> str:
    data: list[str] = []
    current = ""
    while True:
        line = (await stream.content.readline()).decode()
        if not line:
            raise RuntimeError("the stream ended")
        if line.startswith("event: "):
            current = line[7:].strip()
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "\n":
            if current == kind:
                return "".join(data)
            data, current = [], ""


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def live_queue(bot: Daemon, session: aiohttp.ClientSession, csrf: str, n: int) -> list[float]:
    """Commit-to-client milliseconds for ``n`` requests shown by the live queue."""
    committed: dict[str, float] = {}
    store = bot.runtime.store
    store.subscribe(
        ApprovalRequested, lambda e: committed.setdefault(e.approval_id, time.perf_counter())
    )
    channel: RecordingChannel = bot.bench_channel  # type: ignore[attr-defined]
    latencies: list[float] = []
    async with session.get("/console/events") as stream:
        await next_event(stream, "queue")  # the queue as it is
        for i in range(n):
            inbound = await channel.say(
                f'/tool file_write {{"path": "bench-{i}.txt", "content": "x"}}'
            )
            prompt = await channel.prompt_for(inbound)
            request_id = prompt.approval.request_id
            while True:
                html = await next_event(stream, "queue")
                if request_id in html:
                    latencies.append((time.perf_counter() - committed[request_id]) * 1000)
                    break
            await deny(session, csrf, request_id)
            await channel.reply_to(inbound)
    return latencies


async def deny(session: aiohttp.ClientSession, csrf: str, request_id: str) -> None:
    async with session.post(
        f"/console/approvals/{request_id}",
        data={"csrf": csrf, "verb": "deny"},
        headers={"Origin": str(session._base_url)},
    ) as decided:
        assert decided.status == 200, decided.status


async def floor(bot: Daemon, session: aiohttp.ClientSession, csrf: str, n: int) -> list[float]:
    """The same commit-to-client path through a bare SSE handler (same loop, no render)."""
    store = bot.runtime.store
    wake = asyncio.Event()
    done = asyncio.Event()
    committed: dict[str, float] = {}

    def on_commit(event: ApprovalRequested) -> None:
        committed[event.approval_id] = time.perf_counter()
        wake.set()

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"event: ready\ndata: \n\n")
        while not done.is_set():
            await wake.wait()
            wake.clear()
            for approval_id in list(committed):
                await response.write(f"event: queue\ndata: {approval_id}\n\n".encode())
        return response

    app = web.Application()
    app.router.add_get("/events", events)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    store.subscribe(ApprovalRequested, on_commit)
    channel: RecordingChannel = bot.bench_channel  # type: ignore[attr-defined]
    latencies: list[float] = []
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"http://127.0.0.1:{port}/events") as stream,
        ):
            await next_event(stream, "ready")
            for i in range(n):
                committed.clear()
                inbound = await channel.say(
                    f'/tool file_write {{"path": "floor-{i}.txt", "content": "x"}}'
                )
                prompt = await channel.prompt_for(inbound)
                request_id = prompt.approval.request_id
                while (await next_event(stream, "queue")).strip() != request_id:
                    pass
                latencies.append((time.perf_counter() - committed[request_id]) * 1000)
                await deny(session, csrf, request_id)
                await channel.reply_to(inbound)
    finally:
        store.unsubscribe(ApprovalRequested, on_commit)
        done.set()
        wake.set()
        await runner.cleanup()
    return latencies


async def seed_audit(bot: Daemon, rows: int) -> None:
    def write(tx, start: int) -> None:  # type: ignore[no-untyped-def]
        for i in range(start, min(rows, start + 500)):
            tx.audit.write(
                "tool.finished",
                trace_id=f"{i:032x}",
                session_key="cli:local",
                tool="file_write",
                args={"path": f"f{i}.txt", "content": "x" * 200},
                ok=True,
                output=f"wrote f{i}.txt",
            )

    for start in range(0, rows, 500):
        await bot.runtime.store.run(lambda tx, s=start: write(tx, s))


async def page_times(session: aiohttp.ClientSession, path: str, n: int) -> list[float] | None:
    times: list[float] = []
    for _ in range(n):
        async with session.get(path) as page:
            if page.status == 404:
                return None
            assert page.status == 200, (path, page.status)
            await page.read()
            found = TIMING.search(page.headers.get("Server-Timing", ""))
            assert found, f"{path} sent no Server-Timing"
            times.append(float(found.group(1)))
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--audit-rows", type=int, default=None)
    parser.add_argument("--pages", type=int, default=None)
    parser.add_argument("--postgres", default=None, help="a database URL (default: SQLite)")
    args = parser.parse_args()
    n = args.requests or (30 if args.quick else 200)
    audit_rows = args.audit_rows or (1000 if args.quick else 5000)
    fetches = args.pages or (40 if args.quick else 200)

    with tempfile.TemporaryDirectory() as tmp:
        async with daemon(Path(tmp), args.postgres) as bot:
            assert bot.http is not None
            base = f"http://127.0.0.1:{bot.http.port}"
            secret = await bot.runtime.store.run(lambda tx: new_link(tx, OWNER, 600))
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(base, cookie_jar=jar) as session:
                signed = await session.post(
                    "/console/login", data={"t": secret}, headers={"Origin": base}
                )
                assert signed.status == 200, await signed.text()
                async with session.get("/console/") as page:
                    found = CSRF.search(await page.text())
                assert found and link_url(base, secret)
                csrf = found.group(1)
                bare = await floor(bot, session, csrf, n)
                console = await live_queue(bot, session, csrf, n)
                await seed_audit(bot, audit_rows)
                pages = {
                    path: await page_times(session, path, fetches)
                    for path in (
                        "/console/",
                        "/console/history",
                        "/console/audit",
                        "/console/status",
                    )
                }

    engine = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"## Console ({engine}; {n} requests, {audit_rows} audit rows, {fetches} fetches a page)\n"
    )
    print("| case | p50 ms | p95 ms | max ms |")
    print("| --- | --- | --- | --- |")
    for name, values in (
        ("live queue: commit to the open page (floor: bare SSE, same loop)", bare),
        ("live queue: commit to the open page (console)", console),
    ):
        print(
            f"| {name} | {statistics.median(values):.1f} | {percentile(values, 0.95):.1f} "
            f"| {max(values):.1f} |"
        )
    for path, times in pages.items():
        if times is None:
            print(f"| page {path}: server time | not served | | |")
            continue
        print(
            f"| page {path}: server time | {statistics.median(times):.2f} "
            f"| {percentile(times, 0.95):.2f} | {max(times):.2f} |"
        )
    ratio = statistics.median(console) / max(statistics.median(bare), 1e-6)
    print(f"\nlive queue p50: {ratio:.1f}x the floor's")


if __name__ == "__main__":
    asyncio.run(main())
