"""Ports for servers a test starts in another process (an ``echo-bot run``, Synapse)
that must be told their port before they bind it.

A server in the test's own process binds port 0 and reports the port it got; only a
process started with a port in its config or command line needs one picked here.

Why not bind port 0, close, and pass that number on: a port the OS handed out and let go
is free again for any ``connect()`` on the machine, which picks its local port from the
same ephemeral range. With several xdist workers opening hundreds of connections a
second, one of them now and then takes the port in the second between the pick and the
server's bind, and that server fails to start (EADDRINUSE). So a port comes from below
the ephemeral range, which neither ``connect()`` nor ``bind(0)`` ever use, from a slice
of its own for each xdist worker (``PYTEST_XDIST_WORKER``), and is checked free by a
bind before it is handed out; the same process never hands one out twice.
"""

from __future__ import annotations

import functools
import os
import random
import socket

# Below Linux's default ephemeral range (32768–60999) and above the well-known ports.
LOW, HIGH = 20_000, 32_000
SLICES = 16  # room for up to 16 workers, 750 ports each
_given: set[int] = set()
_pick = random.SystemRandom()  # unaffected by a seeded ``random`` (pytest-randomly)


@functools.cache
def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            low, high = (int(part) for part in file.read().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % SLICES if worker.isdigit() else 0
    size = (HIGH - LOW) // SLICES
    return range(LOW + index * size, LOW + (index + 1) * size)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, outside the ephemeral range (see
    the module's doc): for a server started in another process."""
    low, high = _ephemeral_range()
    candidates = [p for p in _slice() if p not in _given and not low <= p <= high]
    _pick.shuffle(candidates)
    for port in candidates:
        if _bindable(port):
            _given.add(port)
            return port
    # Every port of the slice was taken (a machine with another range or a busy one):
    # fall back to one from the OS.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
