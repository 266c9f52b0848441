"""Where state lives, and the lock that keeps one daemon per state dir."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping
from pathlib import Path

from .errors import StateLockedError, StoreError
from .hardening import PRIVATE_DIR, PRIVATE_FILE, make_private

LOCK_FILENAME = "echo-bot.lock"


def resolve_state_dir(
    cli_value: Path | None, config_value: Path | None, environ: Mapping[str, str]
) -> Path:
    """``--state-dir`` > ``[bot] state_dir`` > ``$STATE_DIRECTORY`` > the user's state dir."""
    if cli_value is not None:
        return cli_value.expanduser().resolve()
    if config_value is not None:
        return config_value.expanduser().resolve()
    systemd = environ.get("STATE_DIRECTORY")
    if systemd:
        # systemd may pass several colon-separated dirs; the first is ours.
        return Path(systemd.split(":")[0]).resolve()
    from platformdirs import user_state_path

    return user_state_path("echo-bot", appauthor=False)


class StateLock:
    """An exclusive ``flock`` on ``<state_dir>/echo-bot.lock``, holding our pid."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILENAME
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
            # A dir that existed before (made by hand, or by systemd with its default
            # 0755) keeps its mode otherwise: the store and backups must not be readable.
            make_private(self.state_dir, PRIVATE_DIR)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        except OSError as exc:
            raise StoreError(f"cannot use state dir {self.state_dir}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = read_lock_pid(self.path)
            os.close(fd)
            raise StateLockedError(str(self.state_dir), pid) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_lock_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def daemon_pid(state_dir: Path) -> int | None:
    """The pid of the daemon holding the state dir, or None when nobody holds it."""
    path = state_dir / LOCK_FILENAME
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_lock_pid(path)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
