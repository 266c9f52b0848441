"""PostgreSQL drivers side by side: what one statement costs the client (CPU) and the
caller (wall time), the way the store runs statements — one after another inside one
transaction.

Cases, in one run against the same server and table:

- psycopg 3, synchronous (what ``store/postgres.py`` does on the store thread), with
  its automatic prepared statements and without;
- asyncpg (if installed) awaited on an event loop, and driven from a plain function
  through ``run_until_complete`` (how a synchronous unit of work would have to use it).

    python bench/pg_driver.py                       # 5,000 INSERTs per case
    python bench/pg_driver.py --statements 20000 --database-url postgresql://…

The database URL names a role that may create databases (``bash .ci/postgres`` sets one
up); the script makes a scratch database and drops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.postgres import drop_database  # noqa: E402

DEFAULT_POSTGRES = "postgresql://echo_bot_test:echo_bot_test@127.0.0.1:5432/postgres"
INSERT = "INSERT INTO scratch (id, v) VALUES ({0}, {1})"


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    import psycopg

    name = f"echo_bot_bench_driver_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE scratch (id BIGINT, v TEXT)")
        yield url
    finally:
        drop_database(admin_url, name)


def measure(label: str, n: int, run: Callable[[], None]) -> tuple[str, float, float]:
    wall, used = time.perf_counter(), cpu()
    run()
    return label, (time.perf_counter() - wall) / n * 1e6, (cpu() - used) / n * 1e6


def psycopg_case(url: str, n: int, prepare: bool | None) -> Callable[[], None]:
    import psycopg

    def run() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("BEGIN")
            sql = INSERT.format("%s", "%s")
            for i in range(n):
                conn.execute(sql, [i, "x"], prepare=prepare)
            conn.execute("COMMIT")

    return run


def asyncpg_awaited(url: str, n: int) -> Callable[[], None]:
    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                sql = INSERT.format("$1", "$2")
                for i in range(n):
                    await conn.execute(sql, i, "x")
        finally:
            await conn.close()

    return lambda: asyncio.run(go())


def asyncpg_from_a_function(url: str, n: int) -> Callable[[], None]:
    import asyncpg

    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            conn = loop.run_until_complete(asyncpg.connect(url))
            sql = INSERT.format("$1", "$2")
            loop.run_until_complete(conn.execute("BEGIN"))
            for i in range(n):
                loop.run_until_complete(conn.execute(sql, i, "x"))
            loop.run_until_complete(conn.execute("COMMIT"))
            loop.run_until_complete(conn.close())
        finally:
            loop.close()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=5000)
    parser.add_argument(
        "--database-url", default=os.environ.get("ECHO_BOT_TEST_POSTGRES", DEFAULT_POSTGRES)
    )
    args = parser.parse_args(argv)
    n = max(100, min(args.statements, 1_000_000))
    rows = []
    with scratch_database(args.database_url) as url:
        for _ in range(2):  # the first round warms the server's caches
            rows = [
                measure("psycopg 3, sync (the store's)", n, psycopg_case(url, n, None)),
                measure("psycopg 3, sync, never prepared", n, psycopg_case(url, n, False)),
            ]
            try:
                import asyncpg  # noqa: F401
            except ImportError:
                rows.append(("asyncpg: not installed (pip install asyncpg)", 0.0, 0.0))
            else:
                rows.append(measure("asyncpg, awaited on a loop", n, asyncpg_awaited(url, n)))
                rows.append(
                    measure(
                        "asyncpg, from a function (run_until_complete)",
                        n,
                        asyncpg_from_a_function(url, n),
                    )
                )
    print(f"{n:,} INSERTs in one transaction per case, one connection, one client process\n")
    print("| driver | wall µs / statement | client CPU µs / statement |")
    print("| --- | --- | --- |")
    for label, wall, used in rows:
        print(f"| {label} | {wall:.0f} | {used:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
