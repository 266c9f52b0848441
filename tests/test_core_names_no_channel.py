"""The core names no built-in channel: each is a plugin (``channels/specs.py``), and
what the core knows of one it asks the registry. A string in ``echo_bot/`` that names
one — an address, a section, a help text — is a table a new channel would have to be
added to. Docstrings and comments may name them (they explain, they decide nothing).

The ``[webhook]`` section is still a section of the core's ``Config`` (its
``admin_token_env`` and ``max_body`` serve the core's HTTP server), and its shell
commands read the core's store: ``echo_bot/cli/webhook.py`` (``echo-bot webhook
deliveries|send``) and ``webhook_client.py`` (the Standard Webhooks headers it signs)
are the two modules allowed to name it."""

from __future__ import annotations

import ast
import re

from echo_bot.plugins import registry
from tests.conftest import ROOT

ALLOWED = {"echo_bot/cli/webhook.py", "echo_bot/cli/webhook_client.py"}
BUILT_IN = sorted(s.name for s in registry().specs.values() if s.target.startswith("channels."))


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def naming(source: str, names: list[str]) -> list[tuple[int, str]]:
    """The string literals of ``source`` (f-strings' parts too, not docstrings) that
    name one of ``names`` as a word, in any case: (line, literal)."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b", re.IGNORECASE)
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and pattern.search(node.value)
    ]


def test_the_built_in_channels_are_known() -> None:
    assert {"cli", "matrix", "slack", "telegram", "webhook"} <= set(BUILT_IN)


def test_no_string_in_the_core_names_a_built_in_channel() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
        for path in sorted((ROOT / "echo_bot").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in ALLOWED
        for line, text in naming(path.read_text(encoding="utf-8"), BUILT_IN)
    ]
    assert found == []


def test_the_check_sees_addresses_sections_f_strings_and_help_but_not_docstrings() -> None:
    source = '''
"""The module's docstring may say Telegram."""
def f(x):
    """So may a function's: webhook."""
    # and a comment: matrix
    a = "telegram:12345"
    b = f"[Slack] {x} is on"
    c = "help: the CLI"
    d = "matrixes and clients are not channels"
    return a, b, c, d
'''
    assert sorted(line for line, _ in naming(source, BUILT_IN)) == [6, 7, 8]
