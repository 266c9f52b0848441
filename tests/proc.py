"""A real ``echo-bot`` process for tests: started, read line by line, killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env
from tests.ports import free_port


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


class Daemon:
    """One `echo-bot run` in an asyncio test (its peer a fake in the same loop), its
    log read as it runs."""

    def __init__(self, config: Path, state: Path, env: dict[str, str], name: str = "") -> None:
        self.config, self.state, self.env, self.name = config, state, env, name
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo_bot", "run",
            "--config", str(self.config), "--state-dir", str(self.state),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=self.env, cwd=ROOT,
        )  # fmt: skip
        ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(ready))
        async with asyncio.timeout(60):
            await ready

    async def _read(self, ready: asyncio.Future[None]) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := (await self.proc.stderr.readline()).decode():
            self.lines.append(line.rstrip())
            if line.startswith("stop with") and not ready.done():
                ready.set_result(None)
        if not ready.done():
            who = f"{self.name} " if self.name else ""
            ready.set_exception(AssertionError(f"{who}exited:\n" + "\n".join(self.lines)))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    async def kill(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        if self._reader is not None:
            await self._reader

    async def stop(self) -> int:
        """SIGTERM, SIGKILL if it is still running 30 s later: its exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await self.proc.wait()
        await self.kill()
        assert self.proc.returncode is not None
        return self.proc.returncode


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


@contextlib.contextmanager
def daemon_process(
    tmp_path: Path,
    config_text: str,
    env: dict[str, str],
    *,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[tuple[Path, Path, int]]:
    """`echo-bot run` as a real process on a fixed free port (``port = 0`` in the config
    is replaced), its stderr in ``tmp_path/daemon.log``; yields (config, state, port) once
    /healthz answers 200. It must exit 0 on SIGTERM."""
    port = free_port()
    config, state, log = tmp_path / "config.toml", tmp_path / "st", tmp_path / "daemon.log"
    config.write_text(config_text.replace("port = 0", f"port = {port}"))
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "echo_bot", "run", "--config", str(config),
             "--state-dir", str(state)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=echo_bot_env(**env),
            cwd=ROOT,
            preexec_fn=preexec_fn,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "stop with" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert response.status == 200
        yield config, state, port
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                assert proc.wait(20) == 0, log.read_text(errors="replace")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise


def run_with_output_closed(
    *args: str, input: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``echo-bot ARGS`` whose stdout is a pipe nobody reads any more (the reader left
    before a line was written); its stderr is captured. A hang fails after 60 s."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            echo_bot_cmd(*args),
            input=input,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env or echo_bot_env(),
            cwd=ROOT,
            timeout=60,
        )
    finally:
        os.close(write_end)
