"""Slack bursts: many messages in over Socket Mode, each answered, against Slack's limits.

In one process: the fake Slack (``tests/fakes/slack_api.py``) answering
``chat.postMessage`` with HTTP 429 and ``Retry-After`` past about one message a second
per conversation (bursts of 3), as Slack does, and the real core with the Slack channel
in Socket Mode (SQLite in a temp dir, the offline rules brain), talking to it through
the real slack-sdk. People send their messages as fast as the fake delivers envelopes;
every message is answered.

Cases: one person's burst in one direct message; the same number spread over many
people's direct messages. Prints per case: messages, the time until all were answered,
the inbounds the store took (lost: sent but never stored), the answers seen
(duplicates: more than one for a message), the posts made, the 429s among them and
their share (the target: at most 1 %), and failed replies.

    python bench/slack_burst.py            # 60 in one DM, 300 over 30 DMs (about 70 s)
    python bench/slack_burst.py --quick    # 8 in one DM, 40 over 10 DMs (seconds)
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
from tests.fakes.slack_api import FakeSlack  # noqa: E402

PER_SECOND, BURST = 1.0, 3  # chat.postMessage per conversation, as Slack allows


def person(index: int) -> str:
    return f"U{index:07d}"


async def burst(work: Path, name: str, messages: int, people: int) -> dict[str, object]:
    users = [person(i) for i in range(people)]
    async with FakeSlack() as slack:
        slack.rate_limit("chat.postMessage", per_second=PER_SECOND, burst=BURST)
        slack.ack_timeout = 30.0  # a slow ack is not redelivered within the case
        config = f"""
[slack]
enabled = true
api_base = "{slack.base_url}"
allowed_users = [{", ".join(f'"{u}"' for u in users)}]
"""
        env = {"SLACK_BOT_TOKEN": slack.bot_token, "SLACK_APP_TOKEN": slack.app_token}
        async with running_bot(work / name, config, environ=env, channels=["slack"]) as bot:
            await slack.wait_connected()
            channels = [slack.dm_channel(u) for u in users]

            def answers() -> int:
                return sum(
                    1 for c in channels for m in slack.messages.get(c, [])
                    if m.get("text") == no_match_hint("!")  # Slack types !help
                )  # fmt: skip

            started = time.monotonic()
            for index in range(messages):
                who = index % people
                await slack.push_message(f"zz message {index}", user=users[who],
                                         channel=channels[who])  # fmt: skip
            sent_in = time.monotonic() - started
            deadline = time.monotonic() + 60 + 2 * messages / people
            while answers() < messages and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            await asyncio.sleep(1.5)  # a duplicate would show by now

            rows, failed = await stored(bot.store, "slack", messages)
            seen = answers()
        posts = slack.calls_to("chat.postMessage")
    limited = sum(1 for c in posts if c.status == 429)
    return {
        "case": name, "messages": messages, "people": people, "sent_in": sent_in,
        "answered_in": took, "stored": rows, "lost": messages - rows,
        "duplicates": max(0, seen - messages), "answers": seen, "sends": len(posts),
        "refused": limited, "failed": failed,
    }  # fmt: skip


async def amain(args: argparse.Namespace) -> int:
    one, spread, spread_people = (8, 40, 10) if args.quick else (60, 300, 30)
    with tempfile.TemporaryDirectory(prefix="echo-bot-slack-burst-") as tmp:
        work = Path(tmp)
        outcomes = [
            await burst(work, "one DM", one, 1),
            await burst(work, f"over {spread_people} DMs", spread, spread_people),
        ]
    print(f"fake Slack: chat.postMessage {PER_SECOND:g}/s per conversation after a burst of "
          f"{BURST} (HTTP 429 with Retry-After past it); Socket Mode; rules brain.\n")  # fmt: skip
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
