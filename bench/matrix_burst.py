"""Matrix bursts: many messages in, each answered, against a homeserver that rate-limits.

In one process: a real Synapse (started here, as the tests start it:
``tests/matrix_server.py``; ``ECHO_BOT_SYNAPSE_PYTHON`` or ``.ci/synapse``'s venv) whose
``rc_message`` lets each account send one message a second after a burst of 10 (the
bot's replies are paced by that), the real core with the Matrix channel on (SQLite in a
temp dir, the offline rules brain), and a person on a matrix-nio client with E2EE in an
encrypted room, as in Element. The person (an admin, their own rate limit lifted) sends
the burst as fast as the homeserver takes it; every message is answered.

Prints, per case: messages sent, the time until all were answered, the inbounds the
store took (lost: sent but never stored), the answers the person saw (duplicates: more
than were asked for), the ``M_LIMIT_EXCEEDED`` answers the bot received (each waited
out by the channel, never an error to the person) and the replies that failed.

    python bench/matrix_burst.py           # 40 messages (about 40 s: 1 reply/s)
    python bench/matrix_burst.py --quick   # 12 messages
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from echo_bot.brains.rules import no_match_hint  # noqa: E402
from echo_bot.store import Tx  # noqa: E402
from tests.conftest import running_bot  # noqa: E402
from tests.matrix_people import Person, open_room  # noqa: E402
from tests.matrix_server import Synapse, start_synapse, unique  # noqa: E402

RC_MESSAGE = {"per_second": 1, "burst_count": 10}


def lift_rate_limit(synapse: Synapse, admin_token: str, user_id: str) -> None:
    """Synapse's admin API: ``user_id`` is not rate-limited (the person, not the bot)."""
    url = f"{synapse.url}/_synapse/admin/v1/users/{quote(user_id)}/override_ratelimit"
    body = json.dumps({"messages_per_second": 0, "burst_count": 0}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST",
        headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30):
        pass


async def burst(synapse: Synapse, work: Path, messages: int) -> dict[str, object]:
    bot_account = await asyncio.to_thread(synapse.register, unique("echo"), "bot-password")
    owner = Person(synapse, "owner", work / "owner")
    admin = await asyncio.to_thread(synapse.register, unique("admin"), "admin", admin=True)
    await asyncio.to_thread(lift_rate_limit, synapse, admin.access_token, owner.user_id)
    config = f"""
[matrix]
enabled = true
homeserver = "{synapse.url}"
user_id = "{bot_account.user_id}"
allowed_users = ["{owner.user_id}"]
[http]
port = 0
"""
    try:
        await owner.step()
        room_id = await open_room(owner, [bot_account.user_id])
        async with owner.syncing(), running_bot(
            work / "state", config,
            environ={"MATRIX_ACCESS_TOKEN": bot_account.access_token},
            channels=["matrix"], channel_options={"matrix": {"sync_timeout": 1}},
        ) as bot:  # fmt: skip

            def answers() -> list[str]:
                return [t for t in owner.received(room_id, bot_account.user_id)
                        if t == no_match_hint("!")]  # fmt: skip

            deadline = time.monotonic() + 60
            while not (
                (room := owner.client.rooms.get(room_id)) is not None
                and bot_account.user_id in room.users
                and list(owner.client.device_store.active_user_devices(bot_account.user_id))
            ):
                if time.monotonic() > deadline:
                    raise SystemExit("the bot did not join the room within 60 s")
                await asyncio.sleep(0.1)
            started = time.monotonic()
            for index in range(messages):
                await owner.say(room_id, f"message {index}")
            sent_in = time.monotonic() - started
            deadline = time.monotonic() + 60 + 3 * messages
            while len(answers()) < messages and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # the person's client syncs in the background
            took = time.monotonic() - started
            await asyncio.sleep(2)  # a duplicate would show by now
            channel = next(c for c in bot.daemon.channels if c.name == "matrix")
            limited = int(channel.health().get("rate_limited", 0))  # type: ignore[call-overload]

            def stored(tx: Tx) -> tuple[int, int]:
                # One row an event ID at most (the inbox's unique key): a repeat is dropped.
                inbound = tx.inbox.recent("matrix", limit=10 * messages)
                return len(inbound), len(tx.outbox.deliveries("failed"))

            rows, failed = await bot.store.run(stored)
            seen = len(answers())
    finally:
        await owner.client.close()
    return {
        "messages": messages,
        "sent_in": sent_in,
        "answered_in": took,
        "stored": rows,
        "lost": messages - rows,
        "duplicates": max(0, seen - messages),
        "answers": seen,
        "limited": limited,
        "failed": failed,
    }


async def amain(args: argparse.Namespace) -> int:
    messages = 12 if args.quick else args.messages
    with tempfile.TemporaryDirectory(prefix="echo-bot-matrix-burst-") as tmp:
        work = Path(tmp)
        limits = {"rc_message": RC_MESSAGE}
        with start_synapse(work / "synapse", rate_limits=limits) as synapse:
            outcome = await burst(synapse, work, messages)
    print(f"Synapse rc_message {RC_MESSAGE['per_second']}/s after a burst of "
          f"{RC_MESSAGE['burst_count']} for the bot; the person's limit lifted.\n")  # fmt: skip
    print(
        "| case | messages | sent in (s) | all answered in (s) | answers/s | inbounds stored "
        "| lost | duplicates | M_LIMIT_EXCEEDED waited out | failed replies |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    answered_in = float(outcome["answered_in"])  # type: ignore[arg-type]
    rate = int(outcome["answers"]) / answered_in if answered_in else 0.0  # type: ignore[call-overload]
    print(
        f"| encrypted room, one person | {outcome['messages']} | {outcome['sent_in']:.1f} | "
        f"{answered_in:.1f} | {rate:.2f} | {outcome['stored']} | {outcome['lost']} | "
        f"{outcome['duplicates']} | {outcome['limited']} | {outcome['failed']} |"
    )
    ok = outcome["lost"] == 0 and outcome["duplicates"] == 0 and outcome["failed"] == 0
    ok = ok and outcome["answers"] == messages
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="12 messages")
    parser.add_argument("--messages", type=int, default=40)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
