"""Logging set-up: readable text or one JSON object per line, secrets masked."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from contextvars import ContextVar
from pathlib import Path

from .errors import ConfigError, StoreUnavailable
from .secrets import Masker

# The turn being worked on, for log lines written while it runs (JSON format).
current_trace: ContextVar[str | None] = ContextVar("current_trace", default=None)
current_session: ContextVar[str | None] = ContextVar("current_session", default=None)


class MaskingFilter(logging.Filter):
    def __init__(self, masker: Masker) -> None:
        super().__init__()
        self.masker = masker

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format call must not break the caller
            message = f"{record.msg!r} (unformattable arguments {record.args!r})"
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg = self.masker.mask(message)
        record.args = None
        if record.exc_text:
            record.exc_text = self.masker.mask(record.exc_text)
        if record.stack_info:
            record.stack_info = self.masker.mask(record.stack_info)
        return True


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs every request its HTTP parser refuses as an ERROR with a traceback;
    any stranger could fill the log that way. Keep one short warning line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "aiohttp.server" and record.exc_info and record.exc_info[1]:
            error = record.exc_info[1]
            if type(error).__module__.startswith("aiohttp.http_exceptions"):
                record.levelno, record.levelname = logging.WARNING, "WARNING"
                record.msg, record.args = (
                    "refused a malformed HTTP request: %s",
                    (type(error).__name__,),
                )
                record.exc_info = record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "component": record.name,
            "message": record.getMessage(),
        }
        trace = getattr(record, "trace_id", None) or current_trace.get()
        session = getattr(record, "session", None) or current_session.get()
        if trace:
            payload["trace_id"] = trace
        if session:
            payload["session"] = session
        if record.exc_text:
            payload["exc"] = record.exc_text
        return json.dumps(payload, ensure_ascii=False)


# Routine chatter of libraries, one line per Telegram update, per Matrix event (nio's
# rooms and crypto) and three per reminder fired: debug detail, shown only when [bot]
# log_level is DEBUG (their warnings always are).
CHATTY_LOGGERS = ("aiogram.event", "apscheduler", "nio")


def setup_logging(
    level: str,
    fmt: str,
    masker: Masker,
    *,
    stderr_level: str | None = None,
    log_file: Path | None = None,
) -> None:
    """Log at ``level``: to stderr, raised there to ``stderr_level`` when given (the
    terminal chat shares the screen), and to ``log_file`` when given."""
    handlers = [_handler(logging.StreamHandler(sys.stderr), fmt, masker)]
    if stderr_level is not None:
        handlers[0].setLevel(max(logging.getLevelName(level), logging.getLevelName(stderr_level)))
    if log_file is not None:
        handlers.append(_handler(_open_log_file(log_file), fmt, masker))
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level)
    quiet = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(quiet)


def _handler(handler: logging.Handler, fmt: str, masker: Masker) -> logging.Handler:
    handler.addFilter(MalformedRequestFilter())
    handler.addFilter(MaskingFilter(masker))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def _open_log_file(path: Path) -> logging.Handler:
    """Appends to ``path``, made 0600 whether new or not (the log names chats, users and
    tools); a symlink there is refused, not followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
    except OSError as exc:
        why = exc.strerror
        if exc.errno == errno.ELOOP and path.is_symlink():  # O_NOFOLLOW met the link
            why = "it is a symlink, and symlinks are refused (give the file's own path)"
        raise ConfigError(f"cannot write the log file {path}: {why}") from exc
    return logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8"))


def log_retrying(log: logging.Logger, message: str, *args: object) -> None:
    """Log the error being handled before a loop tries again: one warning line when the
    store is away for now (it repeats until it is back), else the whole traceback."""
    error = sys.exc_info()[1]
    if not isinstance(error, StoreUnavailable):
        log.exception(message, *args)
        return
    now = time.monotonic()
    if now - _last_said.get(message, -_SAY_EVERY) >= _SAY_EVERY:  # loops try every second
        _last_said[message] = now
        log.warning(message + " (%s)", *args, error)


_SAY_EVERY = 30.0  # seconds between two warnings of one loop while the store is away
_last_said: dict[str, float] = {}
