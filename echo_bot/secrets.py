"""Masking of secret values wherever they could appear: logs, audit, tool output, errors."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO
from urllib.parse import quote

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
        # A secret may also appear percent-encoded: in a URL an error message quotes.
        fresh |= {quote(v, safe="") for v in fresh} | {quote(v) for v in fresh}
        fresh |= {read for v in fresh if len(read := as_read(v)[0]) >= _MIN_SECRET_LEN}
        self._values = sorted(set(self._values) | fresh, key=len, reverse=True)

    @classmethod
    def from_environment(cls, names: Iterable[str], environ: Mapping[str, str]) -> Masker:
        return cls(environ.get(name, "") for name in names)

    def mask(self, text: str) -> str:
        if not text.isascii():  # a secret may be disguised as only Unicode can
            return _replaced(text, self.find(text)) if self._values else text
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def find(self, text: str) -> list[tuple[int, int]]:
        """Where known secret values are in ``text``: (start, end) spans, sorted and
        apart (overlapping occurrences are one span). Replacing each with ``***`` masks
        ``text`` as ``mask`` does (secrets that overlap, wholly), for one who must know
        what moved: a channel keeping its formatting's offsets valid.

        A secret is found as a person would read it: with invisible characters (a
        zero-width space) inside it, or written in look-alike forms (full-width
        letters) that NFKC folds into it; its span then covers those characters."""
        if not self._values:
            return []
        shown, origin = as_read(text)
        found = []
        for value in self._values:
            start = shown.find(value)
            while start >= 0:
                found.append((start, start + len(value)))
                start = shown.find(value, start + 1)
        if origin is not None:
            found = [(origin[start], origin[end - 1] + 1) for start, end in found]
        spans: list[tuple[int, int]] = []
        for start, end in sorted(found):
            if spans and start < spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((start, end))
        return spans

    def mask_growing(self, text: str) -> str:
        """``text`` masked, for a text that is still being written (a streamed reply):
        an end that could be the start of a secret is held back, since the rest of the
        secret may follow and the mask could not catch it in pieces."""
        text = self.mask(text)
        keep = len(text)
        for value in self._values:
            for size in range(min(len(value) - 1, len(text)), 0, -1):
                if text.endswith(value[:size]):
                    keep = min(keep, len(text) - size)
                    break
        return text[:keep]

    def mask_data(self, data: Any, *, by_key: bool = True) -> Any:
        """Mask strings inside JSON-like data, and (``by_key``) every value under a
        secret-named key.

        Approval prompts pass ``by_key=False``: there a value hidden only because of its
        key's name would be an argument the approver cannot see (an ``X-Token`` header
        can carry any data out); known secret values are still masked."""
        if isinstance(data, str):
            return self.mask(data) if self._values else data
        if data is None or isinstance(data, int | float):  # bool is an int
            return data
        if isinstance(data, dict | Mapping):
            return {
                k: (
                    MASK
                    if by_key and isinstance(k, str) and is_secret_key(k) and v
                    else self.mask_data(v, by_key=by_key)
                )
                for k, v in data.items()
            }
        if isinstance(data, list | tuple):
            return [self.mask_data(v, by_key=by_key) for v in data]
        return data


@functools.cache
def _format_characters() -> re.Pattern[str]:
    """Format characters (zero-width spaces and joiners, bidi marks): invisible in a
    text. Built on first use (a walk over Unicode, about 50 ms)."""
    ranges: list[list[int]] = []  # as ranges: a class of ranges is searched fast
    for code in range(0x80, 0x110000):
        if unicodedata.category(chr(code)) == "Cf":
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    spans = (f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return re.compile("[" + "".join(spans) + "]")


def as_read(text: str) -> tuple[str, list[int] | None]:
    """``text`` as it reads: format characters left out and each character
    NFKC-folded; ``origin[i]``: the index in ``text`` of the character the ``i``-th
    came from (None: ``text`` reads as it is written, the usual case, found fast)."""
    if text.isascii() or (
        unicodedata.is_normalized("NFKC", text) and _format_characters().search(text) is None
    ):
        return text, None
    pieces: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        if char.isascii():
            pieces.append(char)
            origin.append(index)
        elif unicodedata.category(char) != "Cf":
            folded = unicodedata.normalize("NFKC", char)
            pieces.append(folded)
            origin.extend([index] * len(folded))
    return "".join(pieces), origin


def _replaced(text: str, spans: list[tuple[int, int]]) -> str:
    pieces, at = [], 0
    for start, end in spans:
        pieces += [text[at:start], MASK]
        at = end
    pieces.append(text[at:])
    return "".join(pieces)


class MaskedStream(io.TextIOBase):
    """A text stream that masks each line before passing it on. Lines are masked
    whole, so a secret written in pieces (``print(a, b)``) is still caught."""

    def __init__(self, target: TextIO, masker: Masker) -> None:
        super().__init__()
        self.target = target
        self.masker = masker
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, _, self._pending = self._pending.rpartition("\n")
            self.target.write(self.masker.mask(lines + "\n"))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.target.write(self.masker.mask(self._pending))
            self._pending = ""
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.target.encoding


@contextlib.contextmanager
def masked_output(masker: Masker) -> Iterator[None]:
    """Everything printed to stdout and stderr inside passes the masker."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = MaskedStream(saved[0], masker), MaskedStream(saved[1], masker)
    try:
        yield
    finally:
        masked = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = saved
        for stream in masked:  # may raise BrokenPipeError: the caller decides what it means
            stream.flush()
