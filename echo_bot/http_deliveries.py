"""A network that POSTs its events to the daemon (Telegram's webhook, Slack's Events
API): the route every such channel needs, written once. Each delivery is committed
before it is answered: 200 only once the channel's ``take`` returned, 503 when the
store did not take it (``CommitFailed``: the network sends it again), 400 for a body
that is not one of its deliveries (``NotADelivery``), 401 for a sender without the
network's secret or signature — checked before the body is read when the secret is a
header (``head_ok``), else on the raw body (``body_ok``). Refused senders are counted
and logged at most once a minute: anyone can send them. A delivery the channel fails
to handle otherwise is logged and answered 200, or it would come back for ever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .bus import Routes
from .errors import CommitFailed, EchoBotError

log = logging.getLogger(__name__)

REFUSALS_LOGGED_EVERY = 60.0  # seconds

# The channel's handling of one delivery's body: the JSON to answer with (None: an
# empty 200). Raises NotADelivery, or CommitFailed when it was not stored.
Take = Callable[[bytes, Mapping[str, str]], Awaitable[Any]]


class NotADelivery(EchoBotError):
    """The body is none of the network's deliveries (answered 400 with this text)."""


class DeliveryRoute:
    def __init__(
        self,
        routes: Routes,
        path: str,
        take: Take,
        *,
        network: str,
        head_ok: Callable[[Mapping[str, str]], bool] | None = None,
        body_ok: Callable[[bytes, Mapping[str, str]], bool] | None = None,
        max_body: int | None = None,
    ) -> None:
        self.routes, self.path, self.take, self.network = routes, path, take, network
        self.head_ok, self.body_ok, self.max_body = head_ok, body_ok, max_body
        self.refused = 0  # requests without the network's secret or signature
        self._refusal_logged = -1e9
        routes.add_route("POST", path, self.handle, reads_body=True)

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        if self.head_ok is not None and not self.head_ok(request.headers):
            return self._unsigned()
        body = await self.routes.read_body(request, key=self.path, limit=self.max_body)
        if isinstance(body, web.Response):
            return body
        if self.body_ok is not None and not self.body_ok(body, request.headers):
            return self._unsigned()
        try:
            answer = await self.take(body, request.headers)
        except NotADelivery as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except CommitFailed:
            return web.json_response({"error": "not stored; retry"}, status=503)
        except Exception:
            log.exception("%s: a delivery to %s could not be handled", self.network, self.path)
            answer = None
        return web.Response(status=200) if answer is None else web.json_response(answer)

    def _unsigned(self) -> Any:
        from aiohttp import web

        self.refused += 1
        now = time.monotonic()
        if now - self._refusal_logged > REFUSALS_LOGGED_EVERY:
            self._refusal_logged = now
            log.warning("%s: a request to %s without its secret or signature refused (%d so far)",
                        self.network, self.path, self.refused)  # fmt: skip
        return web.json_response({"error": "bad or missing secret or signature"}, status=401)
