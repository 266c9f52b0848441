"""The channel plugin defined only in the tests (tests/plugin/, registered through its
entry point, no file of echo_bot/ naming it) gets what every channel gets from the core:
its config section checked, an allowlist with pairing and refusals, approvers,
check-config, doctor and console sign-in. The contract suite runs it as ``pigeon``
(tests/channels/contract/drivers.py: PigeonDriver)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from echo_bot.console.auth import ConsoleUser
from tests.conftest import Bot, plugin_env, running_bot
from tests.console.helpers import CONSOLE, client, signed_in
from tests.fakes.pigeon_api import FakePigeon
from tests.waiting import eventually

SECTION = """
[pigeon]
enabled = true
api_base = "{base}"
allowed_users = ["owner", "friend"]
approvers = ["owner"]
poll_wait = 0.2
"""


def echo_bot(
    tmp_path: Path, config: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "echo-bot.toml"
    path.write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "echo_bot", *args, "--config", str(path),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, env=plugin_env(**env), cwd=tmp_path, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_check_config_reads_the_plugins_section_and_its_secret(tmp_path: Path) -> None:
    config = SECTION.format(base="http://127.0.0.1:9")
    done = echo_bot(tmp_path, config, "check-config", PIGEON_TOKEN="t0ken-value")
    assert done.returncode == 0, done.stderr
    assert "pigeon: on" in done.stdout
    assert "PIGEON_TOKEN set" in done.stdout
    typo = echo_bot(tmp_path, config + "alowed = 1\n", "check-config")
    assert typo.returncode == 2 and "pigeon.alowed: unknown key" in typo.stderr, typo.stderr
    unset = echo_bot(tmp_path, config, "check-config")
    assert unset.returncode == 2
    assert "pigeon.token_env: environment variable PIGEON_TOKEN is not set" in unset.stderr
    empty = echo_bot(tmp_path, "[pigeon]\nenabled = true\n", "check-config", PIGEON_TOKEN="t")
    assert "warning: [pigeon] allowed_users is empty" in empty.stdout, empty.stdout


def test_without_the_plugin_its_section_is_refused_naming_the_installed_channels(
    tmp_path: Path,
) -> None:
    path = tmp_path / "echo-bot.toml"
    path.write_text(SECTION.format(base="http://127.0.0.1:9"))
    done = subprocess.run(
        [sys.executable, "-m", "echo_bot", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip  (no plugin_env: the plugin is not installed here)
    assert done.returncode == 2
    assert "[pigeon]: unknown section; the installed channels are cli, discord, email, matrix," in (
        done.stderr
    ), done.stderr


def test_doctor_checks_the_plugins_secret(tmp_path: Path) -> None:
    config = SECTION.format(base="http://127.0.0.1:9")
    missing = echo_bot(tmp_path, config, "doctor")
    assert missing.returncode == 1 and "PIGEON_TOKEN" in missing.stdout, missing.stdout
    done = echo_bot(tmp_path, config, "doctor", PIGEON_TOKEN="t0ken-value")
    assert done.returncode == 0, done.stdout


@asynccontextmanager
async def pigeon_bot(state_dir: Path, extra: str = "") -> AsyncIterator[tuple[Bot, FakePigeon]]:
    async with FakePigeon() as api:
        config = SECTION.format(base=api.base_url) + extra
        async with running_bot(
            state_dir, config, environ={"PIGEON_TOKEN": api.token}, channels=["pigeon"]
        ) as bot:
            yield bot, api


async def test_a_stranger_is_refused_and_pairs_with_a_code(state_dir: Path) -> None:
    async with pigeon_bot(state_dir) as (bot, api):
        api.push_message("hello", user="stranger")
        api.push_message("hello again", user="stranger")
        await eventually(lambda: api.texts_to("stranger"), timeout=15, what="the refusal")
        code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
        api.push_message(f"pair {code}", user="stranger")
        await eventually(lambda: any("Paired" in t for t in api.texts_to("stranger")),
                         timeout=15, what="paired")  # fmt: skip
        api.push_message("/ping", user="stranger")
        await eventually(lambda: len(api.texts_to("stranger")) == 3, timeout=15, what="a reply")
        refusal, paired, reply = api.texts_to("stranger")
        assert "Your Pigeon user ID is stranger" in refusal and "pair CODE" in refusal
        assert "Paired" in paired and reply, reply
        said = [str(getattr(r.message, "text", "")) for r in await bot.store.run(
            lambda tx: [tx.inbox.get(s.id) for s in tx.inbox.recent("pigeon", limit=10)]
        ) if r is not None]  # fmt: skip
        assert said == ["/ping"]  # a stranger's words were never committed


async def test_a_plugin_approver_signs_in_to_the_console(state_dir: Path) -> None:
    async with pigeon_bot(state_dir, CONSOLE) as (bot, _api), client(bot) as session:
        await signed_in(bot, session, ConsoleUser(channel="pigeon", id="owner", name="owner"))
        async with session.get("/console/") as page:
            assert page.status == 200 and "pigeon:owner" in await page.text()
