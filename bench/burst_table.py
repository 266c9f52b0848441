"""What the channel burst benches (``slack_burst.py``, ``discord_burst.py``,
``email_burst.py``) count in the store, the table they print, and whether their run
held: per case the messages, how fast all were answered, the inbounds the store took,
lost and duplicated ones, the sends made and the peer's refusals among them, failed
replies. A run holds with nothing lost, duplicated or failed, every message answered
once, and at most 1 % of sends refused — the last only in a full run: the share is a
figure of pacing, which a loaded machine skews (sends that waited on a busy loop
arrive together)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from echo_bot.store import Store, Tx


async def stored(store: Store, channel: str, messages: int) -> tuple[int, int]:
    """The channel's inbounds the store took, and the replies that failed for good."""

    def counted(tx: Tx) -> tuple[int, int]:
        inbound = tx.inbox.recent(channel, limit=10 * messages)
        return len(inbound), len(tx.outbox.deliveries("failed"))

    return await store.run(counted)


def report(
    outcomes: Sequence[Mapping[str, Any]], *, quick: bool, messages: str = "messages",
    rate: str = "answers/s", sends: str = "posts", refusals: str = "429s",
) -> bool:  # fmt: skip
    """Print the table (its column names: ``messages``, ``rate``, ``sends``,
    ``refusals``); whether the run held. Each outcome: case, messages, sent_in,
    answered_in, answers, stored, lost, duplicates, sends, refused, failed."""
    print(
        f"| case | {messages} | sent in (s) | all answered in (s) | {rate} | inbounds stored "
        f"| lost | duplicates | {sends} | {refusals} | {refusals} / {sends} | failed replies |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    held = True
    for o in outcomes:
        took, answers, tries = float(o["answered_in"]), int(o["answers"]), int(o["sends"])
        share = int(o["refused"]) / tries if tries else 0.0
        print(
            f"| {o['case']} | {o['messages']} | {o['sent_in']:.1f} | {took:.1f} | "
            f"{answers / took if took else 0:.2f} | {o['stored']} | {o['lost']} | "
            f"{o['duplicates']} | {tries} | {o['refused']} | {share:.1%} | {o['failed']} |"
        )
        held = held and o["lost"] == 0 and o["duplicates"] == 0 and o["failed"] == 0
        held = held and answers == o["messages"] and (quick or share <= 0.01)
    return held
