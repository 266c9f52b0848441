from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from echo_bot.app import Daemon, build_core
from echo_bot.brains.base import Brain
from echo_bot.config import LoadedConfig, parse_config
from echo_bot.events import Address, Sender
from echo_bot.store import Database
from echo_bot.tools.base import Tool, ToolContext
from tests.fakes.channel import RecordingChannel

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Bot:
    daemon: Daemon
    channel: RecordingChannel
    state_dir: Path

    @property
    def db(self) -> Database:
        return self.daemon.core.store.database


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
    config = parse_config(tomllib.loads(config_text), "test.toml")
    loaded = LoadedConfig(config=config, path=state_dir / "test.toml")
    env = dict(environ or {})
    core = build_core(loaded, state_dir, env)
    for tool in tools:  # extra tools a test declares (slow, failing, chatty…)
        core.registry.register(tool)
        core.exposed.append(tool)
    channel = channel or RecordingChannel("cli")
    daemon = Daemon(
        core,
        channel_names=list(channels),
        channel_options=channel_options,
        environ=env,
        banner=False,
        extra_channels=[channel],
        brain=brain,
    )
    task = asyncio.create_task(daemon.run())
    try:
        async with asyncio.timeout(10):
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
