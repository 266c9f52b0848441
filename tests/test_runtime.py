"""One build: ``runtime.build`` makes every part and starts none; the ``Runtime`` is
frozen, starts its parts in one order and stops them in the reverse; a reload is checked
without a store, then applied through the holders the runtime names."""

from __future__ import annotations

import dataclasses
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest

from echo_bot.config import LoadedConfig, parse_config
from echo_bot.core import check
from echo_bot.errors import ConfigError
from echo_bot.runtime import build

TOOLS = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""


def loaded_from(text: str, path: Path) -> LoadedConfig:
    return LoadedConfig(config=parse_config(tomllib.loads(text), str(path)), path=path)


def test_the_runtime_is_frozen(state_dir: Path) -> None:
    runtime = build(loaded_from(TOOLS, state_dir / "c.toml"), state_dir, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.exposed = runtime.exposed  # type: ignore[misc]
    assert runtime.mcp.hub is None  # no server configured: the hub is not made


async def test_running_starts_the_parts_in_order_and_stops_them(state_dir: Path) -> None:
    runtime = build(loaded_from(TOOLS, state_dir / "c.toml"), state_dir, {})
    async with runtime.running() as parts:
        assert parts.names == [
            "the store",
            "the instance row",
            "the MCP servers",
            "delivery",
            "the turns",
            "the scheduler",
            "housekeeping",
        ]
        members = await runtime.store.run(lambda tx: tx.meta.instances())
        assert [m.name for m in members] == [runtime.membership.name]
    # Stopped in reverse: the instance row went before the store closed.
    again = build(loaded_from(TOOLS, state_dir / "c.toml"), state_dir, {})
    async with again.running():
        assert [m.name for m in await again.store.run(lambda tx: tx.meta.instances())] == [
            again.membership.name
        ]


def test_check_makes_no_store_and_refuses_a_bad_config(state_dir: Path, tmp_path: Path) -> None:
    runtime = build(loaded_from(TOOLS, state_dir / "c.toml"), state_dir, {})
    elsewhere = tmp_path / "never-made"
    good = loaded_from(TOOLS + '[approvals]\ntimeout = "7m"\n', state_dir / "c.toml")
    settings = check(good, {}, state_dir=elsewhere, reminders=runtime.reminders)
    assert settings.loaded is good and settings.approval_timeout == timedelta(minutes=7)
    assert not elsewhere.exists()  # no store file, no directory: nothing was made
    bad = loaded_from(TOOLS + '[approvals]\nrequire = ["no_such_tool"]\n', state_dir / "c.toml")
    with pytest.raises(ConfigError, match="no_such_tool"):
        runtime.check(bad, {})


async def test_reload_swaps_the_live_settings_and_names_what_needs_a_restart(
    state_dir: Path,
) -> None:
    path = state_dir / "c.toml"
    runtime = build(loaded_from(TOOLS, path), state_dir, {})
    before = runtime.live.current
    async with runtime.running():
        new = loaded_from(
            TOOLS + '[approvals]\ntimeout = "9m"\n[bot]\nmax_concurrent_turns = 3\n', path
        )
        restart = await runtime.reload(runtime.check(new, {}), {})
        assert restart == ["bot"]
        assert runtime.loaded is new
        assert runtime.live.current.approval_timeout == timedelta(minutes=9)
        assert runtime.live.current.policy is not before.policy
