from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from echo_bot.app import Daemon
from echo_bot.brains.base import Brain
from echo_bot.config import LoadedConfig, parse_config
from echo_bot.events import Address, InboundMessage, Sender
from echo_bot.runtime import build
from echo_bot.secrets import Masker
from echo_bot.store import DB_FILENAME, Database, Engine, Store, Tx, make_database
from echo_bot.store.turns import CallRow
from echo_bot.tools.base import Tool, ToolContext
from tests.fakes.channel import RecordingChannel
from tests.postgres import empty_database, fresh_database

# The real-browser fixtures (``browser``, ``page``) and the Matrix homeserver
# (``synapse``) for every test module; each starts only for a test that asks for it.
pytest_plugins = ("tests.browser", "tests.matrix_server", "tests.mail_server", "tests.cpu_cost")

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
# The channel plugin defined only in the tests (tests/plugin/README.md), installed for
# this process as pip would leave it: its package and its dist-info on the path. Its
# subprocesses get it with ``plugin_env``.
PLUGIN_DIR = ROOT / "tests" / "plugin"
sys.path.insert(0, str(PLUGIN_DIR))

# The PostgreSQL database ``running_bot`` uses instead of the state dir's SQLite file.
ON_POSTGRES: ContextVar[str | None] = ContextVar("ON_POSTGRES", default=None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first, each kind in the random order pytest-randomly gave it.

    Under xdist a worker takes the next test when it is nearly out of work, so a run
    ends when its last long test does: a minute-long test drawn near the end would leave
    the other workers idle for that minute. Started first, they run beside the many
    short tests instead. (The benchmarks' xdist_group is a scope of many tests, which
    loadgroup hands out first anyway.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def worker_database() -> Iterator[str]:
    """This pytest process's (xdist worker's) own PostgreSQL database, emptied before
    each test that takes it (``on_both_engines``) and dropped at the end."""
    with fresh_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def on_both_engines(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once on each engine: on PostgreSQL every ``running_bot`` of the
    test shares one empty database (a restart finds what the last run stored): the
    worker's own, emptied for it (``tests.postgres.empty_database``)."""
    if request.param == "sqlite":
        yield "sqlite"
        return
    url: str = request.getfixturevalue("worker_database")
    empty_database(url)
    token = ON_POSTGRES.set(url)
    try:
        yield "postgres"
    finally:
        ON_POSTGRES.reset(token)


@dataclass
class Bot:
    daemon: Daemon
    channel: RecordingChannel
    state_dir: Path

    @property
    def db(self) -> Engine:
        """The store's engine: SQLite's ``Database``, or PostgreSQL's on both engines."""
        return self.daemon.runtime.store.database

    @property
    def store(self) -> Store:
        """The store, for checks in its own words: ``bot.store.run(lambda tx: tx.…)``."""
        return self.daemon.runtime.store


def store_engine(state_dir: Path) -> Engine:
    """Another engine (not opened) on the store ``running_bot(state_dir)`` uses."""
    url = ON_POSTGRES.get()
    if url is not None:
        return make_database("postgres", state_dir=state_dir, url=url)
    return Database(state_dir / DB_FILENAME)


def inbound_of(tx: Tx, channel: str) -> list[InboundMessage]:
    """Every inbound of ``channel`` the store holds, oldest first."""
    rows = [tx.inbox.get(s.id) for s in reversed(tx.inbox.recent(channel, limit=10_000))]
    return [row.message for row in rows if row is not None]


def calls_of_turn(tx: Tx, turn_id: str) -> list[CallRow]:
    """Every tool call the turn ``turn_id`` planned, step by step."""
    turn = tx.turns.get(turn_id)
    if turn is None:
        return []
    return [call for step in range(turn.step + 1) for call in tx.turns.calls_of_step(turn_id, step)]


def read_store(state_dir: Path, fn: Callable[[Tx], T]) -> T:
    """``fn(tx)`` in one transaction on the store of ``state_dir``, opened for the call as
    a management command opens it (a daemon run as a subprocess may be running on it).
    Not on an event loop's thread: ``await asyncio.to_thread(read_store, …)`` there."""
    return read_engine(store_engine(state_dir), fn)


def read_engine(engine: Engine, fn: Callable[[Tx], T]) -> T:
    """``fn(tx)`` in one transaction on the store of ``engine`` (not opened), opened for
    the call as a management command opens it: ``read_store`` for any engine."""
    store = Store(engine, Masker())
    store.open_sync(create=False)
    try:
        return store.run_sync(fn)
    finally:
        store.close_sync()


@asynccontextmanager
async def running_bot(
    state_dir: Path,
    config_text: str = "",
    *,
    channel: RecordingChannel | None = None,
    environ: dict[str, str] | None = None,
    tools: Sequence[Tool] = (),
    brain: Brain | None = None,
    channels: Sequence[str] = (),
    channel_options: dict[str, dict[str, object]] | None = None,
) -> AsyncIterator[Bot]:
    """The real core on a temp state dir, with a recording channel in place of a chat."""
    raw = tomllib.loads(config_text)
    env = dict(environ or {})
    postgres_url = ON_POSTGRES.get()
    if postgres_url is not None:  # a test run on both engines (the on_both_engines fixture)
        raw.setdefault("storage", {})["engine"] = "postgres"
        env["ECHO_BOT_DATABASE_URL"] = postgres_url
    config = parse_config(raw, "test.toml")
    loaded = LoadedConfig(config=config, path=state_dir / "test.toml")
    runtime = build(loaded, state_dir, env, brain=brain)
    for tool in tools:  # extra tools a test declares (slow, failing, chatty…)
        runtime.registry.register(tool)
        runtime.exposed.tools.append(tool)
    channel = channel or RecordingChannel("cli")
    daemon = Daemon(
        runtime,
        channel_names=list(channels),
        channel_options=channel_options,
        banner=False,
        extra_channels=[channel],
    )
    task = asyncio.create_task(daemon.run())
    try:
        # Its channels and MCP servers started: well under a second alone, far longer in
        # a full parallel suite on two cores (a wait for liveness, not a speed check).
        async with asyncio.timeout(30):
            await daemon.wait_started()
        yield Bot(daemon=daemon, channel=channel, state_dir=state_dir)
    finally:
        daemon.request_stop()
        await asyncio.wait_for(task, 15)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


def echo_bot_env(**extra: str) -> dict[str, str]:
    """A clean environment for subprocesses: no tokens or keys leak in from outside."""
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def plugin_env(**extra: str) -> dict[str, str]:
    """``echo_bot_env`` with the test plugin installed (tests/plugin/)."""
    env = echo_bot_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGIN_DIR), env.get("PYTHONPATH")) if p)
    return env


def echo_bot_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "echo_bot", *args]


def run_echo_bot(
    *args: str, input: str | None = None, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        echo_bot_cmd(*args),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or echo_bot_env(),
        cwd=ROOT,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


@pytest.fixture
def ctx() -> ToolContext:
    return ToolContext(
        trace_id="trace-1",
        session_key="cli:local",
        origin=Address(channel="cli", chat_id="local"),
        user=Sender(id="owner", name="Owner"),
    )
