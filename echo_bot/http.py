"""The one aiohttp server: channels' routes, ``/healthz``. Imported only when needed.

Started when something needs it (the Telegram channel, webhooks); it listens on
``[http] host:port`` (loopback by default: put a TLS reverse proxy in front).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .config import HttpConfig
from .secrets import Masker

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HealthCheck = Callable[[], dict[str, Any]]

DEGRADED = {"degraded", "down", "error"}


class HttpServer:
    def __init__(self, config: HttpConfig, *, client_max_size: int = 1024 * 1024) -> None:
        self.config = config
        self.app = web.Application(client_max_size=client_max_size)
        self.app.router.add_get("/healthz", self._healthz)
        self._checks: dict[str, HealthCheck] = {}
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def add_route(self, method: str, path: str, handler: Handler) -> None:
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
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        addresses = self._runner.addresses
        self.port = addresses[0][1] if addresses else self.config.port
        log.info("HTTP server listening on %s:%s", self.config.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
