"""The daemon's secrets stay inside its process.

A process of the same user — a tool's child, say — must not read the daemon's
environment or memory through ``/proc/<pid>/environ`` or ``/proc/<pid>/mem``; secrets
may come from systemd credentials instead of the environment.

Running as root proves nothing here: root reads any process (CAP_SYS_PTRACE, and
CAP_DAC_OVERRIDE on the root-owned /proc files of a non-dumpable process). So when the
tests run as root, the daemon *and* the reader run as ``nobody`` — the same ordinary
user, like a daemon and the tool process it started — with an interpreter ``nobody``
can execute (``/root`` may hide the venv's). As any other user, both simply run as
that user.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import aiohttp
import pytest

from echo_bot.secrets import MASK
from tests.conftest import ROOT, echo_bot_env
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.ports import free_port

SECRET = "sk-proc-8c1f4e0d2b7a4399-secret"

READER = r"""
import json, sys
pid = sys.argv[1]
seen = {}
for name in ("environ", "mem"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            seen[name] = fh.read(1 << 20).decode("latin-1") if name == "environ" else "opened"
    except PermissionError:
        seen[name] = "PermissionError"
print(json.dumps(seen))
"""


class RunAs(TypedDict, total=False):
    """Extra ``subprocess`` arguments that switch the user a child runs as."""

    user: int
    group: int
    extra_groups: list[int]


@dataclass
class Account:
    """Who the daemon and the reader run as, and with which interpreter."""

    python: str
    popen: RunAs
    env: dict[str, str]
    scratch: Path  # a dir this account may write

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, *args], capture_output=True, text=True, timeout=timeout,
            env=self.env, cwd=ROOT, **self.popen,
        )  # fmt: skip

    def start(self, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.python, *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env={**self.env, **env}, cwd=ROOT,
            **self.popen,
        )  # fmt: skip


def _unprivileged() -> Iterator[Account]:
    scratch = Path(tempfile.mkdtemp(prefix="echo-bot-proc-"))
    try:
        if os.geteuid() != 0:
            yield Account(sys.executable, {}, echo_bot_env(), scratch)
            return
        try:
            nobody = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("running as root, and there is no user nobody to run as")
        os.chown(scratch, nobody.pw_uid, nobody.pw_gid)
        paths = sysconfig.get_paths()
        env = echo_bot_env(
            PYTHONPATH=os.pathsep.join([str(ROOT), paths["purelib"], paths["platlib"]]),
            HOME=str(scratch),
        )
        popen: RunAs = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for candidate in (sys.executable, shutil.which(version), f"/usr/bin/{version}"):
            if not candidate:
                continue
            account = Account(candidate, popen, env, scratch)
            try:
                probe = account.run("-c", "import echo_bot.cli.main, aiohttp, pydantic")
            except OSError:  # nobody may not even reach this interpreter
                continue
            if probe.returncode == 0:
                yield account
                return
        pytest.skip(f"no {version} that user nobody can run with this venv's packages")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def account() -> Iterator[Account]:
    yield from _unprivileged()


def wait_for_banner(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, f"the process exited ({proc.poll()}) before it was ready"
        if line.startswith("stop with"):
            return
    raise AssertionError("no banner within 30 s")


def read_proc(account: Account, pid: int) -> dict[str, str]:
    result = account.run("-c", READER, str(pid))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("command", ["run", "chat"])
def test_attack_same_user_process_reads_daemon_environ_and_memory_is_refused(
    account: Account, command: str
) -> None:
    secret_env = {"TELEGRAM_WEBHOOK_SECRET": SECRET}
    # The control: an ordinary process of the same user, holding the same secret. The
    # reader gets its environment, so the refusal below is the daemon's own doing.
    control = account.start(
        "-c", "import sys, time; print('stop with', file=sys.stderr, flush=True); time.sleep(60)",
        env=secret_env,
    )  # fmt: skip
    state = account.scratch / f"state-{command}"
    daemon = account.start("-m", "echo_bot", command, "--state-dir", str(state), env=secret_env)
    try:
        wait_for_banner(control)
        assert SECRET in read_proc(account, control.pid)["environ"]
        wait_for_banner(daemon)
        seen = read_proc(account, daemon.pid)
        assert seen == {"environ": "PermissionError", "mem": "PermissionError"}
        assert daemon.poll() is None
    finally:
        for proc in (control, daemon):
            proc.kill()
            proc.wait(10)


# -- secrets from systemd credentials; /healthz shows no secret --------------------------
TOKEN = "123456:CRED-proc-token-5f0e"
ADMIN = "admin-proc-token-77c2e1"
OWNER = 42


def telegram_config(path: Path, api: FakeTelegramAPI, port: int) -> Path:
    path.write_text(
        f"""
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{OWNER}]
[http]
enabled = true
port = {port}
[webhook]
admin_token_env = "ECHO_BOT_ADMIN_TOKEN"
"""
    )
    return path


class Daemon:
    """`echo-bot run` as a real process; its stderr (the log) is kept."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.log: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, config: Path, state: Path, env: dict[str, str]) -> Daemon:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo_bot", "run", "--config", str(config),
            "--state-dir", str(state),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=echo_bot_env(**env), cwd=ROOT,
        )  # fmt: skip
        daemon = cls(proc)
        assert proc.stderr is not None
        async with asyncio.timeout(60):  # ready in ~1 s alone; a full parallel suite starves it
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, f"the daemon exited before it was ready: {daemon.log}"
                daemon.log.append(line)
                if line.startswith("stop with"):
                    break
        daemon._reader = asyncio.create_task(daemon._read())
        return daemon

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := (await self.proc.stderr.readline()).decode():
            self.log.append(line)

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 20)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 10)
        return code


async def get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response,
    ):
        return response.status, await response.text()


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_secrets_come_from_systemd_credentials_and_win_over_the_environment(
    tmp_path: Path,
) -> None:
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o700)
    for name, value in {"TELEGRAM_BOT_TOKEN": TOKEN, "ECHO_BOT_ADMIN_TOKEN": ADMIN}.items():
        (creds / name).write_text(value + "\n")  # as `systemd-creds`/files usually end
        (creds / name).chmod(0o400)
    port = free_port()
    async with FakeTelegramAPI(token=TOKEN) as api:
        config = telegram_config(tmp_path / "config.toml", api, port)
        # A stale token in the environment: the credential wins.
        env = {"CREDENTIALS_DIRECTORY": str(creds), "TELEGRAM_BOT_TOKEN": "654321:stale-env"}
        daemon = await Daemon.start(config, tmp_path / "st", env)
        try:
            await api.wait_for_call("getUpdates", lambda c: c.token == TOKEN, timeout=20)
            assert all(call.token == TOKEN for call in api.calls)
            api.redirect_next("getUpdates", count=10**6)  # errors naming the token's URL
            api.push_message("hello", user_id=OWNER)  # ends the long poll waiting now
            await api.wait_for_call("sendMessage", timeout=20)  # a reply: the token works
            details = ""
            async with asyncio.timeout(30):
                while '"degraded"' not in details:
                    _, details = await get(port, "/healthz", ADMIN)  # from a credential
                    await asyncio.sleep(0.1)
            telegram = json.loads(details)["components"]["telegram"]
            assert telegram["bot"] == "@echo_test_bot" and "TooManyRedirects" in telegram["error"]
            assert f"/bot{MASK}/getUpdates" in telegram["error"]  # a credential is masked
            assert TOKEN not in details
        finally:
            assert await daemon.stop() == 0
    assert not any(TOKEN in line or ADMIN in line for line in daemon.log)


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_attack_bot_token_in_a_redirect_loop_error_never_leaves_through_healthz(
    tmp_path: Path,
) -> None:
    port = free_port()
    async with FakeTelegramAPI(token=TOKEN) as api:
        # The Bot API (or a proxy in front of it) answers getUpdates with a redirect loop:
        # aiohttp gives up with TooManyRedirects, whose text holds the URL — and the token.
        api.redirect_next("getUpdates", count=10**6)
        config = telegram_config(tmp_path / "config.toml", api, port)
        env = {"TELEGRAM_BOT_TOKEN": TOKEN, "ECHO_BOT_ADMIN_TOKEN": ADMIN}
        daemon = await Daemon.start(config, tmp_path / "st", env)
        try:
            await api.wait_for_call("getUpdates", lambda c: c.status == 302, timeout=20)
            status, body = 200, ""
            async with asyncio.timeout(30):
                while status != 503:
                    status, body = await get(port, "/healthz")  # anyone may ask
                    await asyncio.sleep(0.1)
            assert TOKEN not in body
            assert json.loads(body) == {
                "status": "degraded",
                "components": {
                    "store": {"status": "ok"},
                    "scheduler": {"status": "ok"},
                    "telegram": {"status": "degraded"},
                    "http": {"status": "ok"},
                },
            }, "without the admin token /healthz shows states only, no error texts"
            assert (await get(port, "/healthz", "wrong-token"))[1] == body
            status, details = await get(port, "/healthz", ADMIN)
            assert status == 503 and TOKEN not in details
            error = json.loads(details)["components"]["telegram"]["error"]
            assert error.startswith("getUpdates failed") and f"/bot{MASK}/" in error
            metrics_status, metrics = await get(port, "/metrics")
            assert metrics_status == 200 and TOKEN not in metrics
        finally:
            assert await daemon.stop() == 0
    log = "".join(daemon.log)
    assert "getUpdates failed" in log and TOKEN not in log
