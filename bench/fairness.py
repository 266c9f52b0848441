"""Fairness under one chat's burst: typing indicators and other chats' reply latency.

A real ``python -m echo_bot run`` (a subprocess) with the Telegram channel and the LLM
brain, against two fake peers started in this process on 127.0.0.1: the fake Bot API
(``tests/fakes/telegram_api.py``, ``enforce_limits=True``: Telegram's 1 msg/s per chat,
30/s overall) and the fake OpenAI-compatible server (``tests/fakes/openai_api.py``),
which answers every completion after ``--llm-latency`` seconds. Each case starts a fresh
daemon on a fresh state directory.

(a) typing: ``--typing-messages`` messages from one chat at once; for ``--window``
    seconds the script counts the ``sendChatAction`` calls the fake saw for that chat:
    in all, per second, and the shortest gap between two of them.
(b) latency: ``--burst`` messages from chat A at once, then ``/tools`` from ``--probes``
    other chats, one every ``--probe-every`` seconds (the first right behind the burst):
    the time from each ``/tools`` reaching the fake to its reply being shown, with
    percentiles; and how many of A's replies went out meanwhile.

    python bench/fairness.py           # 300 messages / 15 s; 3,000-message burst, 20 probes
    python bench/fairness.py --quick   # 60 messages / 6 s; 500-message burst, 5 probes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402
from tests.fakes.openai_api import FakeOpenAI, Reply  # noqa: E402
from tests.fakes.telegram_api import Call, FakeTelegramAPI  # noqa: E402

TOKEN = "123456:BENCH-fairness-token"
CHAT_A = 6000
FIRST_PROBE = 6100
RTT_METHODS = ("getUpdates", "sendMessage", "sendChatAction")
RTT_CALLS = 50_000  # more than any case makes
TYPING_WINDOW = 5.0  # "at most one typing per chat per this many seconds"


def config_text(api: FakeTelegramAPI, llm: FakeOpenAI, allowed: list[int]) -> str:
    return f"""
[bot]
shutdown_timeout = "2s"

[brain]
kind = "openai"

[openai]
base_url = "{llm.base_url}"
model = "fake-model"
max_retries = 0

[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{", ".join(str(u) for u in allowed)}]

[http]
host = "127.0.0.1"
port = {free_port()}
"""


class Daemon:
    """``echo-bot run`` as a subprocess; stderr to a file (never a pipe that could fill)."""

    def __init__(self, workdir: Path, config: str, name: str) -> None:
        self.state = workdir / f"state-{name}"
        self.state.mkdir()
        self.config = workdir / f"{name}.toml"
        self.config.write_text(config)
        self.log = workdir / f"daemon-{name}.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float = 60.0) -> None:
        keep = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR"}
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update({"PYTHONUNBUFFERED": "1", "TELEGRAM_BOT_TOKEN": TOKEN})
        env["OPENAI_API_KEY"] = "sk-bench"
        with self.log.open("w") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "echo_bot", "run",
                "--config", str(self.config), "--state-dir", str(self.state),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=err, env=env, cwd=ROOT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if any(line.startswith("stop with") for line in text.splitlines()):
                return
            if self.proc.returncode is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{text[-3000:]}")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"daemon not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


@contextlib.asynccontextmanager
async def peers(latency: float, rtt: float) -> Any:
    async def slow_reply(body: dict[str, Any]) -> Reply:
        await asyncio.sleep(latency)
        return Reply("ok, noted.")

    async with (
        FakeTelegramAPI(token=TOKEN, enforce_limits=True) as api,
        FakeOpenAI(api_key="sk-bench", model="fake-model") as llm,
    ):
        llm.responder = slow_reply
        for method in RTT_METHODS:  # the way to api.telegram.org and back
            api.delay_next(method, rtt, count=RTT_CALLS)
        yield api, llm


def chat_of(call: Call) -> int:
    return int(call.params.get("chat_id", 0))


def typing_calls(api: FakeTelegramAPI, chat: int) -> list[Call]:
    return [c for c in api.calls_of("sendChatAction") if chat_of(c) == chat]


def shown(api: FakeTelegramAPI, chat: int) -> list[Call]:
    return [c for c in api.calls_of("sendMessage") if c.ok and chat_of(c) == chat]


@dataclass
class TypingOutcome:
    messages: int
    window: float
    calls: int
    shortest_gap: float | None
    replies: int


async def typing_case(workdir: Path, args: argparse.Namespace) -> TypingOutcome:
    async with peers(args.llm_latency, args.rtt) as (api, llm):
        daemon = Daemon(workdir, config_text(api, llm, [CHAT_A]), "typing")
        await daemon.start()
        try:
            began = time.monotonic()
            for n in range(args.typing_messages):
                api.push_message(f"burst {n}", user_id=CHAT_A)
            await asyncio.sleep(args.window)
            end = time.monotonic()
        finally:
            await daemon.stop()
        calls = [c.at for c in typing_calls(api, CHAT_A) if began <= c.at <= end]
        replies = sum(1 for c in shown(api, CHAT_A) if began <= c.at <= end)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    return TypingOutcome(
        messages=args.typing_messages,
        window=end - began,
        calls=len(calls),
        shortest_gap=min(gaps) if gaps else None,
        replies=replies,
    )


@dataclass
class LatencyOutcome:
    burst: int
    latencies: list[float]  # per probe, in the order sent; inf when never answered
    first_taken: float  # until the first probe's update was acknowledged (committed)
    after_taken: list[float]  # per probe: from its inbox row's received_at to its reply
    a_replies: int  # replies to A shown while the probes ran
    a_typing: int  # sendChatAction calls for A meanwhile
    seconds: float


async def latency_case(workdir: Path, args: argparse.Namespace) -> LatencyOutcome:
    probes = [FIRST_PROBE + n for n in range(args.probes)]
    async with peers(args.llm_latency, args.rtt) as (api, llm):
        daemon = Daemon(workdir, config_text(api, llm, [CHAT_A, *probes]), "latency")
        await daemon.start()
        try:
            began = time.monotonic()
            for n in range(args.burst):
                api.push_message(f"burst {n}", user_id=CHAT_A)
            sent: dict[int, float] = {}
            first_update = 0
            for index, chat in enumerate(probes):
                if index:
                    await asyncio.sleep(args.probe_every)
                update_id = api.push_message("/tools", user_id=chat)
                first_update = first_update or update_id
                sent[chat] = time.monotonic()
            answered: dict[int, float] = {}
            seen = 0
            deadline = time.monotonic() + args.probe_timeout
            while len(answered) < len(probes):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
                calls, seen = api.calls[seen:], len(api.calls)  # only the new ones
                for call in calls:
                    chat = chat_of(call) if call.method == "sendMessage" else 0
                    if chat in sent and call.ok and chat not in answered:
                        answered[chat] = call.at
            end = time.monotonic()
        finally:
            await daemon.stop()
        latencies = [answered.get(c, float("inf")) - sent[c] for c in probes]
        to_wall = time.time() - time.monotonic()
        received = received_at(daemon.state, probes)
        after_taken = [
            answered[c] + to_wall - received[c] if c in answered and c in received else float("inf")
            for c in probes
        ]
        acked = [
            c.at
            for c in api.calls_of("getUpdates")
            if int(c.params.get("offset") or 0) > first_update
        ]
        taken = acked[0] - sent[probes[0]] if acked else float("inf")
        a_replies = sum(1 for c in shown(api, CHAT_A) if c.at <= end)
        a_typing = sum(1 for c in typing_calls(api, CHAT_A) if c.at <= end)
    return LatencyOutcome(
        args.burst, latencies, taken, after_taken, a_replies, a_typing, end - began
    )


def received_at(state: Path, chats: list[int]) -> dict[int, float]:
    """When each chat's first message was taken in (its inbox row), wall clock."""
    db = sqlite3.connect(state / "echo-bot.sqlite3")
    try:
        rows = db.execute(
            "SELECT session_key, MIN(received_at) FROM inbox WHERE channel = 'telegram' "
            "GROUP BY session_key"
        ).fetchall()
    finally:
        db.close()
    by_key = {str(key): float(at) for key, at in rows}
    return {c: by_key[f"telegram:{c}"] for c in chats if f"telegram:{c}" in by_key}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def seconds(value: float) -> str:
    return "never" if value == float("inf") else f"{value:.2f}"


def report(typing: TypingOutcome, latency: LatencyOutcome, args: argparse.Namespace) -> str:
    gap = "" if typing.shortest_gap is None else f"{typing.shortest_gap:.2f}"
    per_second = typing.calls / typing.window if typing.window else 0.0
    typing_header = [
        "case", "messages", "window (s)", "sendChatAction", "per s",
        "shortest gap (s)", "replies shown",
    ]  # fmt: skip
    typing_row = [
        "one chat", str(typing.messages), f"{typing.window:.1f}", str(typing.calls),
        f"{per_second:.2f}", gap, str(typing.replies),
    ]  # fmt: skip
    lat = latency.latencies
    latency_header = [
        "case", "burst", "probes", "first probe", "its update acknowledged", "p50", "p90",
        "max", "after taken in: p50", "p90", "max", "A replies meanwhile",
        "A typing meanwhile",
    ]  # fmt: skip
    after = latency.after_taken
    latency_row = [
        "burst then /tools", str(latency.burst), str(len(lat)), seconds(lat[0]),
        seconds(latency.first_taken), seconds(percentile(lat, 50)),
        seconds(percentile(lat, 90)), seconds(max(lat)), seconds(percentile(after, 50)),
        seconds(percentile(after, 90)), seconds(max(after)), str(latency.a_replies),
        str(latency.a_typing),
    ]  # fmt: skip
    out = [
        f"fairness: real echo-bot run (Telegram + LLM brain, fake peers on loopback), "
        f"LLM latency {args.llm_latency:.2f} s, Bot API round trip {args.rtt:.2f} s\n",
        "(a) typing indicators while one chat's burst runs\n",
        table(typing_header, [typing_row]),
        "",
        "(b) another chat's /tools behind one chat's burst (seconds to its reply)\n",
        table(latency_header, [latency_row]),
        "",
        f"Target: at most 1 typing per chat per {TYPING_WINDOW:.0f} s; another chat's reply "
        "about one turn late, not behind the burst.",
    ]
    return "\n".join(out)


def dump_logs(workdir: Path) -> None:
    for log in sorted(workdir.glob("daemon-*.log")):
        print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)


async def amain(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="echo-bot-fairness-"))
    try:
        typing = await typing_case(workdir, args)
        latency = await latency_case(workdir, args)
    except Exception:
        dump_logs(workdir)
        raise
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(typing, latency, args))
    if args.keep:
        print(f"\nstate and logs kept in {workdir}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small and short (the smoke test)")
    parser.add_argument("--typing-messages", type=int, default=300)
    parser.add_argument("--window", type=float, default=15.0, help="seconds watched in (a)")
    parser.add_argument("--burst", type=int, default=3000, help="chat A's messages in (b)")
    parser.add_argument("--probes", type=int, default=20, help="/tools from other chats in (b)")
    parser.add_argument("--probe-every", type=float, default=1.0)
    parser.add_argument("--probe-timeout", type=float, default=120.0)
    parser.add_argument("--llm-latency", type=float, default=0.2, help="seconds per completion")
    parser.add_argument(
        "--rtt", type=float, default=0.1, help="seconds the fake Bot API takes to answer"
    )
    parser.add_argument("--keep", action="store_true", help="keep the state dirs and logs")
    args = parser.parse_args()
    if args.quick:
        args.typing_messages, args.window = 60, 6.0
        args.burst, args.probes, args.probe_timeout = 500, 5, 60.0
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
