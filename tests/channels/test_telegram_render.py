"""Telegram sending helpers: long text split in UTF-16 units, keyboards, pacing (no network)."""

from __future__ import annotations

import random

import pytest

from channels.telegram.render import (
    MAX_TEXT,
    keyboard_rows,
)
from echo_bot.events import Button
from echo_bot.richtext.model import Formatted
from echo_bot.richtext.splitting import split_formatted


def split_text(text: str, limit: int = MAX_TEXT) -> list[str]:
    """A plain text cut as Telegram's messages are: in UTF-16 units."""
    return [part.text for part in split_formatted(Formatted(text), limit, "utf16")]


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def squeeze(text: str) -> str:
    """The text without whitespace: what a split may not change."""
    return "".join(text.split())


ALPHABET = ["a", "b", "Z", "7", " ", " ", "\n", "\n\n", "🙂", "é", "\u200b", "ש", "𝕏", "word "]


def random_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(size))


@pytest.mark.parametrize("seed", range(40))
def test_split_never_loses_text_and_respects_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    limit = rng.choice([16, 50, 200, MAX_TEXT])
    text = random_text(rng, rng.randint(1, limit * 5))
    if not text.strip():
        text += "x"
    parts = split_text(text, limit)
    assert parts
    assert all(utf16_len(p) <= limit for p in parts), [utf16_len(p) for p in parts]
    assert all(p.strip() for p in parts)  # Telegram refuses a blank message
    assert squeeze("".join(parts)) == squeeze(text)
    # Only whitespace may go missing, and only at a cut; everything else stays in order.
    rest = text
    for part in parts:
        at = rest.find(part.strip())
        assert at >= 0 and not rest[:at].strip(), (part, rest[:80])
        rest = rest[at + len(part.strip()) :]
    assert not rest.strip()


def test_split_prefers_paragraph_then_line_breaks() -> None:
    first = "first paragraph line\n" * 30
    second = "second paragraph " * 20
    text = first + "\n" + second
    parts = split_text(text, limit=len(first) + 40)
    assert parts[0] == first.rstrip("\n")
    assert parts[1] == second.rstrip()  # whitespace at the end of a message is dropped

    lines = "".join(f"line {n:03d} with some words in it\n" for n in range(100))
    parts = split_text(lines, limit=500)
    assert len(parts) > 1
    for part in parts:
        for line in part.strip("\n").split("\n"):
            assert line.startswith("line ") and line.endswith("in it")
    assert "\n".join(p.rstrip("\n") for p in parts) + "\n" == lines


def test_split_a_single_huge_word() -> None:
    word = "x" * 10_000
    parts = split_text(word)
    assert parts == ["x" * 4096, "x" * 4096, "x" * (10_000 - 2 * 4096)]


def test_split_counts_utf16_units_like_telegram() -> None:
    text = "🙂" * 3000  # 6000 UTF-16 units in 3000 characters
    parts = split_text(text)
    assert [utf16_len(p) for p in parts] == [4096, 6000 - 4096]
    assert "".join(parts) == text


def test_split_never_sends_a_blank_part() -> None:
    text = "a" * 2000 + "\n" + " " * 4000 + "\n" + "b" * 200
    parts = split_text(text)
    assert all(p.strip() for p in parts)
    assert squeeze("".join(parts)) == squeeze(text)


def test_short_and_empty_text() -> None:
    assert split_text("hello") == ["hello"]
    assert split_text("x" * MAX_TEXT) == ["x" * MAX_TEXT]
    assert split_text("") == ["(empty reply)"]
    assert split_text(" \n ") == ["(empty reply)"]


def test_keyboard_rows_drop_actions_over_64_bytes() -> None:
    fits = "approve_once:" + "a" * 32
    buttons = [
        [Button(label="Approve", action=fits), Button(label="Too long", action="x" * 65)],
        [Button(label="Wide", action="é" * 33)],  # 33 characters, 66 bytes
        [Button(label="Exactly", action="y" * 64)],
    ]
    assert keyboard_rows(buttons) == [[("Approve", fits)], [("Exactly", "y" * 64)]]
    assert keyboard_rows([]) == []
