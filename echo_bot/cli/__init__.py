"""The echo-bot command: its parser and entry point (main), the management commands
that run beside a daemon (admin), doctor, and signing test webhook deliveries."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """A count given on the command line (``--tail``, ``--limit``): a whole number of 1
    or more (``-1`` read as "all" and listed every row of a large store)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value
