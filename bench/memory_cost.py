"""What carrying a chat's memory notes costs a turn (issue 34): SQL statements and
transactions per turn (SQLite's trace), and bytes in the model's prompt.

In one process, the real core as ``echo-bot run`` builds it, with the LLM brain asking
a scripted fake OpenAI-compatible server on 127.0.0.1 (``tests/fakes/openai_api.py``)
that answers at once, and a no-op channel. One session says "hello" and waits for the
answer, TURNS times after a few untraced turns; the case with the rules brain is the
reference (it reads no notes). Each LLM case has 0, 10 or 50 (the most a chat keeps)
notes of NOTE_SIZE characters in the chat, and the last one a running summary of
SUMMARY_SIZE characters beside its 10 notes.

    python bench/memory_cost.py            # 20 traced turns a case
    python bench/memory_cost.py --turns 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.turns import CHANNEL, NoopChannel, statement_kind  # noqa: E402
from echo_bot.app import Daemon  # noqa: E402
from echo_bot.config import LoadedConfig, parse_config  # noqa: E402
from echo_bot.events import Address, MessageInbound, OutboundMessage, Sender, new_id  # noqa: E402
from echo_bot.runtime import build  # noqa: E402
from echo_bot.store import Tx  # noqa: E402
from tests.fakes.openai_api import FakeOpenAI  # noqa: E402

NOTE_SIZE = 100  # characters of each note
SUMMARY_SIZE = 2_000  # characters of the running summary in the last case
WARMUP = 5  # untraced turns first (the session's first turn reads its whole history)


def config_text(base_url: str | None) -> str:
    if base_url is None:
        return '[brain]\nkind = "rules"\n'
    return (
        f'[brain]\nkind = "openai"\n[openai]\nbase_url = "{base_url}"\nmodel = "gpt-bench"\n'
        "max_retries = 0\nstream = false\n"
    )


async def case(
    notes: int, turns: int, llm: FakeOpenAI | None, summary: bool = False
) -> dict[str, float]:
    """Statements, transactions and prompt bytes per traced turn."""
    with tempfile.TemporaryDirectory(prefix="echo-bot-memory-cost-") as tmp:
        state_dir = Path(tmp)
        text = config_text(llm.base_url if llm is not None else None)
        config = parse_config(tomllib.loads(text), "bench/memory_cost.py")
        environ = {"OPENAI_API_KEY": "sk-bench"}
        runtime = build(LoadedConfig(config=config, path=None), state_dir, environ)
        channel = NoopChannel()
        daemon = Daemon(runtime, channel_names=[], banner=False, extra_channels=[channel])
        run = asyncio.create_task(daemon.run())
        statements: list[str] = []
        try:
            bus = await asyncio.wait_for(daemon.wait_started(), 30)
            chat = Address(channel=CHANNEL, chat_id="s0")

            def save(tx: Tx) -> None:
                for n in range(notes):
                    text = f"note {n:02d} " + "x" * (NOTE_SIZE - 8)
                    tx.memory.save(str(chat), text, "owner")
                if summary:  # covering nothing yet: carried, never made again here
                    tx.summaries.keep(str(chat), 0, "s" * SUMMARY_SIZE)

            await runtime.store.run(save)
            loop = asyncio.get_running_loop()

            async def one_turn() -> None:
                inbound = MessageInbound(
                    address=chat, sender=Sender(id="owner"), text="hello", external_id=new_id()
                )
                future: asyncio.Future[OutboundMessage] = loop.create_future()
                channel.waiting[inbound.id] = future
                await bus.publish(inbound)
                await asyncio.wait_for(future, 30)

            for _ in range(WARMUP):
                await one_turn()
            asked_before = len(llm.chat_requests()) if llm is not None else 0
            await runtime.store.database.run(
                lambda db: db.conn.set_trace_callback(statements.append)
            )
            for _ in range(turns):
                await one_turn()
            await asyncio.sleep(0.2)  # the last reply's receipt
            await runtime.store.database.run(lambda db: db.conn.set_trace_callback(None))
        finally:
            daemon.request_stop()
            await asyncio.wait_for(run, 30)
    requests = llm.chat_requests()[asked_before:] if llm is not None else []
    system = [len(json.dumps(r["messages"][0], ensure_ascii=False)) for r in requests]
    whole = [len(json.dumps(r, ensure_ascii=False)) for r in requests]
    commits = sum(1 for sql in statements if statement_kind(sql).startswith("COMMIT"))
    return {
        "statements": len(statements) / turns,
        "transactions": commits / turns,
        "system bytes": sum(system) / len(system) if system else 0.0,
        "request bytes": sum(whole) / len(whole) if whole else 0.0,
    }


async def amain(turns: int) -> None:
    rows = [("rules brain (reads no notes)", await case(0, turns, None))]
    async with FakeOpenAI(model="gpt-bench", api_key="sk-bench") as llm:
        for notes in (0, 10, 50):
            rows.append((f"LLM, {notes} notes", await case(notes, turns, llm)))
        summarised = await case(10, turns, llm, summary=True)
        rows.append((f"LLM, 10 notes and a summary of {SUMMARY_SIZE:,} characters", summarised))
    print(f"{turns} traced turns a case, one session; notes of {NOTE_SIZE} characters\n")
    print("| case | statements / turn | transactions / turn | system message (bytes) |"
          " request (bytes) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for name, got in rows:
        print(f"| {name} | {got['statements']:.1f} | {got['transactions']:.1f} |"
              f" {got['system bytes']:,.0f} | {got['request bytes']:,.0f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20, help="traced turns a case")
    asyncio.run(amain(parser.parse_args().turns))


if __name__ == "__main__":
    main()
