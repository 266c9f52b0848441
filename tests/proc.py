"""A real ``echo-bot`` process for tests: started, read line by line, killed."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env


class EchoBotProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None, stdin: int | None = None):
        self.proc = subprocess.Popen(
            echo_bot_cmd(*args),
            stdin=subprocess.PIPE if stdin is None else stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or echo_bot_env(),
            cwd=ROOT,
        )
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._out: queue.Queue[str] = queue.Queue()
        self._err: queue.Queue[str] = queue.Queue()
        for stream, sink, log in (
            (self.proc.stdout, self._out, self.stdout_lines),
            (self.proc.stderr, self._err, self.stderr_lines),
        ):
            threading.Thread(target=self._pump, args=(stream, sink, log), daemon=True).start()

    @staticmethod
    def _pump(stream: IO[str] | None, sink: queue.Queue[str], log: list[str]) -> None:
        assert stream is not None
        for line in stream:
            log.append(line.rstrip("\n"))
            sink.put(line.rstrip("\n"))

    def _expect(self, sink: queue.Queue[str], pattern: str, timeout: float, where: str) -> str:
        return next_match(
            sink,
            pattern,
            timeout,
            lambda: (
                f"no {where} line matching {pattern!r} within {timeout} s.\n"
                f"stdout: {self.stdout_lines}\nstderr: {self.stderr_lines}"
            ),
        )

    def expect_stdout(self, pattern: str, timeout: float = 15) -> str:
        return self._expect(self._out, pattern, timeout, "stdout")

    def expect_stderr(self, pattern: str, timeout: float = 15) -> str:
        return self._expect(self._err, pattern, timeout, "stderr")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def wait(self, timeout: float = 15) -> int:
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def next_match(
    sink: queue.Queue[str], pattern: str, timeout: float, failure: Callable[[], str]
) -> str:
    """The next line from ``sink`` that matches ``pattern`` (lines before it are
    skipped); AssertionError with ``failure()`` when none comes within ``timeout``."""
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(failure())
        try:
            line = sink.get(timeout=remaining)
        except queue.Empty:
            continue
        if regex.search(line):
            return line
