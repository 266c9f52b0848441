"""Streamed replies: what a reply growing in the chat costs, against Telegram's limits.

In one process: the fake OpenAI server streams a reply (``--chars`` characters, about
4 a token, ``--tokens-per-second``), the real core with the Telegram channel asks it
through the real openai SDK, and the real aiogram client shows the reply as it grows to
the fake Bot API, which enforces Telegram's limits (1 message/s per chat with bursts of
3, 30/s overall, 20/minute in a group; drafts and edits counted like messages: the
strict assumption, Telegram does not document theirs) and answers 429 beyond them.

Cases: one private chat (drafts); one group (one message edited as it grows, which
becomes the reply); and ``--chats`` private chats streaming at once while each also
gets ``--extra`` ordinary messages (the real messages a preview must never delay).
Prints, per case: the drafts or edits made, per reply and per second, the 429s, the
final messages (one per reply is right), the time from the first token to the first
preview, and how late the ordinary messages were against the same case run with
streaming off (the baseline, measured in the same run).

    python bench/stream_previews.py            # 2,000 characters at 40 tokens/s
    python bench/stream_previews.py --quick    # 600 characters at 200 tokens/s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import statistics
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
from tests.fakes.openai_api import FakeOpenAI, Hang, Reply  # noqa: E402
from tests.fakes.telegram_api import FakeTelegramAPI  # noqa: E402

TOKEN = "123456:BENCH-stream-token"
FIRST_USER = 7000
CHARS_PER_TOKEN = 4


@dataclass
class Outcome:
    name: str
    replies: int
    previews: int  # drafts or edits accepted
    seconds: float  # first request to the last final reply
    rate_limited: int
    finals: int  # final reply messages (sendMessage, or the edit that made the reply)
    first_preview: float | None  # seconds from the first token to the first preview
    extra_delays: list[float]  # ordinary messages: commit to shown, seconds


def answer_text(chars: int, tag: str) -> str:
    words = []
    while len(" ".join(words)) < chars:
        words.append(f"{tag}w{len(words)}")
    return " ".join(words)[:chars]


def config_text(api: FakeTelegramAPI, llm: FakeOpenAI, allowed: list[int], stream: bool) -> str:
    return f"""
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{", ".join(str(u) for u in allowed)}]
[openai]
base_url = "{llm.base_url}"
model = "bench"
max_retries = 0
timeout = "60s"
stream = {"true" if stream else "false"}
[brain]
kind = "openai"
"""


async def run_case(
    name: str,
    api: FakeTelegramAPI,
    llm: FakeOpenAI,
    bus: object,
    users: list[int],
    *,
    group: bool,
    chars: int,
    extra: int,
    streaming: bool,
) -> Outcome:
    tag = f"c{time.time_ns() % 10**8}"
    answers = {user: answer_text(chars, f"{tag}u{user}") for user in users}
    for user in users:
        if llm.stream_delay and not streaming:
            # Not streamed, the whole answer still takes the model as long to write.
            events = len(answers[user]) / CHARS_PER_TOKEN + 3
            llm.enqueue(Hang(events * llm.stream_delay, then=Reply(answers[user])))
        else:
            llm.reply(answers[user])
    drafts_before, calls_before, limited_before = len(api.drafts), len(api.calls), api.rate_limited
    streamed_before = llm.stream_events
    requests_before = len(llm.chat_requests())
    began = time.monotonic()
    for user in users:
        if group:
            api.push_message(f"@echo_test_bot story {tag}", user_id=user, chat_type="group")
        else:
            api.push_message(f"story {tag}", user_id=user)
    # Ordinary messages to the same chats while the replies stream: each must be shown
    # as soon as the chat's own budget allows, previews or not.
    await llm.wait_until(
        lambda: llm.stream_events > streamed_before or len(llm.chat_requests()) > requests_before,
        timeout=60,
    )
    first_token = time.monotonic()
    extra_texts: dict[str, float] = {}
    for n in range(extra):
        for user in users:
            chat = -(10**12 + user) if group else user
            text = f"{tag} notice {n} for {user}"
            extra_texts[text] = time.monotonic()
            await bus.send(  # type: ignore[attr-defined]
                OutboundMessage(to=Address(channel="telegram", chat_id=str(chat)), text=text)
            )
        await asyncio.sleep(1.5)
    shown_at: dict[str, float] = {}
    deadline = time.monotonic() + 120
    finals: set[str] = set()
    while time.monotonic() < deadline:
        for call in api.calls[calls_before:]:
            if not call.ok or call.method not in ("sendMessage", "editMessageText"):
                continue
            text = str(call.params.get("text", ""))
            if text in extra_texts and text not in shown_at:
                shown_at[text] = call.at
            if text in answers.values():
                finals.add(text)
        if len(finals) == len(users) and len(shown_at) == len(extra_texts):
            break
        await asyncio.sleep(0.05)
    seconds = time.monotonic() - began
    await asyncio.sleep(1.0)  # a duplicate would show up now
    new_calls = api.calls[calls_before:]
    final_messages = sum(
        1
        for c in new_calls
        if c.ok
        and c.method in ("sendMessage", "editMessageText")
        and c.params.get("text") in answers.values()
    )
    edits = [
        c
        for c in new_calls
        if c.ok and c.method == "editMessageText" and c.params.get("text") not in answers.values()
    ]
    preview_sends = [
        c
        for c in new_calls
        if c.ok and c.method == "sendMessage" and str(c.params.get("text", "")).endswith("✍️")
    ]
    drafts = api.drafts[drafts_before:]
    previews = len(drafts) + len(edits) + len(preview_sends)
    firsts = [d["at"] for d in drafts] + [c.at for c in edits + preview_sends]
    return Outcome(
        name=name,
        replies=len(users),
        previews=previews,
        seconds=seconds,
        rate_limited=api.rate_limited - limited_before,
        finals=final_messages,
        first_preview=(min(firsts) - first_token) if firsts else None,
        extra_delays=[shown_at[t] - extra_texts[t] for t in shown_at],
    )


async def measure(args: argparse.Namespace, stream: bool, workdir: Path) -> list[Outcome]:
    users = [FIRST_USER + n for n in range(max(args.chats, 1) + 2)]
    async with FakeTelegramAPI(token=TOKEN, enforce_limits=True) as api, FakeOpenAI() as llm:
        llm.stream_chunk_chars = CHARS_PER_TOKEN
        llm.stream_delay = 1.0 / args.tokens_per_second
        config = parse_config(tomllib.loads(config_text(api, llm, users, stream)), "bench")
        environ = {"TELEGRAM_BOT_TOKEN": TOKEN}
        state = workdir / ("stream" if stream else "plain")
        state.mkdir()
        runtime = build(LoadedConfig(config=config, path=None), state, environ)
        daemon = Daemon(
            runtime,
            channel_names=["telegram"],
            channel_options={"telegram": {"poll_timeout": 1}},
            banner=False,
        )
        run = asyncio.create_task(daemon.run())
        results = []
        try:
            async with asyncio.timeout(30):
                bus = await daemon.wait_started()
            cases = [
                ("private chat", users[:1], False, 0),
                ("group", users[1:2], True, 0),
                (f"{args.chats} private chats + messages", users[2:], False, args.extra),
            ]
            for name, chosen, group, extra in cases:
                await asyncio.sleep(args.pause)  # the limits' buckets fill again
                results.append(
                    await run_case(
                        name,
                        api,
                        llm,
                        bus,
                        chosen,
                        group=group,
                        chars=args.chars,
                        extra=extra,
                        streaming=stream,
                    )
                )
        finally:
            daemon.request_stop()
            await asyncio.wait_for(run, 30)
    return results


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def delay_text(delays: list[float]) -> str:
    if not delays:
        return "–"
    ordered = sorted(delays)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"{statistics.median(ordered):.2f} / {p95:.2f}"


async def amain(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.ERROR)
    workdir = Path(tempfile.mkdtemp(prefix="echo-bot-stream-"))
    try:
        streamed = await measure(args, True, workdir)
        plain = await measure(args, False, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    header = [
        "case", "replies", "drafts or edits", "per reply", "per second", "429s",
        "final messages", "first token → first preview (s)", "time to all replies (s)",
        "messages beside: delay p50 / p95 (s)", "same, stream off (s)",
    ]  # fmt: skip
    rows = []
    for s, p in zip(streamed, plain, strict=True):
        rows.append(
            [
                s.name,
                str(s.replies),
                str(s.previews),
                f"{s.previews / s.replies:.1f}",
                f"{s.previews / s.seconds:.2f}" if s.seconds else "",
                str(s.rate_limited),
                str(s.finals),
                f"{s.first_preview:.2f}" if s.first_preview is not None else "–",
                f"{s.seconds:.1f} (off: {p.seconds:.1f})",
                delay_text(s.extra_delays),
                delay_text(p.extra_delays),
            ]
        )
    print(
        f"streamed replies: {args.chars} characters at {args.tokens_per_second:g} tokens/s "
        f"({CHARS_PER_TOKEN} characters a token), real TelegramChannel → fake Bot API with "
        "Telegram's limits (drafts and edits counted like messages)\n"
    )
    print(table(header, rows))
    print()
    ok = all(s.rate_limited == 0 and s.finals == s.replies for s in streamed)
    print("Targets: no 429, one final message per reply — " + ("met." if ok else "MISSED."))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short reply, fast (seconds)")
    parser.add_argument("--chars", type=int, help="characters of each reply (2000)")
    parser.add_argument("--tokens-per-second", type=float, help="the model's pace (40)")
    parser.add_argument("--chats", type=int, help="private chats streaming at once (3)")
    parser.add_argument("--extra", type=int, help="ordinary messages to each of them (3)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between cases")
    args = parser.parse_args(argv)
    defaults = (600, 200.0, 2, 2) if args.quick else (2000, 40.0, 3, 3)
    args.chars = max(50, min(args.chars or defaults[0], 20_000))
    args.tokens_per_second = max(1.0, min(args.tokens_per_second or defaults[1], 10_000.0))
    args.chats = max(1, min(args.chats or defaults[2], 50))
    args.extra = max(0, min(args.extra if args.extra is not None else defaults[3], 20))
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 1


if __name__ == "__main__":
    sys.exit(main())
