"""A real Matrix homeserver for the tests: Synapse, on SQLite, on a loopback port.

Synapse (``matrix-synapse`` from PyPI, all wheels) lives in a venv of its own, so its
dependencies never pin the project's: ``bash .ci/synapse`` installs it (``.ci/run`` does
that) at ``$XDG_CACHE_HOME/echo-bot/synapse`` (default ``~/.cache/echo-bot/synapse``)
and prints its Python; ``ECHO_BOT_SYNAPSE_PYTHON`` names another one. Where that Python
is missing or Synapse does not start, the Matrix tests fail under CI (``CI`` set), never
a silent skip there, and are skipped, saying why, everywhere else, as tests/postgres.py
does for PostgreSQL.

Fixture (tests/conftest.py registers this module as a plugin, so every test module has
it; importing it instead would start one homeserver per module):

``synapse``
    One homeserver for the whole session (its start, schema included, is paid once):
    server name ``localhost``, no federation listener, registration closed except
    through the shared-secret admin API, rate limits relaxed (``RELAXED_RATE_LIMITS``).

Its ``Synapse`` object gives ``url`` (``http://127.0.0.1:PORT``), ``server_name``,
``register(user, password, admin=False) -> Registered(user_id, access_token,
device_id)`` and ``log_tail()``. A user name is taken once per homeserver: tests on the
session's server use ``unique(name)``. ``start_synapse(directory, rate_limits=…)`` starts
one more (a context manager), e.g. with a strict ``rc_message`` for a rate-limit test::

    @pytest.fixture(scope="module")
    def strict_synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
        limits = {"rc_message": {"per_second": 0.2, "burst_count": 3}}
        with start_synapse(tmp_path_factory.mktemp("strict"), rate_limits=limits) as server:
            yield server

The user side of a test is a matrix-nio client (tests/test_matrix_harness.py shows an
encrypted direct chat between two of them).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.ports import free_port

PYTHON_ENV = "ECHO_BOT_SYNAPSE_PYTHON"
SERVER_NAME = "localhost"
START_TIMEOUT = 90.0  # seconds: the first start creates the whole schema (2 cores, CI)
STOP_TIMEOUT = 15.0
LOG_TAIL_LINES = 40

_RELAXED = {"per_second": 1000, "burst_count": 1000}
# Far above anything a test sends: no test waits on a limit it did not ask for.
RELAXED_RATE_LIMITS: dict[str, object] = {
    "rc_message": _RELAXED,
    "rc_registration": _RELAXED,
    "rc_login": {"address": _RELAXED, "account": _RELAXED, "failed_attempts": _RELAXED},
    "rc_joins": {"local": _RELAXED, "remote": _RELAXED},
    "rc_joins_per_room": _RELAXED,
    "rc_invites": {"per_room": _RELAXED, "per_user": _RELAXED, "per_issuer": _RELAXED},
    "rc_room_creation": _RELAXED,
    "rc_key_requests": _RELAXED,
    "rc_3pid_validation": _RELAXED,
    "rc_admin_redaction": _RELAXED,
    "rc_presence": {"per_user": _RELAXED},
    "rc_media_create": _RELAXED,
    "rc_delayed_event_mgmt": _RELAXED,
}


def default_python() -> Path:
    """Where ``.ci/synapse`` puts Synapse's venv: its Python."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "echo-bot" / "synapse" / "bin" / "python"


def synapse_python() -> Path:
    named = os.environ.get(PYTHON_ENV)
    return Path(named) if named else default_python()


def _unavailable(reason: str) -> NoReturn:
    message = f"no Synapse for the Matrix tests: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message + " (install it with `bash .ci/synapse`, as .ci/run does)")


@dataclass(frozen=True)
class Registered:
    user_id: str
    access_token: str
    device_id: str


@dataclass
class Synapse:
    """A running homeserver (see the module's doc)."""

    url: str
    server_name: str
    directory: Path
    shared_secret: str
    log_path: Path

    def register(self, user: str, password: str, *, admin: bool = False) -> Registered:
        """A new account through the shared-secret admin API (nonce, then an HMAC-SHA1
        of nonce, user, password and admin flag, NUL-separated), logged in: its ID,
        access token and device. Blocking, brief (Synapse is another process)."""
        nonce = _request("GET", f"{self.url}/_synapse/admin/v1/register")["nonce"]
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join(
            [nonce.encode(), user.encode(), password.encode(),
             b"admin" if admin else b"notadmin"]
        ))  # fmt: skip
        body = {
            "nonce": nonce,
            "username": user,
            "password": password,
            "admin": admin,
            "mac": mac.hexdigest(),
        }
        answer = _request("POST", f"{self.url}/_synapse/admin/v1/register", body)
        return Registered(answer["user_id"], answer["access_token"], answer["device_id"])

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


def unique(name: str) -> str:
    """``name`` with a random suffix: a user name no other test on the server took."""
    return f"{name}-{secrets.token_hex(4)}"


def _request(method: str, url: str, body: Mapping[str, object] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise AssertionError(f"{method} {url}: HTTP {exc.code} {detail}") from None


def _signing_key() -> str:
    """A fresh ed25519 signing key in Synapse's file format: ``ed25519 VERSION SEED``
    with the 32-byte seed in unpadded base64."""
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return f"ed25519 a_{secrets.token_hex(2)} {seed}\n"


def homeserver_config(
    directory: Path, port: int, shared_secret: str, rate_limits: Mapping[str, object]
) -> dict[str, object]:
    """Synapse's homeserver.yaml (as JSON, which is YAML) for a test server in
    ``directory``: SQLite, plain HTTP on 127.0.0.1, client API only (no federation
    listener, no outbound federation, no key servers), nothing reported."""
    return {
        "server_name": SERVER_NAME,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(directory / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(directory / "homeserver.db")}},
        "media_store_path": str(directory / "media_store"),
        "signing_key_path": str(directory / "signing.key"),
        "registration_shared_secret": shared_secret,
        "enable_registration": False,
        "report_stats": False,
        "macaroon_secret_key": secrets.token_hex(32),
        "form_secret": secrets.token_hex(32),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "enable_metrics": False,
        "bcrypt_rounds": 4,  # the fewest bcrypt allows: 12 make a registration take 0.4 s
        **rate_limits,
    }


@contextlib.contextmanager
def start_synapse(
    directory: Path,
    *,
    rate_limits: Mapping[str, object] | None = None,
    python: Path | None = None,
    timeout: float = START_TIMEOUT,
) -> Iterator[Synapse]:
    """A new homeserver with its files in ``directory`` (config, SQLite database, media,
    ``homeserver.log``), up once ``GET /_matrix/client/versions`` answers; stopped
    afterwards (SIGTERM, then SIGKILL). ``rate_limits`` replace the relaxed ones by key
    (``{"rc_message": {"per_second": 0.2, "burst_count": 3}}``). Where Synapse is not
    installed or does not start: fail under CI, else skip."""
    python = python or synapse_python()
    if not os.access(python, os.X_OK):
        _unavailable(f"{python} is missing (set {PYTHON_ENV} to Synapse's Python)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    shared_secret = secrets.token_hex(16)
    (directory / "signing.key").write_text(_signing_key())
    config = directory / "homeserver.yaml"
    limits = {**RELAXED_RATE_LIMITS, **(rate_limits or {})}
    config.write_text(json.dumps(homeserver_config(directory, port, shared_secret, limits)))
    server = Synapse(
        url=f"http://127.0.0.1:{port}",
        server_name=SERVER_NAME,
        directory=directory,
        shared_secret=shared_secret,
        log_path=directory / "homeserver.log",
    )
    with server.log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(python), "-m", "synapse.app.homeserver", "--config-path", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
            start_new_session=True,  # a Ctrl-C of pytest is not Synapse's to handle
        )
    try:
        _wait_until_up(server, proc, timeout)
        yield server
    finally:
        _stop(proc)


def _wait_until_up(server: Synapse, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    versions = f"{server.url}/_matrix/client/versions"
    while True:
        code = proc.poll()
        if code is not None:
            _unavailable(f"Synapse exited with {code} while starting:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(versions, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            _stop(proc)
            _unavailable(f"Synapse did not answer {versions} within {timeout} s:\n"
                         f"{server.log_tail()}")  # fmt: skip
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# A message per 5 s after a burst of 30: more than any contract case sends per account
# (each driver registers its own), so only a test that uses the burst up is refused.
PACED_RC_MESSAGE = {"per_second": 0.2, "burst_count": 30}


@pytest.fixture(scope="session")
def paced_synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    """A homeserver whose rc_message is PACED_RC_MESSAGE (the contract's rate-limit
    case: the bot's burst used up, its next message is refused for up to 5 s)."""
    limits = {"rc_message": PACED_RC_MESSAGE}
    with start_synapse(tmp_path_factory.mktemp("paced"), rate_limits=limits) as server:
        yield server


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    """The session's homeserver (see the module's doc)."""
    with start_synapse(tmp_path_factory.mktemp("synapse")) as server:
        yield server
