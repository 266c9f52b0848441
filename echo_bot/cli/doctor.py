"""`echo-bot doctor`: check what a daemon needs, and say what to fix."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from ..bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnoses, Diagnosis
from ..config import LoadedConfig, channel_enabled, llm_enabled, url_host
from ..errors import ConfigError, EchoBotError
from ..sizes import format_size
from ..store import (
    DB_FILENAME,
    DatabaseCheck,
    check_database,
    check_file,
    describe_url,
    is_empty_file,
    queued_outbound,
)
from ..store.schema import MIGRATIONS

OK, WARN, FAIL = DIAGNOSIS_OK, DIAGNOSIS_WARN, DIAGNOSIS_FAIL
TIMEOUT = 5.0  # seconds for each peer; the peers are asked at once
MAX_ANSWER = 64 * 1024
_ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$")


def environ_with_file(environ: Mapping[str, str], env_file: Path | None) -> dict[str, str]:
    """``environ`` with the service's environment file on top (``--env-file``): what the
    daemon sees under systemd (``EnvironmentFile=``), for a doctor run from a shell.

    The file's syntax is systemd's: ``KEY=value`` lines, ``#`` and ``;`` comments, a
    value optionally in single or double quotes. Its values win over the shell's.
    """
    env = dict(environ)
    if env_file is None:
        return env
    try:
        text = env_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--env-file {env_file}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--env-file {env_file}: not UTF-8 text") from None
    for line in text.splitlines():
        line = line.strip()
        match = _ENV_LINE.match(line)
        if not match or line.startswith(("#", ";")):
            continue
        name, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name] = value
    return env


def _check_state_dir(state_dir: Path) -> tuple[str, str]:
    if not state_dir.exists():
        parent = state_dir.parent
        while not parent.exists():
            parent = parent.parent
        if not os.access(parent, os.W_OK):
            return FAIL, f"{state_dir} does not exist and {parent} is not writable"
        return OK, f"{state_dir} will be created at first start"
    if not state_dir.is_dir():
        return FAIL, f"{state_dir} is not a directory"
    if not os.access(state_dir, os.W_OK):
        return FAIL, f"{state_dir} is not writable by this user"
    mode = state_dir.stat().st_mode & 0o777
    if mode & 0o077:
        return WARN, f"{state_dir} is readable by others (mode {mode:o}); chmod 700 it"
    return OK, f"{state_dir} is writable"


def _owned_by_others(state_dir: Path, store: Path) -> list[str]:
    """The store's files (``-wal`` and ``-shm`` too) another user owns than the state
    dir's: doctor run with sudo reads them, the service's user may not."""
    owner = state_dir.stat().st_uid
    files = [store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")]
    return [f.name for f in files if f.exists() and f.stat().st_uid != owner]


def _check_store(state_dir: Path) -> tuple[str, str]:
    path = state_dir / DB_FILENAME
    if not path.exists():
        return OK, "no store yet (created at first start)"
    strangers = _owned_by_others(state_dir, path)
    if strangers:  # a restore done with `sudo cp`: root's file, the service cannot open it
        return FAIL, (
            f"{', '.join(strangers)} not owned by the state dir's owner (uid"
            f" {state_dir.stat().st_uid}), who runs the daemon: chown them to it"
        )
    found = check_file(path)
    if found.error is not None:
        return FAIL, f"cannot read {path}: {found.error}"
    if not found.ok:
        return FAIL, f"{path} is damaged ({found.verdict}); restore a backup (systemd/README.md)"
    expected = len(MIGRATIONS)
    if found.schema is None:  # an empty file, or another program's SQLite file
        return WARN, (
            f"{path} is empty (0 bytes): `echo-bot run` begins a new store there; if it"
            " held your data, restore a backup (systemd/README.md)"
            if is_empty_file(path)
            else f"{path} holds no echo-bot store (SQLite without its tables): is this the"
            " state dir you meant?"
        )
    if found.schema is not None and found.schema > expected:
        return FAIL, (
            f"{path}: schema version {found.schema}, newer than this echo-bot ({expected});"
            " upgrade echo-bot (the daemon refuses to start on it)"
        )
    behind = (
        f", migrated to {expected} at the next start"
        if found.schema is not None and found.schema < expected
        else ""
    )
    return OK, f"{path}: quick check ok, schema version {found.schema}{behind}"


def _check_database(url: str) -> tuple[tuple[str, str], DatabaseCheck]:
    """The PostgreSQL store ([storage] engine = "postgres"), read only."""
    found = check_database(url)
    where = f"PostgreSQL {describe_url(url)}"
    if found.error is not None:
        return (FAIL, found.error), found
    if found.schema is None:
        return (OK, f"{where}: no schema yet (created at first start)"), found
    if found.schema > found.expected:
        return (
            FAIL,
            f"{where}: schema version {found.schema}, newer than this echo-bot"
            f" ({found.expected}); upgrade echo-bot",
        ), found
    behind = (
        f", migrated to {found.expected} at the next start" if found.schema < found.expected else ""
    )
    return (
        OK,
        f"{where}: schema version {found.schema}{behind}; {found.live} daemon(s) live",
    ), found


def _is_local(name: str) -> bool:
    from ..plugins import registry

    spec = registry().get(name)
    return spec is not None and spec.local


def _check_outbox(
    state_dir: Path, running: frozenset[str], database: DatabaseCheck | None = None
) -> tuple[str, str] | None:
    """Messages queued for a channel this config does not run are never delivered."""
    path = state_dir / DB_FILENAME
    if database is not None:
        if database.error is not None or database.schema is None:
            return None
        found = database.queued
    elif not path.exists() or is_empty_file(path):
        return None
    else:
        found = queued_outbound(path)
    if found.error is not None:
        return WARN, f"cannot read the outbox of {path}: {found.error}"
    queued = found.by_channel
    stranded = {name: n for name, n in sorted(queued.items()) if name not in running}
    if not stranded:
        waiting = sum(queued.values())
        return OK, f"{waiting} message(s) waiting for delivery" if waiting else "empty"
    parts = []
    for name, count in stranded.items():
        if _is_local(name):
            parts.append(f"{count} message(s) for {name} wait for a terminal (`echo-bot chat`)")
        else:
            parts.append(
                f"{count} message(s) for {name} wait, but the {name} channel is not enabled"
                " in this config: enable it, or they are never delivered"
            )
    return WARN, "; ".join(parts)


def _check_media(workspace: Path, inbox_max: int) -> tuple[str, str]:
    """How much the files people sent take (``<workspace>/inbox``), against its cap."""
    from ..media.budget import measure
    from ..media.inbox import INBOX

    inbox = workspace / INBOX
    if not inbox.is_dir():
        return OK, f"{inbox}: no files yet (cap {format_size(inbox_max)}, [media] inbox_max)"
    used = measure(inbox)
    text = (
        f"{inbox}: {format_size(used.total)} in {used.files} file(s), cap"
        f" {format_size(inbox_max)} ([media] inbox_max)"
    )
    if used.total >= inbox_max:
        return WARN, f"{text}: full, new files are refused until old days are pruned"
    return OK, text


async def _probe_peers(
    probes: list[tuple[str, Any]], diagnoses: list[Any]
) -> list[tuple[str, str, str]]:
    """The peers asked at once: the core's probes, then each channel's own checks."""
    results = await asyncio.gather(*(probe for _name, probe in probes), *diagnoses)
    checks = [
        (name, status, text)
        for (name, _p), (status, text) in zip(probes, results[: len(probes)], strict=True)
    ]
    for found in results[len(probes) :]:
        checks += [(d.name, d.status, d.text) for d in found]
    return checks


def _diagnosed(loaded: LoadedConfig, environ: Mapping[str, str], state_dir: Path) -> list[Any]:
    """The checks of the enabled channels that check their own peer
    (``Capabilities.diagnoses``: the Matrix homeserver, token and keys)."""
    from ..app import load_channel_class
    from ..config import channel_enabled, channel_names, channel_section

    found = []
    for name in channel_names():
        section = channel_section(loaded.config, name)
        if section is None or not channel_enabled(loaded, environ, name):
            continue
        try:
            channel = load_channel_class(name)
        except ConfigError as exc:  # an extra not installed: said as a check of its own
            found.append(_missing_extra(name, str(exc)))
            continue
        if channel.capabilities.diagnoses:
            made = cast("Diagnoses", channel).diagnose(section, environ, state_dir)
            found.append(_guarded(name, made))
    return found


async def _guarded(name: str, checks: Awaitable[list[Diagnosis]]) -> list[Diagnosis]:
    """A channel's checks; one that fails is a failed check of that channel, never the
    end of doctor (its other checks are still said)."""
    try:
        return await checks
    except Exception as exc:
        return [Diagnosis(name, DIAGNOSIS_FAIL, f"its check failed: {type(exc).__name__}: {exc}")]


async def _missing_extra(name: str, why: str) -> list[Diagnosis]:
    return [Diagnosis(name, DIAGNOSIS_FAIL, why)]


def _check_mcp(mcp: Any, environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """Each MCP server started as the daemon would start it (and stopped again)."""
    from ..mcp.listing import snapshot

    checks = []
    for status in asyncio.run(snapshot(mcp.servers, environ, mcp.max_tools)):
        name = f"mcp {status.name}"
        if status.state != "ready":
            why = status.error or "no answer to initialize"
            checks.append((name, FAIL, f"{status.transport}: {why}"))
            continue
        text = f"{status.transport}: ready, {len(status.tools)} tools"
        if status.problems:
            left = "; ".join(status.problems)
            checks.append((name, WARN, f"{text}; left out: {left}"))
        else:
            checks.append((name, OK, text))
    return checks


Check = tuple[str, str, str]  # name, status (OK, WARN, FAIL), text


def run_doctor(
    loaded_or_error: LoadedConfig | EchoBotError,
    source: str,
    state_dir: Path,
    environ: Mapping[str, str],
) -> int:
    loaded, config_check = _check_config(loaded_or_error, source, state_dir, environ)
    checks: list[Check] = [config_check, ("state dir", *_check_state_dir(state_dir))]
    store_check, database = _check_storage(loaded, state_dir, environ)
    checks.append(("store", *store_check))
    if loaded is not None:
        checks += _check_configured(loaded, state_dir, environ, database)
    return _report(checks)


def _check_config(
    loaded_or_error: LoadedConfig | EchoBotError,
    source: str,
    state_dir: Path,
    environ: Mapping[str, str],
) -> tuple[LoadedConfig | None, Check]:
    """The config as loaded (None when it could not be), and whether the daemon would
    build from it."""
    if isinstance(loaded_or_error, EchoBotError):
        return None, ("config", FAIL, str(loaded_or_error))
    from ..runtime import build

    try:
        build(loaded_or_error, state_dir, environ)
    except EchoBotError as exc:
        return loaded_or_error, ("config", FAIL, str(exc))
    return loaded_or_error, ("config", OK, f"{source} is valid, and its secrets are set")


def _check_storage(
    loaded: LoadedConfig | None, state_dir: Path, environ: Mapping[str, str]
) -> tuple[tuple[str, str], DatabaseCheck | None]:
    """The store the config names: the PostgreSQL database, else the state dir's file."""
    storage = loaded.config.storage if loaded is not None else None
    if storage is None or storage.engine != "postgres":
        return _check_store(state_dir), None
    url = environ.get(storage.url_env, "")
    if not url:
        return (FAIL, f"{storage.url_env} is not set (the database URL)"), None
    return _check_database(url)


def _check_configured(
    loaded: LoadedConfig,
    state_dir: Path,
    environ: Mapping[str, str],
    database: DatabaseCheck | None,
) -> list[Check]:
    """The checks of what the config switches on: its peers, MCP servers, the outbox of
    its channels and the media folder."""
    config = loaded.config
    running, probes = _peer_probes(loaded, environ)
    checks: list[Check] = asyncio.run(_probe_peers(probes, _diagnosed(loaded, environ, state_dir)))
    if config.mcp.servers:
        checks += _check_mcp(config.mcp, environ)
    outbox = None  # on PostgreSQL unreached, none: the state dir's file is not the store
    if database is not None or config.storage.engine != "postgres":
        outbox = _check_outbox(state_dir, frozenset(running), database)
    if outbox is not None:
        checks.append(("outbox", *outbox))
    workspace = (config.tools.workspace or state_dir / "workspace").expanduser()
    checks.append(("media", *_check_media(workspace, config.media.inbox_max)))
    if config.console.enabled:
        checks.append(("console", *_check_console(config)))
    return checks


def _check_console(config: Any) -> tuple[str, str]:
    from ..config import console_base, console_exposure

    exposure = console_exposure(config)
    if exposure is not None:
        return WARN, exposure
    return OK, f"served at {console_base(config)}/console/ (sign in: `echo-bot console link`)"


def _peer_probes(
    loaded: LoadedConfig, environ: Mapping[str, str]
) -> tuple[set[str], list[tuple[str, Any]]]:
    """The channels that would run (but the terminal, which runs only when asked), and
    the probes of the peers the core talks to (each channel checks its own)."""
    from ..plugins import registry

    config = loaded.config
    running = {
        spec.name
        for spec in registry().specs.values()
        if not spec.local and channel_enabled(loaded, environ, spec.name)
    }
    probes: list[tuple[str, Any]] = []
    if llm_enabled(loaded, environ):
        openai = config.openai
        probes.append(("llm", _llm(openai.base_url, environ.get(openai.api_key_env, ""),
                                   openai.model, openai.api_key_env)))  # fmt: skip
    return running, probes


async def _llm(base_url: str, key: str, model: str, key_env: str) -> tuple[str, str]:
    """The model server's listing, asked as the daemon asks (with its key): the key
    taken, and the configured model among those listed. (Any answer counted: a wrong
    key's 401 said ok.)"""
    from aiohttp import ClientError, ClientSession, ClientTimeout

    parts = urlsplit(base_url)
    host = url_host(str(parts.hostname or ""))
    host = f"{host}:{parts.port}" if parts.port else host
    path = parts.path.rstrip("/") + "/models"
    shown = urlunsplit(parts._replace(netloc=host, path=path, query=""))  # no password
    # A key is the Authorization; a password in the URL then is not sent besides it.
    url = urlunsplit(parts._replace(netloc=host if key else parts.netloc, path=path))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=TIMEOUT)) as session,
            session.get(url, headers=headers, allow_redirects=False) as response,
        ):
            status = response.status
            listed = await response.json(content_type=None) if status == 200 else None
    except (ClientError, TimeoutError, OSError, ValueError) as exc:
        return FAIL, f"cannot reach {shown}: {type(exc).__name__} {exc}".strip()
    if status in (401, 403):
        return FAIL, f"{shown} refused the key (HTTP {status}): check ${key_env}"
    if status != 200:
        return WARN, f"{shown} answers HTTP {status}: is [openai] base_url right?"
    rows = listed.get("data") if isinstance(listed, dict) else None
    ids = [str(row.get("id")) for row in rows if isinstance(row, dict)] if isinstance(
        rows, list) else []  # fmt: skip
    if ids and model not in ids:
        return WARN, f"{shown}: the key is taken, but {model} is not among its {len(ids)} models"
    return OK, f"{shown}: the key is taken, {model} is there"


def _report(checks: list[Check]) -> int:
    """Print one line a check and the verdict; the exit status: 1 when a check failed."""
    width = max(len(name) for name, _s, _t in checks)
    for name, status, text in checks:
        text = text.replace("\n", "\n" + " " * (width + 9))
        print(f"[{status:>4}] {name:<{width}}  {text}")
    failed = [name for name, status, _t in checks if status == FAIL]
    warned = [name for name, status, _t in checks if status == WARN]
    if failed:
        print(f"Fix: {', '.join(failed)}.")
    elif warned:
        print(f"Works, but look at: {', '.join(warned)}.")
    else:
        print("All good.")
    return 1 if failed else 0
