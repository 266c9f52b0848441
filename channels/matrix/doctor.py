"""What ``echo-bot doctor`` checks of Matrix: the homeserver answers, the token is the
bot account's (``whoami``), and the device's encryption keys are where the daemon
will look for them and agree with what the homeserver has published.

Read only: a daemon may run beside it. Plain HTTP, each request bounded
(``echo_bot.probe``), the token in the ``Authorization`` header only.

The keys: nio keeps a device's keys in ``<state_dir>/matrix/<user>_<device>.db``. A
device whose keys the homeserver has published but whose key store is missing here
(a state dir moved without ``matrix/``, a backup not restored) is a FAIL: a new key
store would be a new identity for the same device, which people's clients refuse to
encrypt for, so the bot could no longer read encrypted rooms.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from echo_bot.bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnosis
from echo_bot.errors import ConfigError
from echo_bot.probe import Probe, Unreachable

from .session import read_kept, store_dir
from .settings import MatrixConfig


async def diagnose(
    section: MatrixConfig, environ: Mapping[str, str], state_dir: Path
) -> list[Diagnosis]:
    base = section.homeserver.rstrip("/")
    async with Probe() as probe:
        try:
            server = await _homeserver(probe, base)
        except Unreachable as exc:
            return [Diagnosis("matrix homeserver", DIAGNOSIS_FAIL, f"cannot reach {base}: {exc}")]
        found = [server]
        if server.status == DIAGNOSIS_FAIL:
            return found
        token, device, check = await _token(probe, base, section, environ, state_dir)
        found.append(check)
        if section.encryption and token and device:
            found.append(await keys_diagnosis(probe, base, section, token, device, state_dir))
        elif not section.encryption:
            found.append(Diagnosis("matrix keys", DIAGNOSIS_OK, "encryption off: no keys"))
    return found


async def _homeserver(probe: Probe, base: str) -> Diagnosis:
    answer = await probe.ask("GET", f"{base}/_matrix/client/versions")
    status, versions = answer.status, answer.fields.get("versions")
    if status != 200 or not isinstance(versions, list):
        return Diagnosis(
            "matrix homeserver",
            DIAGNOSIS_FAIL,
            f"{base} answered /_matrix/client/versions with HTTP {status}: is it a Matrix"
            " homeserver (its client API's base URL)?",
        )
    newest = str(versions[-1]) if versions else "?"
    return Diagnosis("matrix homeserver", DIAGNOSIS_OK, f"{base} answers (Matrix up to {newest})")


async def _token(
    probe: Probe,
    base: str,
    section: MatrixConfig,
    environ: Mapping[str, str],
    state_dir: Path,
) -> tuple[str | None, str | None, Diagnosis]:
    """(token, device, the check) of the token the daemon would use: the variable's, or
    the one a first login kept, or none yet (a first login by password to come)."""
    name = "matrix token"
    token = environ.get(section.access_token_env, "")
    where = f"${section.access_token_env}"
    kept_path = store_dir(state_dir) / "login.json"
    if not token:
        try:
            kept = read_kept(kept_path)
        except ConfigError as exc:  # unreadable, or not a kept login
            return None, None, Diagnosis(name, DIAGNOSIS_FAIL, str(exc))
        if kept is not None:
            token, where = kept["access_token"], f"the login kept in {kept_path}"
        elif section.password_env and environ.get(section.password_env):
            text = (
                f"no token yet: the first start logs in by password (${section.password_env})"
                f" as a device named {section.device_name!r} and keeps it in {kept_path}"
            )
            return None, None, Diagnosis(name, DIAGNOSIS_WARN, text)
        else:
            text = f"${section.access_token_env} is not set (nor a password, password_env)"
            return None, None, Diagnosis(name, DIAGNOSIS_FAIL, text)
    try:
        asked = await probe.ask("GET", f"{base}/_matrix/client/v3/account/whoami", token=token)
    except Unreachable as exc:
        return None, None, Diagnosis(name, DIAGNOSIS_FAIL, f"cannot reach {base}: {exc}")
    status, answer = asked.status, asked.fields
    if status == 401:
        fix = "delete it to log in again by password" if "kept" in where else "make a new one"
        why = answer.get("errcode", "HTTP 401")
        text = f"{base} rejected the token in {where} ({why}): {fix}"
        return None, None, Diagnosis(name, DIAGNOSIS_FAIL, text)
    if status == 429 or status >= 500:
        text = f"{base} answered whoami with HTTP {status}; try again later"
        return None, None, Diagnosis(name, DIAGNOSIS_WARN, text)
    user, device = answer.get("user_id"), answer.get("device_id")
    if status != 200 or not isinstance(user, str):
        text = f"{base} answered whoami with HTTP {status}: is it a Matrix homeserver?"
        return None, None, Diagnosis(name, DIAGNOSIS_FAIL, text)
    if user != section.user_id:
        text = f"the token in {where} belongs to {user}, not {section.user_id} (matrix.user_id)"
        return None, None, Diagnosis(name, DIAGNOSIS_FAIL, text)
    if not isinstance(device, str) or not device:
        text = f"the token in {where} is {user}'s, but {base} names no device for it"
        return token, None, Diagnosis(name, DIAGNOSIS_WARN, text)
    return token, device, Diagnosis(name, DIAGNOSIS_OK, f"{where} is {user}'s, device {device}")


async def keys_diagnosis(
    probe: Probe,
    base: str,
    section: MatrixConfig,
    token: str,
    device: str,
    state_dir: Path,
) -> Diagnosis:
    name = "matrix keys"
    assert section.user_id is not None
    directory = store_dir(state_dir)
    local = directory / f"{section.user_id}_{device}.db"
    query = {"device_keys": {section.user_id: [device]}}
    try:
        asked = await probe.ask("POST", f"{base}/_matrix/client/v3/keys/query", token=token,
                                  body=query)  # fmt: skip
    except Unreachable as exc:
        return Diagnosis(name, DIAGNOSIS_FAIL, f"cannot reach {base}: {exc}")
    if asked.status != 200 or not isinstance(asked.body, dict):
        return Diagnosis(
            name, DIAGNOSIS_WARN, f"{base} answered keys/query with HTTP {asked.status}"
        )
    devices = (asked.body.get("device_keys") or {}).get(section.user_id) or {}
    published = isinstance(devices, dict) and device in devices
    if not local.is_file():
        others = sorted(p.name for p in directory.glob("*.db")) if directory.is_dir() else []
        if published:
            text = (
                f"{base} has device {device}'s keys, but {directory} holds no key store for it"
                f" ({', '.join(others) or 'none at all'}): restore {directory} from its backup,"
                " or use a token of a new device (a new key store is a new identity for the"
                " same device, which people's clients refuse to encrypt for)"
            )
            return Diagnosis(name, DIAGNOSIS_FAIL, text)
        text = f"no keys yet for device {device}: made at the first start in {local}"
        return Diagnosis(name, DIAGNOSIS_OK, text)
    mode = local.stat().st_mode & 0o777
    if mode & 0o077:
        text = f"{local} is readable by others (mode {mode:o}): chmod 600 it"
        return Diagnosis(name, DIAGNOSIS_WARN, text)
    where = "published on the homeserver" if published else "published at the next start"
    return Diagnosis(name, DIAGNOSIS_OK, f"device {device}'s keys in {local}, {where}")
