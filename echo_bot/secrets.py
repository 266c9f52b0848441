"""Masking of secret values wherever they could appear: logs, audit, tool output, errors."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
_SECRET_KEY = re.compile(r"(token|secret|password|passwd|api[_-]?key|authorization|cookie)", re.I)
_MIN_SECRET_LEN = 4


@functools.lru_cache(maxsize=1024)
def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


class Masker:
    """Replaces every known secret value with ``***``; longest values first."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: list[str] = []
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        fresh = {v for v in values if v and len(v) >= _MIN_SECRET_LEN}
        self._values = sorted(set(self._values) | fresh, key=len, reverse=True)

    @classmethod
    def from_environment(cls, names: Iterable[str], environ: Mapping[str, str]) -> Masker:
        return cls(environ.get(name, "") for name in names)

    def mask(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def mask_data(self, data: Any) -> Any:
        """Mask strings inside JSON-like data, and every value under a secret-named key."""
        if isinstance(data, str):
            return self.mask(data) if self._values else data
        if data is None or isinstance(data, int | float):  # bool is an int
            return data
        if isinstance(data, dict | Mapping):
            return {
                k: (MASK if isinstance(k, str) and is_secret_key(k) and v else self.mask_data(v))
                for k, v in data.items()
            }
        if isinstance(data, list | tuple):
            return [self.mask_data(v) for v in data]
        return data
