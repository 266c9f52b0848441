"""Footprint: cold start of ``echo-bot run`` to READY and its idle RSS, beside a bare
``python -c "import …"`` of the same third-party libraries, measured in the same run.

Two configurations:

(a) no Telegram, no LLM: webhook route, a cron job, the rules brain (no terminal);
(b) Telegram (against a fake Bot API started here) + webhook + cron + the LLM brain
    (against a fake OpenAI-compatible server started here; it is only a client at start).

For each: the daemon is started as a subprocess with a fake ``$NOTIFY_SOCKET`` (the
systemd notify protocol); cold start is the time from spawn to the ``READY=1`` datagram,
idle RSS is ``VmRSS`` after it has sat idle for 10 s (``--quick``: 2 s). The floor is a
bare interpreter importing exactly the third-party top-level packages that this daemon
imported (found with ``python -X importtime`` in a separate, unmeasured run), timed from
spawn to a line printed after the imports, and its RSS after the same idle time. The same
run tells whether aiogram and openai were imported in (a) — they must not be.

Bytecode: this environment may set PYTHONDONTWRITEBYTECODE=1. Every process here runs
without it, and the unmeasured ``-X importtime`` run comes first, so every measured
process reads cached bytecode (``.pyc``) — the steady state of an installed service.

    python bench/footprint.py            # 5 cold starts per command, RSS after 10 s idle
    python bench/footprint.py --quick    # 1 cold start per command, RSS after 2 s idle
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port, stop  # noqa: E402
from tests.fakes.notify import NotifySocket  # noqa: E402

TOKEN = "123456:BENCH-footprint-token"
HOOK_SECRET_ENV = "BENCH_HOOK_SECRET"
START_TIMEOUT = 60.0
WATCHED = ("aiogram", "openai", "mcp")
NOTES_SERVER = ROOT / "tests" / "fakes" / "mcp_notes_server.py"


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def clean_env(**extra: str) -> dict[str, str]:
    """No tokens or keys from outside; bytecode may be written (see the module doc)."""
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(extra)
    return env


def echo_bot_command() -> list[str]:
    script = Path(sys.executable).parent / "echo-bot"
    return [str(script)] if script.exists() else [sys.executable, "-m", "echo_bot"]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Fake peers for (b), on their own event loop in a thread
# ---------------------------------------------------------------------------------------


class FakePeers:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.telegram_url = ""
        self.openai_url = ""
        self._stack: contextlib.AsyncExitStack | None = None

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        from tests.fakes.openai_api import FakeOpenAI
        from tests.fakes.telegram_api import FakeTelegramAPI

        self._stack = contextlib.AsyncExitStack()
        telegram = await self._stack.enter_async_context(FakeTelegramAPI(token=TOKEN))
        llm = await self._stack.enter_async_context(FakeOpenAI())
        self.telegram_url, self.openai_url = telegram.base_url, llm.base_url

    def stop(self) -> None:
        if self._stack is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._stack.aclose(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# ---------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------


COMMON = """
[bot]
shutdown_timeout = "2s"

[http]
host = "127.0.0.1"
port = {port}

[webhook]
enabled = true

[[webhook.routes]]
name = "hook"
auth = "bearer"
secret_env = "{secret_env}"
tool = "current_time"

[[cron]]
name = "morning"
schedule = "0 9 * * *"
tool = "current_time"
deliver_to = "{deliver_to}"
"""


def config_a() -> tuple[str, dict[str, str]]:
    text = '[brain]\nkind = "rules"\n' + COMMON.format(
        port=free_port(), secret_env=HOOK_SECRET_ENV, deliver_to="webhook:hook"
    )
    return text, {HOOK_SECRET_ENV: "bench-secret"}


def config_c(notes: Path) -> tuple[str, dict[str, str]]:
    """(a) with one stdio MCP server (the tests' notes server): the SDK imported, the
    server spawned and listed before READY."""
    text, env = config_a()
    notes.mkdir(parents=True, exist_ok=True)
    text += f"""
[[mcp.servers]]
name = "notes"
command = ["{sys.executable}", "{NOTES_SERVER}", "stdio"]
env = {{ NOTES_DIR = "{notes}" }}
trust_annotations = true
"""
    return text, env


def config_b(peers: FakePeers) -> tuple[str, dict[str, str]]:
    text = f"""
[brain]
kind = "openai"

[openai]
base_url = "{peers.openai_url}"
model = "fake-model"

[telegram]
enabled = true
api_base = "{peers.telegram_url}"
allowed_users = [4242]
""" + COMMON.format(port=free_port(), secret_env=HOOK_SECRET_ENV, deliver_to="telegram:4242")
    env = {HOOK_SECRET_ENV: "bench-secret", "TELEGRAM_BOT_TOKEN": TOKEN}
    env["OPENAI_API_KEY"] = "sk-bench"
    return text, env


# ---------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    start: float  # seconds from spawn to ready
    rss: float | None  # MB after the idle time, when measured


def run_daemon(
    config: Path, state: Path, env: dict[str, str], workdir: Path, idle: float | None,
    importtime: bool = False,
) -> tuple[Sample, Path]:  # fmt: skip
    notify = NotifySocket(workdir / f"notify-{time.monotonic_ns()}.sock")
    log = workdir / f"daemon-{time.monotonic_ns()}.log"
    cmd = echo_bot_command()
    if importtime:
        cmd = [sys.executable, "-X", "importtime", "-m", "echo_bot"]
    with log.open("wb") as err:
        began = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, "run", "--config", str(config), "--state-dir", str(state)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env={**clean_env(NOTIFY_SOCKET=str(notify.path)), **env}, cwd=ROOT,
        )  # fmt: skip
        try:
            ready = notify.wait_for("READY=1", START_TIMEOUT, proc)
            rss = None
            if idle is not None:
                time.sleep(idle)
                rss = rss_mb(proc.pid)
            elif importtime:
                time.sleep(1.0)  # anything imported just after READY shows up too
        except AssertionError as exc:  # READY never came: show the daemon's log
            stop(proc)
            raise RuntimeError(f"{exc}\n{log.read_text(errors='replace')[-3000:]}") from None
        finally:
            stop(proc)
            notify.close()
    return Sample(ready - began, rss), log


def run_bare(modules: list[str], idle: float | None) -> Sample:
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "sys.stdout.write('imported\\n'); sys.stdout.flush()\n"
        "sys.stdin.read()\n"  # wait until the bench closes stdin
    )
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=clean_env(), cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        ready = time.monotonic()
        if line.strip() != b"imported":
            proc.kill()
            raise RuntimeError(f"the bare import failed: {proc.communicate(timeout=10)[1]!r}")
        rss = None
        if idle is not None:
            time.sleep(idle)
            rss = rss_mb(proc.pid)
        proc.stdin.close()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return Sample(ready - began, rss)


def imported_modules(importtime_log: Path) -> set[str]:
    names = set()
    for line in importtime_log.read_text(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name)
    return names


def third_party(modules: set[str]) -> list[str]:
    """The top-level packages among ``modules`` that come from site-packages."""
    site = {Path(p).resolve() for p in (sysconfig.get_paths()["purelib"],
                                       sysconfig.get_paths()["platlib"])}  # fmt: skip
    found = set()
    for top in {m.split(".", 1)[0] for m in modules}:
        if top in {"echo_bot", "channels", "tests"} or top.startswith("__editable__"):
            continue
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(top)
            origin = spec.origin if spec else None
            if spec and not origin and spec.submodule_search_locations:
                origin = next(iter(spec.submodule_search_locations), None)
            if origin and any(parent in site for parent in Path(origin).resolve().parents):
                found.add(top)
    return sorted(found)


@dataclass
class Measured:
    name: str
    libraries: list[str]
    watched: dict[str, bool]  # aiogram/openai imported?
    daemon: list[Sample]
    bare: list[Sample]

    @staticmethod
    def median(samples: list[Sample]) -> float:
        return statistics.median(s.start for s in samples)

    @staticmethod
    def rss(samples: list[Sample]) -> float:
        return next(s.rss for s in reversed(samples) if s.rss is not None)  # type: ignore[misc]


def measure(
    name: str, text: str, env: dict[str, str], args: argparse.Namespace, workdir: Path
) -> Measured:
    folder = workdir / name
    folder.mkdir()
    config = folder / "echo-bot.toml"
    config.write_text(text)
    state = folder / "state"
    # Unmeasured: which modules the daemon imports. This run also writes the bytecode
    # cache of every module involved (the bare import loads a subset of them) and
    # creates the store, so every measured start opens an existing one.
    _sample, log = run_daemon(config, state, env, folder, None, importtime=True)
    modules = imported_modules(log)
    libraries = third_party(modules)
    watched = {w: any(m == w or m.startswith(w + ".") for m in modules) for w in WATCHED}
    daemon: list[Sample] = []
    bare: list[Sample] = []
    for n in range(args.runs):  # alternate, so both see the same noise
        last = n == args.runs - 1
        bare.append(run_bare(libraries, args.idle if last else None))
        daemon.append(run_daemon(config, state, env, folder, args.idle if last else None)[0])
    return Measured(name, libraries, watched, daemon, bare)


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="echo-bot-footprint-"))
    peers = FakePeers()
    results: list[Measured] = []
    try:
        text, env = config_a()
        results.append(measure("a", text, env, args, workdir))
        peers.start()
        text, env = config_b(peers)
        results.append(measure("b", text, env, args, workdir))
        text, env = config_c(workdir / "notes")
        results.append(measure("c", text, env, args, workdir))
    finally:
        peers.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    a, b, c = results
    labels = {
        "a": "(a) webhook + cron, rules brain (no Telegram, no LLM)",
        "b": "(b) Telegram + webhook + cron + LLM",
        "c": "(c) as (a), plus one stdio MCP server",
    }
    targets = {
        ("a", "start"): ("< 1 s", lambda m: Measured.median(m.daemon) < 1.0),
        ("a", "rss"): ("< 80 MB", lambda m: Measured.rss(m.daemon) < 80),
        ("b", "start"): ("≤ 1.2× floor", lambda m: ratio(m, "start") <= 1.2),
        ("b", "rss"): ("≤ 1.3× floor", lambda m: ratio(m, "rss") <= 1.3),
        # Reported, no target: the daemon's own RSS (the server is a process of its own).
        ("c", "start"): ("", lambda m: True),
        ("c", "rss"): ("", lambda m: True),
    }
    rows = []
    for m in results:
        for what in ("start", "rss"):
            ours = Measured.median(m.daemon) if what == "start" else Measured.rss(m.daemon)
            floor = Measured.median(m.bare) if what == "start" else Measured.rss(m.bare)
            target, check = targets[(m.name, what)]
            spread = ""
            if what == "start" and len(m.daemon) > 1:
                spread = (
                    f" ({min(s.start for s in m.daemon):.2f}–{max(s.start for s in m.daemon):.2f})"
                )
            rows.append(
                [
                    labels[m.name],
                    "cold start to READY" if what == "start" else f"idle RSS after {args.idle:g} s",
                    (f"{ours:.2f} s" if what == "start" else f"{ours:.1f} MB") + spread,
                    f"{floor:.2f} s" if what == "start" else f"{floor:.1f} MB",
                    f"{ratio(m, what):.2f}×",
                    f"{target} — {'met' if check(m) else 'MISSED'}" if target else "—",
                ]
            )
    print(
        f"footprint: {args.runs} cold start(s) per command (median; range), bytecode cached, "
        f"{echo_bot_command()[-1].rsplit('/', 1)[-1]} run vs python -c 'import …'\n"
    )
    print(
        table(
            ["configuration", "measure", "echo-bot run", "bare import floor", "ratio", "target"],
            rows,
        )
    )
    print()
    print(
        "- (a) imports aiogram: "
        + ("YES" if a.watched["aiogram"] else "no")
        + "; openai: "
        + ("YES" if a.watched["openai"] else "no")
        + f" — (b) imports aiogram: {'yes' if b.watched['aiogram'] else 'NO'}, "
        + f"openai: {'yes' if b.watched['openai'] else 'NO'}"
        + f" — mcp: (a) {'YES' if a.watched['mcp'] else 'no'}, (b)"
        f" {'YES' if b.watched['mcp'] else 'no'}, (c) {'yes' if c.watched['mcp'] else 'NO'}"
    )
    for m in results:
        print(f"- ({m.name}) floor imports: {', '.join(m.libraries)}")
    return 0


def ratio(m: Measured, what: str) -> float:
    if what == "start":
        floor = Measured.median(m.bare)
        return Measured.median(m.daemon) / floor if floor else 0.0
    floor = Measured.rss(m.bare)
    return Measured.rss(m.daemon) / floor if floor else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 start per command, 2 s idle")
    parser.add_argument("--runs", type=int, help="cold starts per command (5)")
    parser.add_argument("--idle", type=float, help="seconds idle before reading RSS (10)")
    args = parser.parse_args(argv)
    args.runs = max(1, min(args.runs or (1 if args.quick else 5), 20))
    args.idle = max(
        0.5, min(args.idle if args.idle is not None else (2 if args.quick else 10), 120)
    )
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
