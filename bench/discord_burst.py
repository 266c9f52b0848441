"""Discord bursts: many messages in over the gateway, each answered, against Discord's
limits.

In one process: the fake Discord (``tests/fakes/discord_api.py``) answering posts past
5 per 5 s in a channel with HTTP 429 (and the bucket's headers on every answer, as
Discord sends them), and the real core with the Discord channel (SQLite in a temp dir,
the offline rules brain), talking to it through the real discord.py. People send their
messages as fast as the fake dispatches them; every message is answered.

Cases: one person's burst in one direct message; the same spread over many people's
direct messages. Prints per case: messages, the time until all were answered, the
inbounds the store took (lost: sent but never stored), the answers seen (duplicates:
more than one for a message), the posts made, the 429s among them and their share (the
target: at most 1 %), and failed replies.

    python bench/discord_burst.py            # 60 in one DM, 120 over 10 DMs (about 80 s)
    python bench/discord_burst.py --quick    # 8 in one DM, 40 over 10 DMs (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.burst_table import report, stored  # noqa: E402
from echo_bot.brains.rules import no_match_hint  # noqa: E402
from tests.conftest import running_bot  # noqa: E402
from tests.fakes.discord_api import FakeDiscord, dm_of, user  # noqa: E402

POSTS, WINDOW = 5, 5.0  # posts per channel per window, as Discord allows


def person(index: int) -> str:
    return f"17000000000000{index:05d}"


async def burst(work: Path, name: str, messages: int, people: int) -> dict[str, object]:
    users = [person(i) for i in range(people)]
    async with FakeDiscord() as discord:
        discord.limit_posts(POSTS, WINDOW)
        config = f"""
[discord]
enabled = true
proxy = "{discord.proxy_url}"
ca_file = "{discord.ca_file}"
allowed_users = [{", ".join(f'"{u}"' for u in users)}]
"""
        env = {"DISCORD_BOT_TOKEN": discord.token}
        async with running_bot(work / name, config, environ=env, channels=["discord"]) as bot:
            while not discord.connected.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            channels = {dm_of(u) for u in users}

            def answers() -> int:
                return sum(
                    1 for s in discord.sent
                    if s.channel_id in channels and s.content == no_match_hint("!")
                )  # fmt: skip

            started = time.monotonic()
            for index in range(messages):
                who = users[index % people]
                await discord.push_message(f"zz message {index}", author=user(who, "p"),
                                           channel_id=dm_of(who))  # fmt: skip
            sent_in = time.monotonic() - started
            deadline = time.monotonic() + 60 + 2 * messages / people
            while answers() < messages and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            await asyncio.sleep(1.5)  # a duplicate would show by now

            rows, failed = await stored(bot.store, "discord", messages)
            seen = answers()
        posts = discord.calls_to("POST /channels/{id}/messages")
    limited = sum(1 for c in posts if c.status == 429)
    return {
        "case": name, "messages": messages, "people": people, "sent_in": sent_in,
        "answered_in": took, "stored": rows, "lost": messages - rows,
        "duplicates": max(0, seen - messages), "answers": seen, "sends": len(posts),
        "refused": limited, "failed": failed,
    }  # fmt: skip


async def amain(args: argparse.Namespace) -> int:
    one, spread, spread_people = (8, 40, 10) if args.quick else (60, 120, 10)
    with tempfile.TemporaryDirectory(prefix="echo-bot-discord-burst-") as tmp:
        work = Path(tmp)
        outcomes = [
            await burst(work, "one DM", one, 1),
            await burst(work, f"over {spread_people} DMs", spread, spread_people),
        ]
    print(f"fake Discord: {POSTS} posts per {WINDOW:g} s per channel (HTTP 429 past it, "
          "the bucket's headers on every answer); discord.py; rules brain.\n")  # fmt: skip
    return 0 if report(outcomes, quick=args.quick) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small bursts (seconds)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
