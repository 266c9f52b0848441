"""Knocking the HTTP server out, with real sockets against a real running daemon:
half-open connections past the cap and past the descriptor limit, and stalled large
bodies past a route's bound. /healthz must keep answering, stalled peers must be
dropped, and the log must not grow a traceback per connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import resource
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from echo_bot import http as http_module
from echo_bot.http import TOO_LARGE, Throttle
from tests.channels.test_webhook import ENV, bearer_headers, dumps, gh_headers
from tests.conftest import ROOT, Bot, echo_bot_env, running_bot
from tests.proc import daemon_process

ROUTES = """
[webhook]
enabled = true

[[webhook.routes]]
name = "gh"
auth = "github"
secret_env = "GH_SECRET"
tool = "current_time"

[[webhook.routes]]
name = "other"
auth = "bearer"
secret_env = "BEARER_SECRET"
tool = "current_time"
"""
CAPPED = (
    """
[http]
port = 0
max_connections = 50
header_timeout = "2s"
"""
    + ROUTES
)
UNCAPPED = "[http]\nport = 0\n" + ROUTES  # the default max_connections (256)
BODIES = (
    """
[http]
port = 0
max_concurrent_bodies = 2
body_timeout = "8s"
"""
    + ROUTES
)
# A partial request line: the peer never finishes it.
HALF_OPEN = b"POST /hooks/gh HT"


@dataclass
class Daemon:
    port: int
    log: Path

    def healthz(self) -> dict[str, Any]:
        """Asked as any monitor would: a fresh connection, a 200 with JSON."""
        url = f"http://127.0.0.1:{self.port}/healthz"
        with urllib.request.urlopen(url, timeout=20) as response:
            assert response.status == 200
            return dict(json.loads(response.read()))

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def daemon(tmp_path: Path, config_text: str, *, nofile: int | None = None) -> Iterator[Daemon]:
    """`echo-bot run` as a real process, optionally with a low descriptor limit."""

    def limit() -> None:
        if nofile is not None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    with daemon_process(tmp_path, config_text, ENV, preexec_fn=limit) as (_config, _st, port):
        yield Daemon(port, tmp_path / "daemon.log")


def half_open(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        with contextlib.suppress(OSError):  # a refused one may be closed already
            sock.sendall(HALF_OPEN)
        sockets.append(sock)
    return sockets


async def half_open_async(port: int, count: int) -> list[asyncio.StreamReader]:
    readers = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HALF_OPEN)
        reader.writer = writer  # type: ignore[attr-defined]  # kept open while stalled
        readers.append(reader)
    return readers


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent before it closed the connection (waits for that)."""
    try:
        async with asyncio.timeout(60):
            return await reader.read()
    except ConnectionResetError:
        return b""


def http_stats(bot: Bot) -> dict[str, Any]:
    assert bot.daemon.http is not None
    return dict(bot.daemon.http.health()[1]["components"]["http"])


async def test_attack_half_open_connections_over_the_cap_never_silence_healthz(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with (
        running_bot(state_dir, CAPPED, environ=ENV, channels=["webhook"]) as bot,
        aiohttp.ClientSession() as session,
    ):
        assert bot.daemon.http is not None
        port = bot.daemon.http.port
        assert port is not None
        peers = await half_open_async(port, 80)
        try:
            # answers while 80 peers hang mid-request-line, 30 more than the cap
            async with session.get(f"http://127.0.0.1:{port}/healthz") as answer:
                assert answer.status == 200
            stats = http_stats(bot)
            assert stats["max_connections"] == 50
            assert stats["connections"] <= 50
            assert stats["replaced"] + stats["refused"] >= 80 - 50
            # every half-open connection is closed by the server: replaced, refused, or
            # after the header timeout; none is ever answered as a request
            for peer in peers:
                assert b"HTTP/1.1 2" not in await closed_by_server(peer)
        finally:
            for peer in peers:
                peer.writer.close()  # type: ignore[attr-defined]
        async with session.get(f"http://127.0.0.1:{port}/healthz") as answer:
            assert answer.status == 200
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    refusals = [r for r in caplog.records if "http: connections refused" in r.getMessage()]
    assert len(refusals) <= 3  # once per interval with a count, never one line each


def test_attack_more_connections_than_descriptors_never_floods_the_log(
    tmp_path: Path,
) -> None:
    with daemon(tmp_path, UNCAPPED, nofile=64) as running:
        sockets = half_open(running.port, 80)  # more than the process may open
        try:
            assert running.healthz()["status"] == "ok"
            assert running.healthz()["status"] == "ok"
        finally:
            for sock in sockets:
                sock.close()
        log = running.log_text()
    lowered = re.search(
        r"max_connections = 256 is more than the descriptor limit .*using (\d+)", log
    )
    assert lowered is not None and int(lowered.group(1)) < 64, log
    assert "Traceback" not in log
    assert "out of system resource" not in log
    assert log.count("http: accept failed") <= 3


async def send_head(port: int, body_start: bytes, length: int) -> asyncio.StreamReader:
    """A POST whose body stops after ``body_start``: the peer stalls."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /hooks/gh HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
        + body_start
    )
    await writer.drain()
    reader.writer = writer  # type: ignore[attr-defined]  # kept open while stalled
    return reader


async def answer_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    async with asyncio.timeout(60):
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines[1:] if line)
    }
    return int(lines[0].split()[1]), headers


async def test_attack_stalled_large_bodies_past_the_route_bound_get_503_then_408(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No stalled reader gives way here, however slowly the machine runs this test (that
    # is the next test's).
    monkeypatch.setattr(http_module, "EVICT_AFTER", 3600.0)
    length = 1024 * 1024 - 10  # as in the attack: just under max_body, never finished
    body_start = b'{"ref": "' + b"x" * 60_000
    async with (
        running_bot(state_dir, BODIES, environ=ENV, channels=["webhook"]) as bot,
        aiohttp.ClientSession() as session,
    ):
        assert bot.daemon.http is not None
        port = bot.daemon.http.port
        assert port is not None
        base = f"http://127.0.0.1:{port}"
        stalled = [await send_head(port, body_start, length) for _ in range(2)]
        async with asyncio.timeout(30):
            while http_stats(bot)["bodies_reading"] < 2:
                await asyncio.sleep(0.05)
        extra = [await send_head(port, body_start, length) for _ in range(3)]
        for reader in extra:  # over the route's bound: refused at once, not read
            status, headers = await answer_head(reader)
            assert status == 503
            assert int(headers["retry-after"]) >= 1
            assert headers.get("connection", "").lower() == "close"
        # another route is not held up by this one's stalled peers
        body = dumps({"ref": "other"})
        async with session.post(base + "/hooks/other", data=body, headers=bearer_headers()) as r:
            assert r.status == 202
        for reader in stalled:  # dropped after the body timeout
            status, headers = await answer_head(reader)
            assert status == 408
            assert headers.get("connection", "").lower() == "close"
            with contextlib.suppress(ConnectionResetError):
                async with asyncio.timeout(60):
                    await reader.read()  # the server closes the connection
        stats = http_stats(bot)
        assert stats["bodies_reading"] == 0
        assert stats["slow_bodies"] == 2 and stats["busy_routes"] == 3

        stored = await bot.store.run(
            lambda tx: tx.inbox.recent("webhook", session_key="webhook:gh")
        )
        assert stored == []
        body = dumps({"ref": "after the flood"})
        async with session.post(base + "/hooks/gh", data=body, headers=gh_headers(body)) as r:
            assert r.status == 202  # the route's slots are free again
        for reader in stalled + extra:
            reader.writer.close()  # type: ignore[attr-defined]


async def test_attack_endless_request_heads_are_cut_off_and_large_bodies_still_pass(
    state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    endless = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
        b"X-Pad-%d: %s\r\n" % (n, b"a" * 8000) for n in range(100)
    )  # 800 KB of header lines, each within aiohttp's own limits, and no end
    async with (
        running_bot(state_dir, UNCAPPED, environ=ENV, channels=["webhook"]) as bot,
        aiohttp.ClientSession() as session,
    ):
        assert bot.daemon.http is not None
        port = bot.daemon.http.port
        base = f"http://127.0.0.1:{port}"
        peers = []
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(endless)
            reader.writer = writer  # type: ignore[attr-defined]
            peers.append(reader)
        for peer in peers:  # cut off long before the head could end
            assert (await closed_by_server(peer)) in (b"", TOO_LARGE)
            peer.writer.close()  # type: ignore[attr-defined]
        assert http_stats(bot)["large_heads"] == 20
        async with session.get(base + "/healthz") as answer:
            assert answer.status == 200
        # large bodies are no head: kept-alive deliveries of 600 KB each are accepted …
        for n in range(3):
            body = dumps({"ref": f"large {n}", "pad": "p" * 600_000})
            async with session.post(base + "/hooks/gh", data=body, headers=gh_headers(body)) as r:
                assert r.status == 202
        # … also when the head and the body arrive in one write, twice on one connection
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for n in range(2):
            body = dumps({"ref": f"one write {n}", "pad": "q" * 600_000})
            head = "".join(f"{k}: {v}\r\n" for k, v in gh_headers(body).items())
            writer.write(
                b"POST /hooks/gh HTTP/1.1\r\nHost: localhost\r\n"
                + head.encode()
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            status, headers = await answer_head(reader)
            assert status == 202
            await reader.readexactly(int(headers["content-length"]))
        writer.close()
        assert http_stats(bot)["large_heads"] == 20
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_a_kept_alive_peer_that_stalls_after_answered_requests_is_cut_off(
    state_dir: Path,
) -> None:
    """The header timeout is one timer per connection that each request moves: after
    several answered requests, a partial head that never ends still closes it."""
    async with running_bot(state_dir, CAPPED, environ=ENV, channels=["webhook"]) as bot:
        assert bot.daemon.http is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", bot.daemon.http.port)
        for _ in range(3):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            status, headers = await answer_head(reader)
            assert status == 200
            await reader.readexactly(int(headers["content-length"]))
            await asyncio.sleep(0.3)  # the deadline moves with each request
        writer.write(HALF_OPEN)
        assert await closed_by_server(reader) == b""
        writer.close()


async def test_a_large_head_sent_in_one_write_is_refused_too(state_dir: Path) -> None:
    """The 64 KiB bound holds when the whole head, blank line included, arrives at once
    (a 96 KiB head in one write was answered 200)."""
    head = (
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
        + b"".join(b"X-Pad-%d: %s\r\n" % (n, b"a" * 8000) for n in range(12))
        + b"\r\n"
    )
    async with running_bot(state_dir, UNCAPPED, environ=ENV, channels=["webhook"]) as bot:
        assert bot.daemon.http is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", bot.daemon.http.port)
        writer.write(head)
        assert (await closed_by_server(reader)) in (b"", TOO_LARGE)
        writer.close()
        assert http_stats(bot)["large_heads"] == 1


async def test_repeated_errors_are_logged_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.http_flood")
    throttle = Throttle(logger, interval=0.2)
    with caplog.at_level(logging.WARNING, logger="tests.http_flood"):
        for _ in range(500):
            throttle.note("http: accept failed", "OSError: [Errno 24] Too many open files")
        assert len(caplog.records) == 1
        async with asyncio.timeout(30):
            while len(caplog.records) < 2:
                await asyncio.sleep(0.05)
    throttle.close()
    first, summary = (record.getMessage() for record in caplog.records)
    assert first == "http: accept failed: OSError: [Errno 24] Too many open files"
    assert summary.startswith("http: accept failed: 499 more in the last")
    assert all(record.exc_info is None for record in caplog.records)


@pytest.mark.slow
@pytest.mark.xdist_group("bench")
def test_http_flood_bench_quick() -> None:
    """The bench script still runs (its figures live in bench/RESULTS.md); ``slow`` like
    the other benchmark smoke runs, and on their xdist worker (``xdist_group("bench")``,
    tests/test_bench_smoke): its flood of connections and its RSS figures would load,
    and be skewed by, another benchmark running beside it."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "http_flood.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=echo_bot_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "| phase | peers | RSS before MiB |" in result.stdout
    assert "0 tracebacks" in result.stdout


async def test_attack_strangers_trickling_into_every_slot_give_way_to_signed_deliveries(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No secret is needed to hold a route's body slots (the signature is on the body):
    a delivery whose body came with its head takes no slot, and one still arriving takes
    the place of a stranger whose body has been trickling longer than a delivery's
    would."""
    monkeypatch.setattr(http_module, "EVICT_AFTER", 0.5)
    async with (
        running_bot(state_dir, BODIES, environ=ENV, channels=["webhook"]) as bot,
        aiohttp.ClientSession() as session,
    ):
        assert bot.daemon.http is not None
        port = bot.daemon.http.port
        assert port is not None
        stalled = [await send_head(port, b'{"ref": "', 1000) for _ in range(2)]
        async with asyncio.timeout(30):
            while http_stats(bot)["bodies_reading"] < 2:
                await asyncio.sleep(0.05)
        body = dumps({"ref": "whole"})  # every slot taken, and taken moments ago
        url = f"http://127.0.0.1:{port}/hooks/gh"
        async with session.post(url, data=body, headers=gh_headers(body)) as answer:
            assert answer.status == 202
        await asyncio.sleep(0.6)  # the strangers have trickled longer than a delivery takes
        body = dumps({"ref": "arriving"})
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = "".join(f"{k}: {v}\r\n" for k, v in gh_headers(body).items())
        writer.write(
            f"POST /hooks/gh HTTP/1.1\r\nHost: localhost\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:5]
        )
        await writer.drain()
        await asyncio.sleep(0.2)  # the rest of the body a moment later
        writer.write(body[5:])
        status, _ = await answer_head(reader)
        assert status == 202
        writer.close()
        assert http_stats(bot)["bodies_evicted"] == 1
        closed = []
        for stranger in stalled:  # the oldest stranger's connection was closed
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(0.5):
                    closed.append(await stranger.read() == b"")
        assert closed == [True]
        stored = await bot.store.run(
            lambda tx: tx.inbox.recent("webhook", session_key="webhook:gh")
        )
        assert len(stored) == 2
        for stranger in stalled:
            stranger.writer.close()  # type: ignore[attr-defined]
