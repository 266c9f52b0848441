"""Logging set-up: readable text or one JSON object per line, secrets masked."""

from __future__ import annotations

import json
import logging
import sys
import time

from .secrets import Masker


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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "component": record.name,
            "message": record.getMessage(),
        }
        for key in ("trace_id", "session"):
            value = getattr(record, key, None)
            if value:
                payload[key] = value
        if record.exc_text:
            payload["exc"] = record.exc_text
        return json.dumps(payload, ensure_ascii=False)


def setup_logging(level: str, fmt: str, masker: Masker) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(MaskingFilter(masker))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
