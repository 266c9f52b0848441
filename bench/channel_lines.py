"""Lines of each chat channel's package, by kind, at a git revision and in the working
tree: what issue 47 ("channels reduced to what is particular to their network") and
issue 48 (a new channel in at most ~900 lines of its own) measure. Prints, per
channel, the total (``wc -l`` of its ``*.py``), then code, docstrings, comment-only and
blank lines, and with ``--modules`` the same per module.

    python bench/channel_lines.py --before 288bedb [--modules]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHANNELS = ("discord", "email", "matrix", "slack", "telegram")


@dataclass
class Lines:
    total: int = 0
    code: int = 0
    docstrings: int = 0
    comments: int = 0
    blank: int = 0

    def add(self, other: Lines) -> None:
        for key in vars(self):
            setattr(self, key, getattr(self, key) + getattr(other, key))


def counted(source: str) -> Lines:
    lines = source.splitlines()
    docs: set[int] = set()  # line numbers (from 1) inside a docstring
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):  # fmt: skip
            docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    rest = [line.strip() for number, line in enumerate(lines, 1) if number not in docs]
    blank = sum(1 for line in rest if not line)
    comments = sum(1 for line in rest if line.startswith("#"))
    return Lines(len(lines), len(rest) - blank - comments, len(docs), comments, blank)


def sources(channel: str, rev: str | None) -> dict[str, str]:
    """``{module: source}`` of ``channels/<channel>`` at ``rev`` (None: the working tree)."""
    if rev is None:
        folder = ROOT / "channels" / channel
        return {p.name: p.read_text() for p in sorted(folder.glob("*.py"))}
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:channels/{channel}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    names = listed.stdout.split() if listed.returncode == 0 else []  # not there yet
    return {
        name: subprocess.run(
            ["git", "show", f"{rev}:channels/{channel}/{name}"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
        for name in names
        if name.endswith(".py")
    }  # fmt: skip


def row(name: str, lines: Lines) -> str:
    return (f"{name:<24} {lines.total:>6} {lines.code:>6} {lines.docstrings:>6}"
            f" {lines.comments:>6} {lines.blank:>6}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="288bedb", help="the revision to compare with")
    parser.add_argument("--modules", action="store_true", help="each module's lines too")
    args = parser.parse_args()
    print(f"{'':<24} {'total':>6} {'code':>6} {'docs':>6} {'#':>6} {'blank':>6}")
    for channel in CHANNELS:
        totals = {}
        for label, rev in ((args.before, args.before), ("now", None)):
            total = Lines()
            for name, source in sources(channel, rev).items():
                lines = counted(source)
                total.add(lines)
                if args.modules and rev is None:
                    print(row(f"  {channel}/{name}", lines))
            totals[label] = total
            print(row(f"{channel} {label}", total))
        before, after = totals[args.before], totals["now"]
        if not before.total:
            print(f"{channel}: new, {after.code} lines of code")
            continue
        print(
            f"{channel}: total {100 * (after.total / before.total - 1):+.1f} %,"
            f" code {100 * (after.code / before.code - 1):+.1f} %"
        )


if __name__ == "__main__":
    main()
