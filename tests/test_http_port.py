"""What opens the HTTP port, and a port in use: two real daemons, as the user ran them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, echo_bot_env, run_echo_bot
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.ports import free_port
from tests.proc import EchoBotProcess

TOKEN = "123456:PORT-test-token"


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process ``pid`` listens on: its socket descriptors' inodes, looked up
    in the kernel's TCP tables (state 0A is LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_a_second_daemon_on_a_port_in_use_says_so_in_one_line_and_exits_2(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f"[http]\nport = {port}\n[webhook]\nenabled = true\n")
    first = EchoBotProcess(
        "run", "--config", str(config), "--state-dir", str(tmp_path / "one"),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        first.expect_stderr(r"^stop with")
        second = run_echo_bot(
            "run", "--config", str(config), "--state-dir", str(tmp_path / "two"), timeout=60
        )
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"127.0.0.1:{port}" in lines[0] and "[http] port" in lines[0]
        assert "in use" in lines[0]
        assert first.terminate() == 0, "the first daemon is untouched"
    finally:
        first.cleanup()


def test_the_unit_stops_restarting_on_exit_code_2() -> None:
    unit = (ROOT / "systemd" / "echo-bot.service").read_text()
    assert "\nRestartPreventExitStatus=2\n" in unit


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_telegram_polling_alone_opens_no_port(tmp_path: Path) -> None:
    async with FakeTelegramAPI(token=TOKEN) as api:
        config = tmp_path / "config.toml"
        # Only what polling needs; the default [http] port (8080) would have been bound.
        config.write_text(f'[telegram]\nenabled = true\napi_base = "{api.base_url}"\n')
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo_bot", "run", "--config", str(config),
            "--state-dir", str(tmp_path / "st"),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=echo_bot_env(TELEGRAM_BOT_TOKEN=TOKEN),
            cwd=ROOT,
        )  # fmt: skip
        assert proc.stderr is not None
        log: list[str] = []
        try:
            async with asyncio.timeout(60):  # ready in ~1 s alone; a full parallel suite starves it
                while not any(line.startswith("stop with") for line in log):
                    line = (await proc.stderr.readline()).decode()
                    assert line, f"the daemon exited: {log}"
                    log.append(line)
                await api.wait_for_call("getUpdates")
            assert listening_ports(proc.pid) == set(), log
            assert any("no HTTP server and no port" in line for line in log), log
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.communicate()
        assert proc.returncode == 0
