"""The bot's Matrix session: the client, its login, its device and encryption keys.

Everything lives in ``<state_dir>/matrix/`` (directory 0700, files 0600): matrix-nio's
key store (a SQLite file per account and device: the device's identity keys, its Olm
and Megolm sessions) and, after a password login, ``login.json`` with the device ID and
access token that login gave. The token is kept there, not in the store, because it is
bound to the device whose keys are in this directory: the two must travel together (a
second daemon on a shared store could not use the device without its keys), and a
secret in a file of its own is not copied into store backups or exports. Back the
directory up with the store: without its keys the bot cannot read what was encrypted
for it before.

With ``access_token_env`` set the token is used as it is; ``whoami`` tells the device
it belongs to (end-to-end encryption needs it).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nio import AsyncClient, AsyncClientConfig, LoginResponse, WhoamiResponse

from echo_bot.errors import ConfigError

from .common import PeerAway, log, transient
from .settings import MatrixConfig

REQUEST_TIMEOUT = 60.0  # seconds for one HTTP request (a sync's long poll is shorter)


def store_dir(state_dir: Path) -> Path:
    return state_dir / "matrix"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def tighten(directory: Path) -> None:
    """Every file of the key store readable by the daemon's user only."""
    for child in directory.iterdir():
        if child.is_file() and (child.stat().st_mode & 0o077):
            os.chmod(child, 0o600)


def make_client(config: MatrixConfig, directory: Path) -> AsyncClient:
    assert config.user_id is not None  # the config requires it when enabled
    return AsyncClient(
        config.homeserver,
        config.user_id,
        store_path=str(directory),
        config=AsyncClientConfig(
            encryption_enabled=config.encryption,
            store_sync_tokens=False,  # the sync token lives in the echo-bot store
            # nio would sleep out M_LIMIT_EXCEEDED for ever; outbound paces itself.
            max_limit_exceeded=0,
            max_timeouts=3,  # then an error answer (sync tries again), not endless retries
            request_timeout=REQUEST_TIMEOUT,
        ),
    )


async def log_in(
    client: AsyncClient, config: MatrixConfig, environ: Mapping[str, str], directory: Path
) -> None:
    """Restore the session (token from the environment, or kept from a first login),
    or log in with the password once; the key store is loaded on the way. A refusal
    raises ``ConfigError`` (the user must act); a homeserver that cannot be reached,
    or fails on its side, raises one of ``NETWORK_ERRORS`` (the caller tries again)."""
    await asyncio.to_thread(_private_dir, directory)
    token = environ.get(config.access_token_env, "")
    kept = await asyncio.to_thread(read_kept, directory / "login.json")
    if token:
        device_id = await _device_of(client, token, config)
    elif kept is not None:
        token, device_id = kept["access_token"], kept["device_id"]
    elif config.password_env and environ.get(config.password_env):
        answer = await client.login(environ[config.password_env], device_name=config.device_name)
        if not isinstance(answer, LoginResponse) and transient(answer):
            raise PeerAway(f"the login failed on the homeserver's side: {answer}")
        if not isinstance(answer, LoginResponse):
            raise ConfigError(f"matrix.password_env: the homeserver refused the login: {answer}")
        token, device_id = answer.access_token, answer.device_id
        await asyncio.to_thread(
            _write_kept, directory / "login.json", {"access_token": token, "device_id": device_id}
        )
        log.info("matrix: logged in as %s, device %s (kept in %s)", client.user, device_id,
                 directory / "login.json")  # fmt: skip
    else:
        raise ConfigError(
            f"matrix.access_token_env: ${config.access_token_env} is not set (nor a password)"
        )
    assert config.user_id is not None
    if config.encryption:
        await _check_key_store(config, token, device_id, directory)
    client.restore_login(config.user_id, device_id, token)  # loads the key store
    await asyncio.to_thread(tighten, directory)


async def _device_of(client: AsyncClient, token: str, config: MatrixConfig) -> str:
    client.access_token = token
    answer = await client.whoami()
    if not isinstance(answer, WhoamiResponse) and transient(answer):
        raise PeerAway(f"whoami failed on the homeserver's side: {answer}")
    if not isinstance(answer, WhoamiResponse):
        raise ConfigError(
            f"matrix.access_token_env: {config.homeserver} rejected the token in "
            f"${config.access_token_env}: {answer}"
        )
    if answer.user_id != config.user_id:
        raise ConfigError(
            f"matrix.user_id: the token in ${config.access_token_env} belongs to "
            f"{answer.user_id}, not {config.user_id}"
        )
    if not answer.device_id:
        raise ConfigError("matrix: the homeserver did not say which device the token is for")
    device: str = answer.device_id
    return device


def read_kept(path: Path) -> dict[str, str] | None:
    try:
        data: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the kept Matrix login: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), str) for k in ("access_token", "device_id")
    ):
        raise ConfigError(f"{path}: not a kept Matrix login (delete it to log in again)")
    return {"access_token": data["access_token"], "device_id": data["device_id"]}


def _write_kept(path: Path, data: dict[str, str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)


async def _check_key_store(
    config: MatrixConfig, token: str, device_id: str, directory: Path
) -> None:
    """A device whose keys the homeserver has published but whose key store is not here
    (a state dir moved without ``matrix/``) would get a new identity from
    ``restore_login``, which people's clients refuse to encrypt for: the start fails
    with what ``doctor`` says, instead of running unable to read encrypted rooms."""
    from echo_bot.bus import DIAGNOSIS_FAIL
    from echo_bot.probe import Probe

    from .doctor import keys_diagnosis

    assert config.user_id is not None
    if await asyncio.to_thread((directory / f"{config.user_id}_{device_id}.db").is_file):
        return
    base = config.homeserver.rstrip("/")
    async with Probe() as probe:
        found = await keys_diagnosis(probe, base, config, token, device_id, directory.parent)
    if found.status != DIAGNOSIS_FAIL:
        return
    if found.text.startswith("cannot reach"):
        raise PeerAway(found.text)
    raise ConfigError(f"matrix keys: {found.text}")
