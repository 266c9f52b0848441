"""A real ``echo-bot`` process on a real terminal (a pty) for tests.

The child's stdin, stdout and stderr are the pty's slave side, as in a terminal
window; the test types on the master side and reads what the terminal would show
(its own echo of typed lines included)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env
from tests.proc import next_match

CTRL_D = b"\x04"


class PtyEchoBot:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        self._master = master
        try:
            self.proc = subprocess.Popen(
                echo_bot_cmd(*args),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env or echo_bot_env(),
                cwd=ROOT,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:  # EIO: every slave side is closed (the child has exited)
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                self.lines.append(line)
                self._queue.put(line)
        if pending:
            line = pending.decode("utf-8", "replace").rstrip("\r")
            self.lines.append(line)
            self._queue.put(line)

    def expect(self, pattern: str, timeout: float = 20) -> str:
        """The next line shown that matches ``pattern`` (lines before it are skipped)."""
        return next_match(
            self._queue,
            pattern,
            timeout,
            lambda: (
                f"no terminal line matching {pattern!r} within {timeout} s; "
                "the terminal showed:\n" + "\n".join(self.lines)
            ),
        )

    def type(self, line: str) -> None:
        """Type a line and press Enter."""
        os.write(self._master, line.encode() + b"\r")

    def ctrl_d(self) -> None:
        os.write(self._master, CTRL_D)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        with contextlib.suppress(OSError):
            os.close(self._master)
