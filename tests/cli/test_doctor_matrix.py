"""`echo-bot doctor` for Matrix as the user runs it (a subprocess), against the session's
real Synapse: the homeserver, the token (whoami) and the device's encryption keys —
before the first start, after a start published them, and with the key store lost."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.cli.test_doctor_checks import doctor
from tests.conftest import running_bot
from tests.matrix_server import Registered, Synapse, unique
from tests.ports import free_port
from tests.waiting import eventually


def matrix_config(tmp_path: Path, homeserver: str, user_id: str, extra: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[matrix]\nenabled = true\nhomeserver = "{homeserver}"\nuser_id = "{user_id}"\n'
        f'allowed_users = ["@someone:example.org"]\n{extra}'
    )
    return path


def lines(output: str, name: str) -> str:
    (line,) = [line for line in output.splitlines() if f"] {name} " in line]
    return line


async def register(synapse: Synapse) -> Registered:
    return await asyncio.to_thread(synapse.register, unique("doc"), "doctor-password")


def log_out(synapse: Synapse, account: Registered) -> object:
    """The token revoked, as "Sign out" of that session in Element does."""
    request = urllib.request.Request(
        f"{synapse.url}/_matrix/client/v3/logout", data=b"{}", method="POST",
        headers={"Authorization": f"Bearer {account.access_token}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


async def started_once(state_dir: Path, synapse: Synapse, account: Registered) -> None:
    """The real daemon with the Matrix channel, until it has synced (its keys made and
    uploaded on the way), then stopped."""
    config = (
        f'[matrix]\nenabled = true\nhomeserver = "{synapse.url}"\n'
        f'user_id = "{account.user_id}"\nallowed_users = ["@someone:example.org"]\n'
    )
    async with running_bot(
        state_dir, config, environ={"MATRIX_ACCESS_TOKEN": account.access_token},
        channels=["matrix"], channel_options={"matrix": {"sync_timeout": 1}},
    ) as bot:  # fmt: skip
        channel = next(c for c in bot.daemon.channels if c.name == "matrix")
        await eventually(lambda: channel.health()["status"] == "ok", timeout=30, what="synced")


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_checks_the_homeserver_the_token_and_the_keys(
    synapse: Synapse, tmp_path: Path
) -> None:
    account = await register(synapse)
    state = tmp_path / "state"
    config = matrix_config(tmp_path, synapse.url, account.user_id)
    args = ("--config", str(config), "--state-dir", str(state))

    code, out = await doctor(*args, MATRIX_ACCESS_TOKEN=account.access_token)
    assert code == 0, out
    assert lines(out, "matrix homeserver").startswith("[  ok]") and synapse.url in out
    token = lines(out, "matrix token")
    assert token.startswith("[  ok]") and account.user_id in token
    assert account.device_id in token
    keys = lines(out, "matrix keys")
    assert keys.startswith("[  ok]") and "no keys yet" in keys, out
    assert account.access_token not in out

    state.mkdir(mode=0o700)
    await started_once(state, synapse, account)
    code, out = await doctor(*args, MATRIX_ACCESS_TOKEN=account.access_token)
    assert code == 0, out
    keys = lines(out, "matrix keys")
    assert keys.startswith("[  ok]") and "published on the homeserver" in keys, out

    # The state dir restored without its matrix/ folder: the device's keys are lost.
    shutil.rmtree(state / "matrix")
    code, out = await doctor(*args, MATRIX_ACCESS_TOKEN=account.access_token)
    assert code == 1, out
    keys = lines(out, "matrix keys")
    assert keys.startswith("[FAIL]") and "restore" in keys and "new device" in keys, out
    assert "Fix: matrix keys." in out


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_fails_a_revoked_token_and_someone_elses(
    synapse: Synapse, tmp_path: Path
) -> None:
    account, other = await register(synapse), await register(synapse)
    config = matrix_config(tmp_path, synapse.url, account.user_id)
    args = ("--config", str(config), "--state-dir", str(tmp_path / "state"))

    code, out = await doctor(*args, MATRIX_ACCESS_TOKEN=other.access_token)
    assert code == 1, out
    token = lines(out, "matrix token")
    assert token.startswith("[FAIL]") and f"belongs to {other.user_id}" in token
    assert "matrix keys" not in out  # not asked with a token that is not the bot's

    assert await asyncio.to_thread(log_out, synapse, account) == {}
    code, out = await doctor(*args, MATRIX_ACCESS_TOKEN=account.access_token)
    assert code == 1, out
    token = lines(out, "matrix token")
    assert token.startswith("[FAIL]") and "rejected the token" in token
    assert "M_UNKNOWN_TOKEN" in token and "$MATRIX_ACCESS_TOKEN" in token
    assert account.access_token not in out and other.access_token not in out


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_without_a_token_says_what_the_first_start_does(
    synapse: Synapse, tmp_path: Path
) -> None:
    config = matrix_config(tmp_path, synapse.url, "@bot:example.org")
    state = ("--state-dir", str(tmp_path / "state"))
    code, out = await doctor("--config", str(config), *state)
    assert code == 1
    assert lines(out, "matrix token").startswith("[FAIL]")
    assert "$MATRIX_ACCESS_TOKEN is not set" in out

    with_password = matrix_config(
        tmp_path, synapse.url, "@bot:example.org", 'password_env = "MATRIX_PASSWORD"\n'
    )
    code, out = await doctor("--config", str(with_password), *state, MATRIX_PASSWORD="pw")
    token = lines(out, "matrix token")
    assert token.startswith("[warn]") and "first start logs in by password" in token, out
    assert "pw" not in token


async def test_doctor_fails_a_homeserver_it_cannot_reach(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    config = matrix_config(tmp_path, nowhere, "@bot:example.org")
    code, out = await doctor(
        "--config", str(config), "--state-dir", str(tmp_path / "state"),
        MATRIX_ACCESS_TOKEN="syt_not_asked",
    )  # fmt: skip
    assert code == 1, out
    line = lines(out, "matrix homeserver")
    assert line.startswith("[FAIL]") and f"cannot reach {nowhere}" in line
    assert "matrix token" not in out and "syt_not_asked" not in out
