"""A fake ``$NOTIFY_SOCKET``: a thread receives and timestamps each datagram the daemon
sends (READY=1, STATUS=…, WATCHDOG=1, STOPPING=1). Used by tests and bench/footprint.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from pathlib import Path

from tests.waiting import eventually_blocking


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.received: list[tuple[float, str]] = []
        self._running = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while self._running:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            self.received.extend((now, line) for line in data.decode().splitlines())

    def wait_for(
        self, line: str, timeout: float = 15, proc: subprocess.Popen[bytes] | None = None
    ) -> float:
        """When ``line`` arrived (monotonic time); AssertionError if it does not."""

        def arrived() -> list[float] | None:  # boxed: any time is an answer
            for at, text in list(self.received):
                if text == line:
                    return [at]
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"the daemon exited with {proc.returncode} before {line}")
            return None

        [at] = eventually_blocking(
            arrived, timeout, lambda: f"{line} received; got {self.lines()}", every=0.002
        )
        return at

    def lines(self) -> list[str]:
        return [text for _t, text in list(self.received)]

    def close(self) -> None:
        self._running = False
        self._thread.join(2)
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
