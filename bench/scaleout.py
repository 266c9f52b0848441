"""Scale-out: 1, 2 and 3 `echo-bot run` instances on one PostgreSQL database.

Each case starts N real daemons (webhook routes calling ``current_time``, one session per
route, so there is work for every instance) on a fresh database, then a load client in
this process posts deliveries round-robin to all N for the measured window, keeping a
fixed number in flight, closed-loop: a delivery counts once its turn is *done* in the
database (not when it is accepted). Printed per case: turns/s, the CPU the daemons and
the PostgreSQL server spent per turn (from /proc), and statements per turn on the server
(pg_stat_database transactions). On this 2-core machine the cores are shared by the
daemons, the server and the client, so the point is that adding an instance does not
lower throughput (no global serialisation point); docs/SCALING.md turns the per-turn
costs into a capacity model.

    python bench/scaleout.py                       # 1,2,3 instances, 8 s each after 2 s
    python bench/scaleout.py --instances 1,2 --duration 4 --database-url postgresql://…
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import mkdtemp
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402
from tests.postgres import drop_database  # noqa: E402

DEFAULT_POSTGRES = "postgresql://echo_bot_test:echo_bot_test@127.0.0.1:5432/postgres"
SECRET, SECRET_ENV = "scaleout-secret", "SCALEOUT_SECRET"
ROUTES = 24  # sessions: one per route
IN_FLIGHT = 48  # deliveries the client keeps waiting at once


def daemon_config(name: str, port: int) -> str:
    routes = "".join(
        f"""
[[webhook.routes]]
name = "tick-{n}"
auth = "bearer"
secret_env = "{SECRET_ENV}"
rate_limit = 100000
tool = "current_time"
"""
        for n in range(ROUTES)
    )
    return f"""
[bot]
instance = "{name}"
shutdown_timeout = "2s"
max_concurrent_turns = 16
[brain]
kind = "rules"
[storage]
engine = "postgres"
[http]
port = {port}
[webhook]
enabled = true
{routes}"""


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes ``pids`` (and nothing else), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def postgres_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    found.append(int(entry.name))
    return found


@dataclass
class Case:
    instances: int
    turns: int
    seconds: float
    daemon_cpu: float
    server_cpu: float
    transactions: int

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0


async def run_case(admin: str, instances: int, warmup: float, seconds: float) -> Case:
    import aiohttp
    import psycopg

    name = f"echo_bot_scaleout_{instances}_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    work = Path(mkdtemp(prefix="echo-bot-scaleout-"))
    procs: list[asyncio.subprocess.Process] = []
    ports: list[int] = []
    try:
        for n in range(instances):
            port = free_port()
            config = work / f"bot-{n}.toml"
            config.write_text(daemon_config(f"bot-{n}", port))
            env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
            env.update({SECRET_ENV: SECRET, "ECHO_BOT_DATABASE_URL": url})
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "echo_bot", "run", "--config", str(config),
                "--state-dir", str(work / f"state-{n}"),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
            )  # fmt: skip
            assert proc.stderr is not None
            async with asyncio.timeout(30):
                while not (await proc.stderr.readline()).startswith(b"stop with"):
                    pass
            procs.append(proc)
            ports.append(port)

        done = 0
        window: list[float] = []  # [turns, seconds] of the measured window
        measuring = False
        counter = 0

        async def worker(session: aiohttp.ClientSession, db: psycopg.AsyncConnection) -> None:
            nonlocal done, counter
            headers = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"}
            while True:
                counter += 1
                n = counter
                port = ports[n % len(ports)]
                body = json.dumps({"n": n})
                async with session.post(
                    f"http://127.0.0.1:{port}/hooks/tick-{n % ROUTES}", data=body, headers=headers
                ) as answer:
                    reply = await answer.json()
                inbound = reply.get("delivery") or reply.get("id")
                while True:  # closed loop: until its turn is done in the database
                    row = await (
                        await db.execute("SELECT status FROM inbox WHERE id = %s", [inbound])
                    ).fetchone()
                    if row and row[0] in ("done", "failed"):
                        break
                    await asyncio.sleep(0.01)
                if measuring:
                    done += 1

        async with aiohttp.ClientSession() as session:
            dbs = [await psycopg.AsyncConnection.connect(url) for _ in range(4)]
            tasks = [asyncio.create_task(worker(session, dbs[i % 4])) for i in range(IN_FLIGHT)]
            await asyncio.sleep(warmup)
            pids = [p.pid for p in procs]
            daemon_before, server_before = cpu_seconds(pids), cpu_seconds(postgres_pids())
            with psycopg.connect(admin, autocommit=True) as conn:
                tx_before = conn.execute(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [name]
                ).fetchone()[0]
            measuring, began = True, time.perf_counter()
            await asyncio.sleep(seconds)
            measuring = False
            window = [done, time.perf_counter() - began]
            daemon_cpu = cpu_seconds(pids) - daemon_before
            server_cpu = cpu_seconds(postgres_pids()) - server_before
            with psycopg.connect(admin, autocommit=True) as conn:
                tx_after = conn.execute(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [name]
                ).fetchone()[0]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for db in dbs:
                await db.close()
        return Case(
            instances, int(window[0]), window[1], daemon_cpu, server_cpu, tx_after - tx_before
        )
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 30)
        drop_database(admin, name)


async def amain(args: argparse.Namespace) -> int:
    cases = [
        await run_case(args.database_url, n, args.warmup, args.duration) for n in args.instances
    ]
    print(
        f"scale-out: {ROUTES} sessions, {IN_FLIGHT} deliveries in flight (closed loop, done in"
        f" the database), {args.duration:g} s after {args.warmup:g} s; {os.cpu_count()} CPUs"
        " shared by the daemons, PostgreSQL and the client\n"
    )
    print(
        "| instances | turns | turns/s | daemons' CPU ms / turn | PostgreSQL CPU ms / turn"
        " | transactions / turn |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for c in cases:
        per = max(c.turns, 1)
        print(
            f"| {c.instances} | {c.turns:,} | {c.rate:,.0f} | {c.daemon_cpu / per * 1000:.2f} |"
            f" {c.server_cpu / per * 1000:.2f} | {c.transactions / per:.1f} |"
        )
    base = cases[0].rate or 1.0
    print(
        "\nthroughput ÷ 1 instance: "
        + ", ".join(f"{c.instances}: {c.rate / base:.2f}" for c in cases)
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", default="1,2,3")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="1 and 2 instances, 2 s each")
    parser.add_argument(
        "--database-url", default=os.environ.get("ECHO_BOT_TEST_POSTGRES", DEFAULT_POSTGRES)
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.duration, args.warmup = "1,2", 2.0, 1.0
    args.instances = [max(1, min(int(n), 8)) for n in args.instances.split(",")]
    args.duration = max(1.0, min(args.duration, 300.0))
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
