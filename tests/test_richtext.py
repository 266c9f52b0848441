"""The outgoing-text pipeline every channel's text passes (echo_bot/richtext): the
masker reads secrets as people do, links that lie about their host show their target,
one splitter keeps every unit's limit, and a part whose wire still reads as a secret is
never sent."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from echo_bot.richtext.markdown import misleading, render_markdown
from echo_bot.richtext.markup import written
from echo_bot.richtext.model import Formatted, Span
from echo_bot.richtext.parts import WITHHELD, as_written, message_parts
from echo_bot.richtext.splitting import Unit, measure, split_formatted
from echo_bot.secrets import Masker

SECRET = "sk-pa&ss<word>-1234567890"


def test_a_secret_with_invisible_characters_or_look_alike_letters_is_masked() -> None:
    masker = Masker([SECRET])
    for disguised in (
        "sk-pa&ss<word>-12345\u200b67890",  # zero-width space
        "sk-pa&ss<word>-12345\u2060678\u200d90",  # word joiner, zero-width joiner
        "ｓｋ-pa&ss<word>-１２３4567890",  # full-width letters and digits
        "sk-pa&ss<word>\u202e-1234567890",  # a bidi override
    ):
        assert masker.mask(f"a {disguised} b") == "a *** b", disguised
    assert masker.find("é sk-pa&ss<word>-12345\u200b67890!") == [(2, 28)]
    assert masker.mask("nothing here: é") == "nothing here: é"


@pytest.mark.parametrize(
    "label",
    ["bank.com", "**bank.com**", "_bank.com_", "`bank.com`", "bank.com:443", "bank.com.",
     "ｂank.com", "BANK.COM", "https://bank.com/login", "www.bank.com"],
)  # fmt: skip
def test_a_link_whose_text_names_another_host_shows_its_target(label: str) -> None:
    shown = render_markdown(f"[{label}](https://evil.example/x)")
    assert shown.text.endswith(" (https://evil.example/x)"), shown.text
    [link] = [s for s in shown.spans if s.type == "text_link"]
    assert link.url == "https://evil.example/x"


def test_a_link_whose_text_names_its_own_host_or_no_host_is_left_alone() -> None:
    assert not misleading("docs", "https://x.org/d")
    assert not misleading("x.org", "https://www.x.org/d")
    assert not misleading("X.org.", "https://x.org:8443/")
    assert misleading("evil.example@bank.com", "https://evil.example/")
    assert render_markdown("[the docs](https://x.org/d)").text == "the docs"


@pytest.mark.parametrize("unit", ["chars", "utf16", "bytes"])
def test_one_splitter_keeps_each_units_limit_and_every_character(unit: Unit) -> None:
    text = ("word 🙂 é ש " * 300 + "\n\n") * 3
    spans = (Span("bold", 10, 2_000), Span("pre", 2_500, 6_000))
    parts = split_formatted(Formatted(text, spans), 500, unit)
    assert all(measure(p.text, unit) <= 500 for p in parts)
    assert " ".join(p.text for p in parts).split() == text.split()  # whitespace at a cut aside
    # A span cut in two goes on in the next part.
    assert sum(1 for p in parts for s in p.spans if s.type == "pre") > 1


@dataclass(frozen=True)
class Plain:
    """A renderer writing the text as it is."""

    limit: int = 1_000
    unit: Unit = "chars"
    wire_limit: int = 10_000

    def wire(self, part: Formatted) -> str:
        return part.text

    def visible(self, wire: str) -> str:
        return wire

    def fits(self, wire: str) -> bool:
        return len(wire) <= self.wire_limit


class Leaky(Plain):
    """A renderer with a bug: it writes back what the masker took out."""

    def wire(self, part: Formatted) -> str:
        return part.text.replace("***", SECRET)


def test_a_part_whose_wire_still_reads_as_a_secret_is_withheld() -> None:
    masker = Masker([SECRET])
    parts = message_parts(f"first\n\n{'x ' * 600}\n\nthe key: {SECRET}", True, masker, Leaky())
    assert parts[-1] == WITHHELD and SECRET not in "".join(parts)
    assert parts[0].startswith("first")  # the parts without it go out


class Wordy(Plain):
    """A wire longer than its text (markup, escapes): four characters each."""

    def wire(self, part: Formatted) -> str:
        return "".join(c * 4 for c in part.text)


def test_a_part_whose_wire_is_too_long_is_cut_again() -> None:
    parts = message_parts("abc " * 1_000, False, None, Wordy(limit=3_000, wire_limit=4_000))
    assert all(len(p) <= 4_000 for p in parts)
    assert " ".join(p[::4] for p in parts).split() == ["abc"] * 1_000


def test_markdown_a_terminal_prints_as_written_unless_it_reads_as_a_secret() -> None:
    masker = Masker([SECRET])
    assert as_written("**bold** and `code`", True, masker) == "**bold** and `code`"
    assert as_written("sk-pa&ss<word>-12**345**67890", True, masker) == "***"
    assert as_written("sk-pa\\&ss\\<word\\>-1234567890 ok", True, masker) == "*** ok"
    assert as_written("sk-pa&ss<word>-12**345**67890", False, masker) == (
        "sk-pa&ss<word>-12**345**67890"  # plain text: shown as written, read as written
    )


def test_markup_stays_balanced_even_for_spans_that_cross() -> None:
    text = Formatted("abcdef", (Span("bold", 0, 4), Span("italic", 2, 6)))
    out = written(
        text,
        text=lambda piece, inside: piece,
        opening=lambda s: f"<{s.type[0]}>",
        closing=lambda s: f"</{s.type[0]}>",
    )
    assert out == "<b>ab<i>cd</i></b><i>ef</i>"
