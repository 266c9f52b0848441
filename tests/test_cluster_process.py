"""Three `echo-bot run` processes on one PostgreSQL database, as on three machines: the
fake Bot API for Telegram, signed webhooks spread over all three, one of them killed
(SIGKILL) in the middle. Every delivery runs its side effect once, every chat message is
answered once, the Telegram bot is polled by one daemon at a time and taken over when
that one dies."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import aiohttp
import pytest

from echo_bot.store import Tx, make_database
from tests import proc
from tests.conftest import echo_bot_env, read_engine
from tests.fakes.openai_api import FakeOpenAI, Reply
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.ports import free_port
from tests.postgres import fresh_database
from tests.waiting import eventually

pytestmark = pytest.mark.slow

TOKEN = "123456:CLUSTER-test-token"
OWNER = 42
T = TypeVar("T")
SECRET = "whsec_" + base64.b64encode(b"cluster-standard-webhooks-secret").decode()
COMMAND = ["sh", "-c", "echo ran >> count.txt"]
NAMES = ("bot-a", "bot-b", "bot-c")


def config(api: FakeTelegramAPI, name: str, port: int, workspace: Path, extra: str = "") -> str:
    argv = json.dumps(COMMAND)
    return (
        extra
        + f"""
[bot]
instance = "{name}"
[storage]
engine = "postgres"
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{OWNER}]
[http]
port = {port}
[tools]
profile = "coding"
workspace = "{workspace}"
[tools.shell]
enabled = true
allow_commands = ["sh -c *"]
[webhook]
enabled = true

[[webhook.routes]]
name = "count"
auth = "standard"
secret_env = "COUNT_SECRET"
tool = "shell_exec"
args = {{ argv = {argv} }}
deliver_to = "telegram:{OWNER}"
"""
    )


class Daemon(proc.Daemon):
    """One `echo-bot run` of the cluster, by name, on the shared database."""

    def __init__(self, name: str, config: Path, state: Path, url: str, port: int) -> None:
        env = echo_bot_env(TELEGRAM_BOT_TOKEN=TOKEN, COUNT_SECRET=SECRET, ECHO_BOT_DATABASE_URL=url)
        super().__init__(config, state, env, name)
        self.url, self.port = url, port

    def said_all(self) -> str:
        return f"{self.name}:\n" + "\n".join(self.lines)

    def holds_as(self, instance: str) -> bool:
        """Whether ``instance``, a name in the store (host-pid-random), is this daemon."""
        assert self.proc is not None
        return instance.startswith(f"{socket.gethostname()}-{self.proc.pid}-")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 30)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return code


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path, names: tuple[str, ...] = NAMES, extra: str = ""
) -> AsyncIterator[tuple[FakeTelegramAPI, list[Daemon], Path, str]]:
    """Daemons ``names`` started in this order on one fresh database (the first polls
    Telegram); ``extra``: more config for each (tables before the others)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with fresh_database() as url:
        async with FakeTelegramAPI(token=TOKEN) as api:
            daemons = []
            for name in names:
                port = free_port()
                path = tmp_path / f"{name}.toml"
                path.write_text(config(api, name, port, workspace, extra))
                daemons.append(Daemon(name, path, tmp_path / name, url, port))
            try:
                poller = daemons[0]
                await poller.start()
                await eventually(lambda: poller.said("polling now"), 20, poller.said_all)
                for daemon in daemons[1:]:
                    await daemon.start()
                yield api, daemons, workspace, url
            finally:
                for daemon in daemons:
                    if daemon.proc is not None:
                        with contextlib.suppress(Exception):
                            await daemon.stop()


def signed(body: bytes, msg_id: str) -> dict[str, str]:
    from standardwebhooks.webhooks import Webhook

    now = datetime.now(UTC)
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body.decode()),
    }


async def deliver(session: aiohttp.ClientSession, daemons: list[Daemon], n: int) -> str:
    """Delivery ``n`` to daemon n % 3, or — as a sender retries — to the next one while
    that one is down; the daemon that answered 202."""
    body = json.dumps({"n": n}).encode()
    for attempt in range(30):
        daemon = daemons[(n + attempt) % len(daemons)]
        url = f"http://127.0.0.1:{daemon.port}/hooks/count"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(url, data=body, headers=signed(body, f"msg-{n}")) as answer:
                if answer.status in (200, 202):
                    return daemon.name
        await asyncio.sleep(0.2)
    raise AssertionError(f"delivery {n} was never accepted")


async def press_approve(api: FakeTelegramAPI) -> None:
    """The owner taps Approve on every prompt as it arrives (whichever daemon sent it,
    whichever polls the press)."""
    pressed: set[int] = set()
    while True:
        for call in api.calls_of("sendMessage"):
            markup = call.params.get("reply_markup")
            if not markup or call.response is None or not call.response.get("ok"):
                continue
            markup = json.loads(markup) if isinstance(markup, str) else markup
            message_id = call.response["result"]["message_id"]
            if message_id in pressed:
                continue
            pressed.add(message_id)
            approve = markup["inline_keyboard"][0][0]["callback_data"]
            api.push_callback(approve, user_id=OWNER, message_id=message_id, chat_id=OWNER)
        await asyncio.sleep(0.2)


def read_db(url: str, fn: Callable[[Tx], T]) -> T:
    """``fn(tx)`` in one transaction on the database at ``url`` the daemons share. On a
    thread of its own, waited for: callers are on the event loop's thread (a failure's
    message among them, so not awaited), where the store does no blocking work."""
    engine = make_database("postgres", state_dir=Path(), url=url)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(read_engine, engine, fn).result()


def stored(url: str) -> str:
    """What the database holds: for a failure's message."""

    def read(tx: Tx) -> tuple[dict[str, int], list[tuple[str, str]], Counter[str]]:
        outbox = Counter(delivery.status for delivery in tx.outbox.deliveries())
        return tx.meta.queue_counts(), tx.leases.every(), outbox

    queues, leases, outbox = read_db(url, read)
    return f"queues {queues}\nleases {leases}\noutbox {dict(outbox)}"


def settled(url: str) -> bool:
    """Nothing left to do in the database: every inbound final, every outbound sent
    (or failed for good)."""
    counts = read_db(url, lambda tx: tx.meta.queue_counts())
    open_inbox = counts["inbox_pending"] + counts["waiting_approval"]
    return open_inbox == 0 and counts["outbox_queued"] == 0


def runs(workspace: Path) -> int:
    path = workspace / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def results(api: FakeTelegramAPI) -> list[str]:
    return [t for t in api.sent_texts(OWNER) if "exit code 0" in t]


def unknown(api: FakeTelegramAPI) -> list[str]:
    """Reports of calls the kill cut between running and storing their result: they
    may have run, so they are reported OUTCOME_UNKNOWN and never run again."""
    return [t for t in api.sent_texts(OWNER) if "OUTCOME_UNKNOWN" in t]


def reported(api: FakeTelegramAPI) -> int:
    return len(results(api)) + len(unknown(api))


@pytest.mark.timeout(240)
async def test_three_daemons_share_one_database_and_survive_a_kill(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (api, daemons, workspace, url):
        presser = asyncio.create_task(press_approve(api))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            first = await asyncio.gather(*(deliver(session, daemons, n) for n in range(12)))
            assert set(first) == set(NAMES)  # spread over all three
            for n in range(3):
                api.push_message(f"what time is it? #{n}", user_id=OWNER)

            def state() -> str:
                said = "\n".join(f"{d.name}: {line}" for d in daemons for line in d.lines[-15:])
                counts = f"runs {runs(workspace)}, results {len(results(api))}"
                return f"{counts}, unknown {len(unknown(api))}\n{stored(url)}\n{said}"

            await eventually(lambda: runs(workspace) >= 12 and len(results(api)) >= 12, 60, state)

            # Kill the daemon that polls Telegram (and so may deliver too) mid-stream.
            poller = next(d for d in daemons if any("polling now" in x for x in d.lines))
            sending = asyncio.gather(*(deliver(session, daemons, n) for n in range(12, 30)))
            # Mid-stream: once the first of these deliveries has run its command.
            await eventually(lambda: runs(workspace) > 12, 60, state)
            await poller.kill()
            await sending
            for n in range(3, 6):
                api.push_message(f"what time is it? #{n}", user_id=OWNER)

            await eventually(lambda: runs(workspace) >= 30 and reported(api) >= 30, 90, state)

            def answered() -> list[str]:
                return [t for t in api.sent_texts(OWNER) if t.startswith("It is")]

            await eventually(lambda: len(answered()) >= 6, 60, state)
            # Every row worked off (inbox final, outbox sent): a duplicate, had there
            # been one, was sent before this.
            await eventually(lambda: settled(url), 60, state)
        presser.cancel()

        assert runs(workspace) == 30, "a delivery ran its command twice or not at all"
        # Each delivery is reported once (at-least-once for a send in flight at the kill:
        # one repeat per chat at most): by its result, or, for a call the kill caught
        # between running and storing its result, as OUTCOME_UNKNOWN (never run again).
        assert 30 <= reported(api) <= 31, (results(api), unknown(api))
        # One route is one session, whose calls run one at a time: one can be cut.
        assert len(unknown(api)) <= 1, unknown(api)
        assert len(answered()) == 6, answered()
        survivors = [d for d in daemons if d.alive]
        assert len(survivors) == 2
        assert any("polling now" in line for d in survivors for line in d.lines), (
            "no daemon took over polling Telegram"
        )
        for daemon in survivors:
            assert await daemon.stop() == 0


@pytest.mark.timeout(180)
async def test_a_stalled_daemon_writes_nothing_to_a_session_another_took_over(
    tmp_path: Path,
) -> None:
    """A daemon frozen mid-turn (SIGSTOP: a paused VM, a long GC) past its lease loses
    the session to another, which finishes the turn; thawed, the first one's answer
    comes in, and every checkpoint it would write is fenced: the chat gets one reply,
    the other daemon's, and the turn's history holds one answer."""
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.hang(30, then=Reply("the frozen daemon's answer"))
        llm.reply("the answer of the daemon that took over")
        extra = (
            f'[brain]\nkind = "openai"\n[openai]\nbase_url = "{llm.base_url}"\n'
            'model = "gpt-test"\ntimeout = "60s"\nmax_retries = 0\n'
        )
        async with cluster(tmp_path, ("bot-a", "bot-b"), extra) as (api, daemons, _ws, url):
            api.push_message("hello", user_id=OWNER)
            await eventually(lambda: llm.chat_requests(), 20, lambda: stored(url))
            # Whichever daemon took the session (any may: the one that polled the message,
            # or the other, woken by NOTIFY) is frozen waiting for its model's answer.
            driver = session_holder(url)
            first = next(d for d in daemons if d.holds_as(driver))
            second = next(d for d in daemons if d is not first)
            assert first.proc is not None
            first.proc.send_signal(signal.SIGSTOP)
            try:

                def replies() -> list[str]:
                    return [t for t in api.sent_texts(OWNER) if "answer" in t]

                await eventually(replies, 45, lambda: stored(url) + second.said_all())
            finally:
                first.proc.send_signal(signal.SIGCONT)
            assert replies() == ["the answer of the daemon that took over"]
            await eventually(lambda: first.said("left to another daemon"), 40, first.said_all)
            # The frozen daemon's turn is over; every row worked off (inbox final, outbox
            # sent): a second reply, had there been one, was sent before this.
            await eventually(lambda: settled(url), 40, lambda: stored(url))
            assert replies() == ["the answer of the daemon that took over"]
            assert answers_in_history(url) == ["the answer of the daemon that took over"]
            for daemon in daemons:
                assert await daemon.stop() == 0


def session_holder(url: str) -> str:
    leases = read_db(url, lambda tx: tx.leases.every())
    holders = [instance for name, instance in leases if name.startswith("session:")]
    assert holders, "no daemon holds the session"
    return holders[0]


def answers_in_history(url: str) -> list[str | None]:
    messages = read_db(url, lambda tx: tx.turns.every_message())
    return [m.content for m in messages if m.role == "assistant"]
