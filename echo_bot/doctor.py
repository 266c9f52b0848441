"""`echo-bot doctor`: check what a daemon needs, and say what to fix."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from .config import DEFAULT_OPENAI_BASE_URL, LoadedConfig, llm_enabled, telegram_enabled
from .errors import EchoBotError
from .store import DB_FILENAME

OK, WARN, FAIL = "ok", "warn", "FAIL"


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


def _check_store(state_dir: Path) -> tuple[str, str]:
    path = state_dir / DB_FILENAME
    if not path.exists():
        return OK, "no store yet (created at first start)"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as exc:
        return FAIL, f"cannot read {path}: {exc}"
    if verdict != "ok":
        return FAIL, f"{path} is damaged ({verdict}); restore a backup (systemd/README.md)"
    return OK, f"{path}: integrity ok"


async def _reach(url: str, timeout: float = 5.0) -> tuple[str, str]:
    from aiohttp import ClientError, ClientSession, ClientTimeout

    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=timeout)) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            return OK, f"{url.split('/bot')[0]} answers (HTTP {response.status})"
    except (ClientError, TimeoutError, OSError) as exc:
        shown = url.split("/bot")[0]
        return FAIL, f"cannot reach {shown}: {type(exc).__name__} {exc}".strip()


def run_doctor(
    loaded_or_error: LoadedConfig | EchoBotError,
    source: str,
    state_dir: Path,
    environ: Mapping[str, str],
) -> int:
    checks: list[tuple[str, str, str]] = []
    if isinstance(loaded_or_error, EchoBotError):
        checks.append(("config", FAIL, str(loaded_or_error)))
        loaded = None
    else:
        loaded = loaded_or_error
        from .core import build_core

        try:
            build_core(loaded, state_dir, environ)
            checks.append(("config", OK, f"{source} is valid, and its secrets are set"))
        except EchoBotError as exc:
            checks.append(("config", FAIL, str(exc)))
    checks.append(("state dir", *_check_state_dir(state_dir)))
    checks.append(("store", *_check_store(state_dir)))
    if loaded is not None:
        config = loaded.config
        probes: list[tuple[str, str]] = []
        if telegram_enabled(loaded, environ):
            probes.append(("telegram", config.telegram.api_base.rstrip("/")))
        if llm_enabled(loaded, environ):
            base = config.openai.base_url.rstrip("/")
            probes.append(("llm", base + "/models" if base != DEFAULT_OPENAI_BASE_URL else base))
        for name, url in probes:
            status, text = asyncio.run(_reach(url))
            checks.append((name, status, text))
    width = max(len(name) for name, _s, _t in checks)
    for name, status, text in checks:
        text = text.replace("\n", "\n" + " " * (width + 9))
        print(f"[{status:>4}] {name:<{width}}  {text}")
    failed = [name for name, status, _t in checks if status == FAIL]
    print("All good." if not failed else f"Fix: {', '.join(failed)}.")
    return 1 if failed else 0
