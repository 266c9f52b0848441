"""What a reply costs on its way out, per channel: Markdown rendered, masked, split and
written in the channel's wire format, in microseconds per message (median of rounds)
for a short, a medium and a long reply, with 20 secrets known to the masker.

``--against DIR`` runs the same measurement on another checkout (an earlier commit,
``git worktree add DIR <commit>``) in the same run and prints the ratio, so the
figures compare on one machine at one time. It reaches each channel's text path by the
names that checkout has: before the core's pipeline (echo_bot/richtext) each channel
rendered on its own.

    python bench/outgoing_text.py
    python bench/outgoing_text.py --against /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECRETS = [f"sk-{n:02d}-secret-value-{n * 7919:08d}" for n in range(20)]
SHORT = "Sure — **done**. The file is at `notes/today.md`; see [the docs](https://x.org/d)."
MEDIUM = "\n\n".join(
    f"## Step {n}\n\n- item **{n}** with `code` and a [link](https://x.org/{n})\n- another _one_"
    for n in range(12)
)
LONG = MEDIUM * 6 + "\n\n```python\n" + "print('x')  # a line of code\n" * 300 + "```\n"
TEXTS = {"short": SHORT, "medium": MEDIUM, "long": LONG}


def paths() -> dict[str, Callable[[str], Any]]:
    """Each channel's text path in this checkout: text → what it sends."""
    from echo_bot.secrets import Masker

    masker = Masker(SECRETS)
    found: dict[str, Callable[[str], Any]] = {}
    try:
        from echo_bot.richtext.parts import message_parts
    except ImportError:  # before the pipeline: each channel's own
        from channels.matrix import formatting as matrix_module
        from channels.slack import formatting as slack_module
        from channels.telegram.text import message_parts as telegram

        matrix: Any = matrix_module  # names this checkout no longer has
        slack: Any = slack_module

        found["telegram"] = lambda text: telegram(text, True, masker)
        found["slack"] = lambda text: slack.split_text(masker.mask(slack.to_mrkdwn(text)))
        found["matrix"] = lambda text: matrix.contents(text, True, masker)
        return found
    from channels.matrix.formatting import TEXT as MATRIX
    from channels.slack.formatting import TEXT as SLACK
    from channels.telegram.text import TEXT as TELEGRAM

    for name, renderer in (("telegram", TELEGRAM), ("slack", SLACK), ("matrix", MATRIX)):
        found[name] = lambda text, r=renderer: message_parts(text, True, masker, r)  # type: ignore[misc]
    return found


def measure(rounds: int) -> dict[str, float]:
    """µs per message, median of ``rounds``, for each channel × text."""
    figures: dict[str, float] = {}
    for channel, path in paths().items():
        for size, text in TEXTS.items():
            repeat = max(1, 20_000 // len(text))
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                for _ in range(repeat):
                    path(text)
                times.append((time.perf_counter() - start) / repeat * 1e6)
            figures[f"{channel} {size}"] = statistics.median(times)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 rounds, one pass (a second)")
    parser.add_argument("--against", help="another checkout to measure in the same run")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3
    if args.json:
        print(json.dumps(measure(args.rounds)))
        return
    here = Path(__file__).resolve().parents[1]

    def run(root: Path) -> dict[str, float]:
        env = {**os.environ, "PYTHONPATH": str(root)}
        out = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--json", "--rounds", str(args.rounds)],
            cwd=root, env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        return dict(json.loads(out.stdout))

    # Alternated, twice each, the best of two kept: the machine's noise moves both alike.
    runs: list[tuple[str, Path]] = [("this", here)]
    if args.against:
        runs.append(("against", Path(args.against).resolve()))
    best: dict[str, dict[str, float]] = {}
    for _ in range(1 if args.quick else 2):
        for name, root in runs:
            figures = run(root)
            kept = best.setdefault(name, figures)
            best[name] = {k: min(v, kept.get(k, v)) for k, v in figures.items()}
    against = "against" in best
    print("| case | this µs/msg |" + (" against µs/msg | ratio |" if against else ""))
    print("| --- | --- |" + (" --- | --- |" if against else ""))
    for case, value in best["this"].items():
        line = f"| {case} | {value:,.1f} |"
        if against:
            other = best["against"].get(case)
            line += f" {other:,.1f} | {value / other:.2f} |" if other else " — | — |"
        print(line)


if __name__ == "__main__":
    main()
