"""The one aiohttp server: channels' routes, ``/healthz``. Imported only when needed.

Started when something needs it (webhooks, Telegram webhook mode, ``[http] enabled``
for ``/healthz`` and ``/metrics``: see ``app.http_reasons``); it listens on
``[http] host:port`` (loopback by default: put a TLS reverse proxy in front). The
address is taken before anything else starts (:meth:`HttpServer.bind`); when it cannot
be had the daemon stops with one line and exit code 2.

A stranger must not be able to knock it out, so the server owns its listening sockets
and accepts connections itself (aiohttp serves each accepted one):

- at most ``max_connections`` connections (fewer when the process's descriptor limit
  leaves less room); at the cap a new connection replaces the connection idle for the
  longest, or, when every one is busy with a request, is answered 503 and closed at
  once — descriptors are never exhausted and ``/healthz`` keeps answering;
- a request's line and headers must arrive within ``header_timeout`` of the connection
  (or of the previous answer on a kept-alive one), else the connection is closed, and
  may not exceed 64 KiB (else 431 and closed);
- a body is read under a per-route bound on bodies being read at once (more: 503 with
  ``Retry-After``) and must arrive whole within ``body_timeout`` (else 408);
- repeated accept and connection errors are logged once per interval with a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .config import HttpConfig
from .errors import EchoBotError
from .hardening import release_free_memory
from .secrets import Masker

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HealthCheck = Callable[[], dict[str, Any]]

DEGRADED = {"degraded", "down", "error"}
BACKLOG = 128
ACCEPT_BATCH = 64  # connections taken per readiness event: others wait their turn
ACCEPT_PAUSE = 1.0  # seconds without accepting after accept() failed (e.g. no descriptors)
LINGER = 2.0  # seconds an answered request's unread body is still drained before closing
LOG_INTERVAL = 30.0
# Connections open at once after which, once nearly all have closed again (a webhook
# peer may keep a few alive), free heap memory is handed back to the system (see
# hardening.release_free_memory).
TRIM_AFTER_PEAK = 32
TRIM_BELOW = 8
RETRY_AFTER = 2
READ_CHUNK = 64 * 1024
# Seconds a body may take before, with its route's slots all taken, a newcomer's read
# takes its place (a delivery's body arrives in moments; a trickle is a stranger's).
EVICT_AFTER = 2.0
# What aiohttp buffers of a body per connection before pausing the socket (2x this).
READ_BUFSIZE = 64 * 1024
BODY_METHODS = {"*", "POST", "PUT", "PATCH", "DELETE"}
# Request line and headers one request may send: nginx allows 4 x 8 KiB. aiohttp alone
# would buffer up to 128 fields of 8 KiB for every connection still sending its head.
MAX_HEAD = 64 * 1024
HEAD_END = b"\r\n\r\n"
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n" % RETRY_AFTER
)


def not_ready_response(component: str) -> bytes:
    """What every request gets while the daemon waits for ``component`` at start: 503
    with the /healthz body, so a load balancer sees it degraded and senders retry."""
    body = json.dumps(
        {"status": "degraded", "components": {component: {"status": "unavailable"}}}
    ).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (RETRY_AFTER, len(body), body)
    )


def error_response(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON refusal; the connection is closed after it (its body may be unread)."""
    response = web.json_response({"status": "error", "error": reason}, status=status)
    response.headers.update(headers or {})
    response.force_close()
    return response


class Throttle:
    """One log line per kind of trouble per interval, with how often it happened."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self.logger = logger
        self.interval = interval
        self._since: dict[str, float] = {}
        self._more: dict[str, int] = {}
        self._flush: dict[str, asyncio.TimerHandle] = {}

    def first(self, kind: str) -> bool:
        """True when ``kind`` should be logged now; else it is counted for later."""
        now = time.monotonic()
        since = self._since.get(kind)
        if since is not None and now - since < self.interval:
            self._more[kind] = self._more.get(kind, 0) + 1
            if kind not in self._flush:
                delay = self.interval - (now - since)
                self._flush[kind] = asyncio.get_running_loop().call_later(delay, self._report, kind)
            return False
        self._since[kind] = now
        return True

    def note(self, kind: str, detail: str = "") -> None:
        if self.first(kind):
            self.logger.warning("%s%s", kind, f": {detail}" if detail else "")

    def _report(self, kind: str) -> None:
        self._flush.pop(kind, None)
        more = self._more.pop(kind, 0)
        if more:
            self.logger.warning("%s: %d more in the last %.0f s", kind, more, self.interval)
            self._since[kind] = time.monotonic()

    def close(self) -> None:
        for handle in self._flush.values():
            handle.cancel()
        self._flush.clear()


class _QuietErrors(logging.Filter):
    """aiohttp logs each failed connection or request on its own, tracebacks included;
    a flood of them must not fill the disk. Keep the first of a kind per interval."""

    def __init__(self, throttle: Throttle) -> None:
        super().__init__()
        self.throttle = throttle

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.exc_info[1] is None:
            return True
        try:
            return self.throttle.first(f"{record.msg} ({type(record.exc_info[1]).__name__})")
        except RuntimeError:  # no running loop: nothing to schedule the count on
            return True


class Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's request handler, seen by the server.

    It knows whether a request is being handled, and watches a request's head (line and
    headers) while it arrives: not complete within ``header_timeout`` of the connection
    or of the previous request's end closes it; more than ``MAX_HEAD`` bytes closes it
    with 431.
    A head ends at the first blank line; the next one starts once the request has been
    handled and its body received (a client that pipelines a large body right behind
    another request could be taken for a large head; webhook senders and Telegram do
    not pipeline).
    """

    def __init__(
        self,
        handler: asyncio.Protocol,
        on_lost: Callable[[Connection], None],
        on_large_head: Callable[[], None],
        header_timeout: float,
    ) -> None:
        self.handler = handler
        self.on_lost = on_lost
        self.on_large_head = on_large_head
        self.header_timeout = header_timeout
        self._late: asyncio.TimerHandle | None = None
        self._head_due: float | None = None  # loop time by which the head must be in
        self.transport: asyncio.Transport | None = None
        self.busy = 0  # requests being handled right now
        self.idle_since = time.monotonic()
        self.closed = False
        self.in_head = True
        self.head_bytes = 0
        self._tail = b""  # the last bytes received, for a blank line split between reads
        self._body: Any = None  # an answered request's body still arriving (is_eof())

    @property
    def idle(self) -> bool:
        """No request in progress and nothing left to send (true until it is set up)."""
        return self.busy == 0 and (
            self.transport is None or self.transport.get_write_buffer_size() == 0
        )

    def request_started(self) -> None:
        self.busy += 1
        self.in_head, self._body = False, None
        self._head_due = None

    def request_finished(self, body: Any) -> None:
        """``body`` is the request's payload stream: bytes still due belong to it."""
        self.busy -= 1
        if not self.busy:
            self.idle_since = time.monotonic()
            self._body = body
            self._next_head()
            self._arm()

    # One timer per connection, not one per request: a request only moves the deadline
    # (``_head_due``; None while a request is handled), and the timer, when it fires
    # before the deadline, is set again for it.
    def _arm(self) -> None:
        """The next request's line and headers must be in within ``header_timeout``."""
        loop = asyncio.get_running_loop()
        self._head_due = loop.time() + self.header_timeout
        if self._late is None:
            self._late = loop.call_at(self._head_due, self._head_too_late)

    def _disarm(self) -> None:
        self._head_due = None
        if self._late is not None:
            self._late.cancel()
            self._late = None

    def _head_too_late(self) -> None:
        self._late = None
        if self._head_due is None or self.busy:
            return  # a request is being handled: its end sets the next deadline
        loop = asyncio.get_running_loop()
        if loop.time() < self._head_due:
            self._late = loop.call_at(self._head_due, self._head_too_late)
        else:
            self.close()

    def _next_head(self) -> None:
        if self._body is None or self._body.is_eof():
            self._body = None
            self.in_head, self.head_bytes, self._tail = True, 0, b""

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.handler.connection_made(transport)
        if self.closed:  # replaced before it was even set up
            transport.close()
        else:
            self._arm()

    def data_received(self, data: bytes) -> None:
        if self._body is not None and not self.busy:
            self._next_head()
        if self.in_head:
            self.head_bytes += self._head_part(data)
            if self.head_bytes > MAX_HEAD:
                self.on_large_head()
                if self.transport is not None:
                    self.transport.write(TOO_LARGE)
                self.close()
                return
        self.handler.data_received(data)

    def _head_part(self, data: bytes) -> int:
        """How many bytes of ``data`` belong to the head; the head ends with this chunk
        when its blank line is in it (or straddles the previous chunk's last bytes)."""
        seen = len(self._tail)
        joined = self._tail + data
        end = joined.find(HEAD_END)
        if end < 0:
            self._tail = joined[-3:]
            return len(data)
        self.in_head, self._tail = False, b""
        return end + len(HEAD_END) - seen

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._disarm()
        self.on_lost(self)
        self.handler.connection_lost(exc)


class BodySlots:
    """At most ``limit`` bodies read at once per route. At the bound, a reader that
    has waited ``EVICT_AFTER`` for its body is cancelled for the newcomer: a genuine
    delivery's body arrives in moments, so strangers who trickle bytes into every
    slot cannot hold a route's senders off for a whole ``body_timeout``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reading: dict[str, dict[asyncio.Task[Any], float]] = {}  # key → reader → since
        self.evicted = 0

    def acquire(self, key: str) -> bool:
        readers = self.reading.setdefault(key, {})
        if len(readers) >= self.limit:
            oldest, since = next(iter(readers.items()))  # in the order they came
            if time.monotonic() - since < EVICT_AFTER:
                return False
            del readers[oldest]
            oldest.cancel()
            self.evicted += 1
        task = asyncio.current_task()
        assert task is not None
        readers[task] = time.monotonic()
        return True

    def release(self, key: str) -> None:
        readers = self.reading.get(key, {})
        readers.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
        if not readers:
            self.reading.pop(key, None)

    def count(self) -> int:
        return sum(len(readers) for readers in self.reading.values())


def fd_headroom() -> int | None:
    """Descriptors this process may still open, less a reserve for the rest of the
    daemon (store, outgoing clients, tool processes); None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    reserve = max(16, soft // 8)
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = reserve
    return soft - used - reserve


async def listen(host: str, port: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address ``host`` names."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # one port for every address
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class ListenError(EchoBotError):
    """The server cannot have its address (in use, not ours, privileged): exit code 2, so
    systemd does not restart into the same wall (RestartPreventExitStatus=2)."""

    exit_code = 2


def _shown(host: str, port: int) -> str:
    host = host or "*"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_error(host: str, port: int, exc: OSError) -> ListenError:
    where = f"cannot listen on {_shown(host, port)}"
    if isinstance(exc, socket.gaierror):
        return ListenError(f"{where}: [http] host {host!r} does not resolve ({exc.strerror})")
    if exc.errno == errno.EADDRINUSE:
        return ListenError(
            f"{where}: the address is already in use (another echo-bot?); stop that "
            "process or set [http] port to a free port"
        )
    if exc.errno == errno.EACCES:
        return ListenError(
            f"{where}: permission denied (ports below 1024 need privileges); "
            "set [http] port to 1024 or above"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return ListenError(f"{where}: [http] host is not an address of this machine")
    return ListenError(f"{where}: {exc.strerror or exc}; check [http] host and [http] port")


class HttpServer:
    def __init__(self, config: HttpConfig, *, client_max_size: int = 1024 * 1024) -> None:
        self.config = config
        self.client_max_size = client_max_size
        self.app = web.Application(client_max_size=client_max_size, middlewares=[self._track])
        self.app.router.add_get("/healthz", self._healthz)
        self._checks: dict[str, HealthCheck] = {"http": self._stats}
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.max_connections = config.max_connections
        self._connections: dict[asyncio.Protocol, Connection] = {}  # by aiohttp's handler
        # Connections whose request was refused before its body was read: still draining.
        self._refused: set[Any] = set()
        self._connecting: set[asyncio.Task[Any]] = set()
        self._sockets: list[socket.socket] = []
        self._bodies = BodySlots(config.max_concurrent_bodies)
        self._trouble = Throttle(log)
        self._peak = 0  # most connections open at once since memory was last trimmed
        self._not_ready: bytes | None = None  # answering 503 to all while starting
        self._quiet = _QuietErrors(self._trouble)
        self.counts = {
            "refused": 0,
            "replaced": 0,
            "large_heads": 0,
            "busy_routes": 0,
            "slow_bodies": 0,
        }

    def add_route(
        self, method: str, path: str, handler: Handler, *, reads_body: bool = False
    ) -> None:
        """Serve ``handler``. Unless it ``reads_body`` itself (with :meth:`read_body`),
        a request's body is read for it first, bounded and timed like any other."""
        if method.upper() in BODY_METHODS and not reads_body:
            handler = self._reading_first(path, handler)
        self.app.router.add_route(method, path, handler)

    def add_health(self, name: str, check: HealthCheck) -> None:
        self._checks[name] = check

    # /healthz answers anyone: without the admin token it shows states only; details
    # (error texts, which may quote a URL or a peer's answer) need the token, masked.
    _health_masker = Masker()
    _admin_token = ""

    def protect_health(self, masker: Masker, admin_token: str) -> None:
        self._health_masker, self._admin_token = masker, admin_token

    def _is_admin(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return (
            bool(self._admin_token)
            and scheme.lower() == "bearer"
            and hmac.compare_digest(
                given.strip().encode("utf-8", "surrogateescape"), self._admin_token.encode()
            )
        )

    def health(self) -> tuple[bool, dict[str, Any]]:
        components: dict[str, Any] = {}
        healthy = True
        for name, check in self._checks.items():
            try:
                state = check()
            except Exception as exc:  # a failing check is itself a finding
                state = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            components[name] = state
            if str(state.get("status")) in DEGRADED:
                healthy = False
        return healthy, {"status": "ok" if healthy else "degraded", "components": components}

    async def _healthz(self, request: web.Request) -> web.Response:
        healthy, body = self.health()
        components: dict[str, Any] = body["components"]
        if self._is_admin(request):
            body["components"] = self._health_masker.mask_data(components)
        else:
            body["components"] = {
                name: {"status": str(state.get("status"))} for name, state in components.items()
            }
        return web.json_response(body, status=200 if healthy else 503)

    async def start(self) -> None:
        # Connection enforces header_timeout itself; aiohttp also closes a kept-alive
        # connection idle for that long.
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            keepalive_timeout=self.config.header_timeout.total_seconds(),
            lingering_time=LINGER,
            read_bufsize=READ_BUFSIZE,
        )
        await self._runner.setup()
        headroom = fd_headroom()
        if headroom is not None and headroom < self.max_connections:
            self.max_connections = max(1, headroom)
            log.warning(
                "[http] max_connections = %d is more than the descriptor limit leaves room "
                "for; using %d (raise LimitNOFILE / ulimit -n to allow more)",
                self.config.max_connections,
                self.max_connections,
            )
        logging.getLogger("aiohttp.server").addFilter(self._quiet)
        if not self._sockets:
            await self.bind()
        loop = asyncio.get_running_loop()
        self._not_ready = None
        for sock in self._sockets:
            loop.remove_reader(sock.fileno())  # serve_not_ready may have added it
            loop.add_reader(sock.fileno(), self._accept, sock)
        self.port = self._sockets[0].getsockname()[1] if self._sockets else self.config.port
        log.info("HTTP server listening on %s:%s", self.config.host, self.port)

    def serve_not_ready(self, component: str) -> None:
        """Until :meth:`start`, answer every connection on the bound address with 503
        (``component`` unavailable): the daemon waits for it at start."""
        self._not_ready = not_ready_response(component)
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.remove_reader(sock.fileno())
            loop.add_reader(sock.fileno(), self._accept, sock)

    async def bind(self) -> None:
        """Take the address now, before anything else starts: :class:`ListenError` (one
        line, exit code 2) when it cannot be had. :meth:`start` then serves on it."""
        try:
            self._sockets = await listen(self.config.host, self.config.port)
        except OSError as exc:
            raise listen_error(self.config.host, self.config.port, exc) from None

    async def stop(self) -> None:
        """Idempotent: also closes the sockets of a server bound but never started."""
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []
        for task in list(self._connecting):
            task.cancel()
        for handler in list(self._refused):  # a sender still uploading after a refusal
            if handler in self._connections:
                handler.force_close()
        self._refused.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        logging.getLogger("aiohttp.server").removeFilter(self._quiet)
        self._trouble.close()

    def _stats(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "connections": len(self._connections),
            "max_connections": self.max_connections,
            "bodies_reading": self._bodies.count(),
            "bodies_evicted": self._bodies.evicted,
            **self.counts,
        }

    # -- bodies ------------------------------------------------------------------------------
    async def read_body(
        self, request: web.Request, *, key: str, limit: int | None = None
    ) -> bytes | web.Response:
        """The request's body, or the refusal to answer with (413, 503, 408, 400).

        After a refusal the sender may still be uploading: aiohttp drains the rest for
        up to ``LINGER`` so the answer is read rather than lost to a reset, and
        :meth:`stop` ends those drains at once (nothing waits on such a sender)."""
        body = await self._read_body(request, key=key, limit=limit)
        if isinstance(body, web.Response) and not request.content.is_eof():
            self._refused.add(request.protocol)
        return body

    async def _read_body(
        self, request: web.Request, *, key: str, limit: int | None
    ) -> bytes | web.Response:
        """The request's body, or the refusal to answer with (413, 503, 408, 400).

        At most ``max_concurrent_bodies`` bodies still arriving are read at once per
        ``key`` (a route; see ``BodySlots``); the whole body must arrive within
        ``body_timeout``. With ``limit`` the body is
        read here (refused as soon as it grows past it); without, aiohttp reads it
        under the app's ``client_max_size`` and keeps it for ``request.json()``.
        """
        size_limit = limit if limit is not None else self.client_max_size
        if request.content_length is not None and request.content_length > size_limit:
            return error_response(413, f"body larger than {size_limit} bytes")
        # All of it has arrived (a small body comes with its head): reading it cannot
        # wait, so it takes no slot and needs no timer.
        waits = not request.content.is_eof()
        if waits and not self._bodies.acquire(key):
            self.counts["busy_routes"] += 1
            self._trouble.note("http: bodies refused with 503", f"route {key} is at its bound")
            return error_response(
                503,
                "too many requests are sending bodies to this route; retry later",
                {"Retry-After": str(RETRY_AFTER)},
            )
        timeout = self.config.body_timeout.total_seconds()
        try:
            if not waits:
                return await _read(request, limit)
            async with asyncio.timeout(timeout):
                return await _read(request, limit)
        except TimeoutError:
            self.counts["slow_bodies"] += 1
            self._trouble.note("http: bodies dropped after body_timeout", f"route {key}")
            return error_response(408, f"the body did not arrive within {timeout:g} s")
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"body larger than {size_limit} bytes")
        except (OSError, web.RequestPayloadError) as exc:  # the sender went away or garbled
            self._trouble.note("http: bodies not read", f"{type(exc).__name__}: {exc}")
            return error_response(400, "the body could not be read")
        finally:
            if waits:
                self._bodies.release(key)

    def _reading_first(self, key: str, handler: Handler) -> Handler:
        async def reading_first(request: web.Request) -> web.StreamResponse:
            if request.body_exists:
                body = await self.read_body(request, key=key)
                if isinstance(body, web.Response):
                    return body
            return await handler(request)

        return reading_first

    # -- connections -------------------------------------------------------------------------
    @web.middleware
    async def _track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Mark the connection busy while one of its requests is handled."""
        connection = self._connections.get(request.protocol)
        if connection is None:
            return await handler(request)
        connection.request_started()
        try:
            return await handler(request)
        finally:
            connection.request_finished(request.content)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                # Out of descriptors or memory: the socket stays readable, so accepting
                # again at once would only spin. Pause, and say so once per interval.
                self._trouble.note("http: accept failed", f"{type(exc).__name__}: {exc}")
                self._pause_accepting(sock)
                return
            self._admit(conn)

    def _pause_accepting(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())

        def resume() -> None:
            if sock in self._sockets:
                loop.add_reader(sock.fileno(), self._accept, sock)

        loop.call_later(ACCEPT_PAUSE, resume)

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if self._not_ready is not None:
            with contextlib.suppress(OSError):
                conn.send(self._not_ready)
            conn.close()
            return
        if len(self._connections) >= self.max_connections and not self._replace_idle():
            self.counts["refused"] += 1
            self._trouble.note(
                "http: connections refused",
                f"{self.max_connections} connections are busy ([http] max_connections)",
            )
            with contextlib.suppress(OSError):  # a courtesy: the peer may be gone already
                conn.send(REFUSAL)
            conn.close()
            return
        assert self._runner is not None and self._runner.server is not None
        connection = Connection(
            self._runner.server(),
            self._forget,
            self._large_head,
            self.config.header_timeout.total_seconds(),
        )
        self._connections[connection.handler] = connection
        self._peak = max(self._peak, len(self._connections))
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: connection, conn))
        self._connecting.add(task)
        task.add_done_callback(lambda done: self._connected(done, connection, conn))

    def _connected(
        self, task: asyncio.Task[Any], connection: Connection, conn: socket.socket
    ) -> None:
        self._connecting.discard(task)
        if task.cancelled() or task.exception() is not None:
            self._connections.pop(connection.handler, None)
            conn.close()
            if not task.cancelled():
                self._trouble.note("http: connection not set up", f"{task.exception()!r}")

    def _large_head(self) -> None:
        self.counts["large_heads"] += 1
        self._trouble.note("http: connections closed", f"a request head over {MAX_HEAD} bytes")

    def _forget(self, connection: Connection) -> None:
        self._connections.pop(connection.handler, None)
        self._refused.discard(connection.handler)
        if len(self._connections) < TRIM_BELOW and self._peak >= TRIM_AFTER_PEAK:
            # A flood is over: its buffers are free, give the pages back (off the loop).
            self._peak = 0
            asyncio.get_running_loop().run_in_executor(None, release_free_memory)

    def _replace_idle(self) -> bool:
        """Close the connection idle for the longest to make room; False if none is."""
        idle = [c for c in self._connections.values() if c.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        self._connections.pop(oldest.handler, None)
        oldest.close()
        self.counts["replaced"] += 1
        return True


async def _read(request: web.Request, limit: int | None) -> bytes | web.Response:
    if limit is None:
        return await request.read()
    if request.content.is_eof():
        return _take_received(request, limit)
    return await _read_at_most(request, limit)


def _take_received(request: web.Request, limit: int) -> bytes | web.Response:
    """The body of a request whose payload has ended (``is_eof``): what is buffered."""
    body = request.content.read_nowait(-1)
    if len(body) > limit:
        return error_response(413, f"body larger than {limit} bytes")
    return body


async def _read_at_most(request: web.Request, limit: int) -> bytes | web.Response:
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            return error_response(413, f"body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
