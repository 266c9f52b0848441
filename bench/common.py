"""Helpers the benchmark scripts share: a free loopback port, stopping a subprocess."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int | None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode
