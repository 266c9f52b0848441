"""Logging set-up: readable text or one JSON object per line, secrets masked."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar

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


def setup_logging(level: str, fmt: str, masker: Masker) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(MalformedRequestFilter())
    handler.addFilter(MaskingFilter(masker))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
