"""Telegram bursts: many replies at once through the real channel, against the limits.

In one process: the fake Bot API server (``tests/fakes/telegram_api.py``) with
``enforce_limits=True`` — more than about 1 message/s per chat (bursts of 3) or 30/s
overall is answered 429 with ``retry_after``, as Telegram does — and the real core with the
Telegram channel on, talking to it through the real aiogram client. Each case commits
its replies to the outbox at once (``bus.send``), then waits until the fake has shown all
of them; the delivery worker and the channel's pacer do the rest.

Cases: 100 replies to one chat; 300 replies spread over 30 chats (10 each).
Prints the time to deliver all, the sends made, the 429s received, the messages lost
(never shown) and the duplicates (shown more than once), and whether each chat's
replies arrived in order.

    python bench/telegram_burst.py           # the full cases (about 2 minutes: 1 msg/s)
    python bench/telegram_burst.py --quick   # 6 to one chat, 30 over 10 chats (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import shutil
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from echo_bot.app import Daemon  # noqa: E402
from echo_bot.config import LoadedConfig, parse_config  # noqa: E402
from echo_bot.events import Address, OutboundMessage  # noqa: E402
from echo_bot.runtime import build  # noqa: E402
from tests.fakes.telegram_api import FakeTelegramAPI  # noqa: E402

TOKEN = "123456:BENCH-burst-token"
FIRST_CHAT = 5000


@dataclass
class Outcome:
    name: str
    messages: int
    chats: int
    seconds: float
    sends: int  # sendMessage calls the fake answered (429s included)
    rate_limited: int  # 429 answers
    lost: int
    duplicates: int
    out_of_order: int  # chats whose replies arrived out of order
    timed_out: bool

    @property
    def share_429(self) -> float:
        return self.rate_limited / self.sends if self.sends else 0.0


def config_text(api: FakeTelegramAPI, allowed: list[int]) -> str:
    return f"""
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{", ".join(str(u) for u in allowed)}]

[http]
host = "127.0.0.1"
port = 0

[brain]
kind = "rules"
"""


async def burst(
    name: str,
    bus: object,
    api: FakeTelegramAPI,
    chats: list[int],
    per_chat: int,
    timeout: float,
) -> Outcome:
    """Commit ``per_chat`` replies to each chat at once; wait until all were shown."""
    tag = f"{name}-{time.time_ns()}"
    expected: dict[str, int] = {}
    order: dict[int, list[str]] = {}
    messages = []
    for n in range(per_chat):  # interleaved, as replies of many turns would be
        for chat in chats:
            text = f"{tag} chat {chat} reply {n}"
            expected[text] = chat
            order.setdefault(chat, []).append(text)
            messages.append(
                OutboundMessage(to=Address(channel="telegram", chat_id=str(chat)), text=text)
            )
    calls_before = len(api.calls)
    limited_before = api.rate_limited
    began = time.monotonic()
    for message in messages:
        await bus.send(message)  # type: ignore[attr-defined]

    def shown() -> list[str]:
        return [t for t in api.sent_texts() if t.startswith(tag)]

    deadline = began + timeout
    timed_out = False
    while len(set(shown())) < len(expected):
        if time.monotonic() > deadline:
            timed_out = True
            break
        await asyncio.sleep(0.02)
    seconds = time.monotonic() - began
    await asyncio.sleep(0.5)  # a late duplicate would show up now
    texts = shown()
    counts = collections.Counter(texts)
    sends = [c for c in api.calls[calls_before:] if c.method == "sendMessage"]
    out_of_order = 0
    for chat, wanted in order.items():
        seen = [t for t in dict.fromkeys(texts) if expected[t] == chat]
        if seen != wanted[: len(seen)]:
            out_of_order += 1
    return Outcome(
        name=name,
        messages=len(expected),
        chats=len(chats),
        seconds=seconds,
        sends=len(sends),
        rate_limited=api.rate_limited - limited_before,
        lost=sum(1 for t in expected if t not in counts),
        duplicates=sum(n - 1 for n in counts.values() if n > 1),
        out_of_order=out_of_order,
        timed_out=timed_out,
    )


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


async def amain(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="echo-bot-burst-"))
    cases = [
        ("one chat", [FIRST_CHAT], args.one_chat),
        (
            "spread",
            [FIRST_CHAT + 1 + n for n in range(args.spread_chats)],
            max(1, args.spread // args.spread_chats),
        ),
    ]
    allowed = sorted({chat for _name, chats, _n in cases for chat in chats})
    results: list[Outcome] = []
    try:
        async with FakeTelegramAPI(token=TOKEN, enforce_limits=True) as api:
            config = parse_config(tomllib.loads(config_text(api, allowed)), "bench")
            environ = {"TELEGRAM_BOT_TOKEN": TOKEN}
            state = workdir / "state"
            state.mkdir()
            runtime = build(LoadedConfig(config=config, path=None), state, environ)
            daemon = Daemon(
                runtime,
                channel_names=["telegram"],
                channel_options={"telegram": {"poll_timeout": 1}},
                banner=False,
            )
            run = asyncio.create_task(daemon.run())
            try:
                async with asyncio.timeout(30):
                    bus = await daemon.wait_started()
                for name, chats, per_chat in cases:
                    # Let the limits' buckets fill again between the cases.
                    await asyncio.sleep(args.pause)
                    timeout = per_chat * 3.0 + len(chats) * per_chat / 10 + 30
                    results.append(await burst(name, bus, api, chats, per_chat, timeout))
            finally:
                daemon.request_stop()
                await asyncio.wait_for(run, 30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    header = [
        "case", "replies", "chats", "time to deliver all (s)", "msgs/s", "sendMessage calls",
        "429s", "429s / sends", "lost", "duplicates", "chats out of order",
    ]  # fmt: skip
    rows = [
        [
            r.name,
            str(r.messages),
            str(r.chats),
            f"{r.seconds:.1f}" + (" (timed out)" if r.timed_out else ""),
            f"{r.messages / r.seconds:.1f}" if r.seconds else "",
            str(r.sends),
            str(r.rate_limited),
            f"{100 * r.share_429:.1f}%",
            str(r.lost),
            str(r.duplicates),
            str(r.out_of_order),
        ]
        for r in results
    ]
    print("telegram burst: real TelegramChannel (aiogram) → fake Bot API with Telegram's limits\n")
    print(table(header, rows))
    print()
    ok = all(
        r.lost == 0 and r.duplicates == 0 and r.share_429 <= 0.01 and not r.timed_out
        for r in results
    )
    print(
        "Targets: 0 lost, 0 duplicated, 429s ≤ 1% of sends — "
        + ("met." if ok else "MISSED.")
        + " The limits: 1 msg/s per chat (bursts of 3), 30 msg/s overall, so the floor is"
        + " about (n − 3) s for n replies to one chat and n / 30 s overall."
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small bursts (a few seconds)")
    parser.add_argument("--one-chat", type=int, help="replies to one chat (100)")
    parser.add_argument("--spread", type=int, help="replies spread over the chats (300)")
    parser.add_argument("--spread-chats", type=int, help="chats to spread over (30)")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between cases")
    args = parser.parse_args(argv)
    defaults = (6, 30, 10) if args.quick else (100, 300, 30)
    args.one_chat = max(1, min(args.one_chat or defaults[0], 1000))
    args.spread = max(1, min(args.spread or defaults[1], 3000))
    args.spread_chats = max(1, min(args.spread_chats or defaults[2], 300))
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 1


if __name__ == "__main__":
    sys.exit(main())
