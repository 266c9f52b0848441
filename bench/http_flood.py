"""HTTP flood: the daemon's memory, /healthz and log under half-open connections and
stalled large bodies, on 127.0.0.1 only, bounded in count and time.

``echo-bot run`` (one GitHub-signed webhook route, nothing else) is started as a
subprocess with ``RLIMIT_NOFILE`` lowered to ``--nofile``; then:

1. ``--half-open`` connections each send a partial request line and stall (slowloris);
   /healthz is asked during the flood; the script waits until the server has closed
   them (header timeout, replacement at the cap, or refusal);
2. ``--bodies`` unsigned POSTs each announce 1 MiB and send 1 MiB − 10 bytes, then
   stall; the script waits for the server to drop them (body timeout) and closes its
   side;
3. ``--heads`` requests each send 100 header lines of 8,000 bytes (800 KB) and never
   end their head.

It prints the daemon's RSS before, during (the peak) and after each phase, how
/healthz answered, how the peers were answered, and how much the log grew.

    python bench/http_flood.py             # 1,100 half-open, 300 bodies, 300 heads; twice
    python bench/http_flood.py --quick     # 200, 40 and 40, once
    python bench/http_flood.py --root /path/to/other/checkout --plain-config
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port, stop  # noqa: E402

SECRET_ENV = "BENCH_FLOOD_SECRET"
BODY_SIZE = 1024 * 1024
HALF_OPEN = b"POST /hooks/gh HT"
WAIT = 120.0  # seconds the script waits for the server to answer or drop its peers


def config_text(port: int, args: argparse.Namespace) -> str:
    http = f"[http]\nport = {port}\n"
    if not args.plain_config:
        http += (
            f'header_timeout = "{args.header_timeout}s"\nbody_timeout = "{args.body_timeout}s"\n'
        )
    return (
        http
        + f"""
[webhook]
enabled = true

[[webhook.routes]]
name = "gh"
auth = "github"
secret_env = "{SECRET_ENV}"
tool = "current_time"
"""
    )


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of ``pid`` in MiB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def healthz(port: int) -> str:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            status = str(answer.status)
    except urllib.error.HTTPError as exc:
        status = str(exc.code)
    except OSError as exc:
        status = type(exc).__name__
    return f"{status} in {(time.perf_counter() - started) * 1000:.0f} ms"


@dataclass
class Phase:
    name: str
    before: float = 0.0
    during: float = 0.0
    after: float = 0.0
    health: list[str] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)
    seconds_to_drop: float = 0.0


async def read_answer(reader: asyncio.StreamReader, wait: float) -> str:
    """The status the server sent before closing, or how the connection ended."""
    try:
        async with asyncio.timeout(wait):
            data = await reader.read(64)
            while await reader.read(65536):
                pass
    except TimeoutError:
        return "still open"
    except ConnectionError as exc:
        return type(exc).__name__
    return data.split(b"\r\n", 1)[0].decode("latin-1")[9:12] or "closed"


async def flood(
    port: int,
    pid: int,
    phase: Phase,
    count: int,
    request: bytes,
    health_every: int,
    wait: float,
) -> None:
    _, peak_before = rss_mib(pid)
    phase.before = rss_mib(pid)[0]
    writers: list[asyncio.StreamWriter] = []
    waits: list[asyncio.Task[str]] = []
    loop = asyncio.get_running_loop()
    for n in range(count):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            phase.answers["connect failed"] = phase.answers.get("connect failed", 0) + 1
            continue
        writer.write(request)  # never drained: a stalled peer
        writers.append(writer)
        waits.append(asyncio.create_task(read_answer(reader, wait)))
        if n % health_every == health_every - 1:
            phase.health.append(await loop.run_in_executor(None, healthz, port))
    await asyncio.sleep(0.5)
    phase.health.append(await loop.run_in_executor(None, healthz, port))
    phase.during = max(rss_mib(pid)[1], peak_before)  # the peak, this phase included
    started = time.monotonic()
    for answer in await asyncio.gather(*waits):
        phase.answers[answer] = phase.answers.get(answer, 0) + 1
    phase.seconds_to_drop = time.monotonic() - started
    for writer in writers:
        writer.close()
    await asyncio.sleep(3)  # let the daemon settle
    phase.after = rss_mib(pid)[0]


def raise_own_nofile(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half-open", type=int, default=1100)
    parser.add_argument("--bodies", type=int, default=300)
    parser.add_argument("--heads", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2, help="times each flood is repeated")
    parser.add_argument("--nofile", type=int, default=1024, help="the daemon's RLIMIT_NOFILE")
    parser.add_argument("--header-timeout", type=float, default=5)
    parser.add_argument("--body-timeout", type=float, default=5)
    parser.add_argument("--quick", action="store_true", help="200, 40 and 40 peers, 1 round")
    parser.add_argument("--wait", type=float, default=WAIT, help="longest wait for answers")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to run")
    parser.add_argument(
        "--plain-config", action="store_true", help="no [http] timeouts (for older code)"
    )
    args = parser.parse_args()
    if args.quick:
        args.half_open, args.bodies = min(args.half_open, 200), min(args.bodies, 40)
        args.heads = min(args.heads, 40)
        args.rounds = 1
    raise_own_nofile(max(args.half_open, args.bodies, args.heads) + 256)

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="echo-bot-flood-") as tmp:
        workdir = Path(tmp)
        (workdir / "config.toml").write_text(config_text(port, args))
        log = workdir / "daemon.log"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(workdir),
            "PYTHONUNBUFFERED": "1",
            SECRET_ENV: "bench-flood-secret",
        }

        def limit() -> None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))

        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "echo_bot", "run", "--config",
                 str(workdir / "config.toml"), "--state-dir", str(workdir / "state")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink,
                env=env, cwd=args.root, preexec_fn=limit,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while "stop with" not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(log.read_text(errors="replace"), file=sys.stderr)
                    return 1
                time.sleep(0.05)
            for _ in range(5):
                healthz(port)
            baseline = rss_mib(proc.pid)[0]
            log_start = log.stat().st_size
            head = (
                b"POST /hooks/gh HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {BODY_SIZE}\r\n\r\n".encode()
            )
            stalled_body = head + b'{"ref": "' + b"x" * (BODY_SIZE - 10 - 9)
            endless_head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
                b"X-Pad-%d: %s\r\n" % (n, b"a" * 8000) for n in range(100)
            )
            phases: list[tuple[Phase, int]] = []
            for name, count, request in (
                ("half-open connections", args.half_open, HALF_OPEN),
                ("stalled 1 MiB bodies", args.bodies, stalled_body),
                ("unfinished 800 KB heads", args.heads, endless_head),
            ):
                for round_ in range(1, args.rounds + 1):
                    phase = Phase(f"{name}, round {round_}")
                    asyncio.run(
                        flood(port, proc.pid, phase, count, request, max(1, count // 4), args.wait)
                    )
                    phases.append((phase, count))
            log_text = log.read_text(errors="replace")
            log_growth = log.stat().st_size - log_start
        finally:
            stop(proc)
        report(args, baseline, phases, log_growth, log_text.count("Traceback"))
    return 0


def report(
    args: argparse.Namespace,
    baseline: float,
    phases: list[tuple[Phase, int]],
    log_bytes: int,
    tracebacks: int,
) -> None:
    limits = (
        "no [http] limits in the config"
        if args.plain_config
        else f"header_timeout {args.header_timeout:g} s, body_timeout {args.body_timeout:g} s"
    )
    print(
        f"\nHTTP flood on 127.0.0.1 (daemon RLIMIT_NOFILE {args.nofile}, {limits}; "
        f"baseline RSS {baseline:.1f} MiB)\n"
    )
    print(
        "| phase | peers | RSS before MiB | peak so far MiB | after MiB | /healthz during "
        "| answers | all answered within s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for phase, count in phases:
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(phase.answers.items()))
        print(
            f"| {phase.name} | {count} | {phase.before:.1f} | {phase.during:.1f} | "
            f"{phase.after:.1f} | {'; '.join(phase.health)} | {answers} | "
            f"{phase.seconds_to_drop:.1f} |"
        )
    print(f"\nlog grew {log_bytes / 1024:.1f} KiB, {tracebacks} tracebacks")


if __name__ == "__main__":
    sys.exit(main())
