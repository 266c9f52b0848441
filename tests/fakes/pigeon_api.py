"""A fake server of Pigeon, the made-up network of the test plugin (tests/plugin/):
updates by long polling, messages sent and edited, a bearer token. What people say and
press waits here in order until the channel polls past it."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from tests.ports import free_port

TOKEN = "pigeon-token-value-1234"


@dataclass
class Sent:
    id: int
    chat: str
    text: str
    buttons: list[list[dict[str, str]]] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)


class FakePigeon:
    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.port = free_port()
        self.updates: list[dict[str, Any]] = []
        self.sent: list[Sent] = []
        self.polled_after: list[int] = []  # the ``after`` of every poll, in order
        self._ids = itertools.count(1)
        self._new = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/updates", self._updates)
        app.router.add_post("/send", self._send)
        app.router.add_post("/edit", self._edit)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    # -- what people do ---------------------------------------------------------------
    def push_message(self, text: str, user: str, chat: str | None = None) -> int:
        return self._push({"user": user, "chat": chat or user, "text": text})

    def push_press(self, message_id: int, action: str, user: str) -> int:
        message = next(m for m in self.sent if m.id == message_id)
        offered = [b["action"] for row in message.buttons for b in row]
        assert action in offered, f"{action} is not a button of message {message_id}"
        return self._push({"user": user, "chat": message.chat,
                           "press": {"message": message_id, "action": action}})  # fmt: skip

    def _push(self, update: dict[str, Any]) -> int:
        update["id"] = next(self._ids)
        self.updates.append(update)
        self._new.set()
        return int(update["id"])

    def texts_to(self, chat: str) -> list[str]:
        return [m.text for m in self.sent if m.chat == chat]

    # -- the API ----------------------------------------------------------------------
    def _authorised(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _updates(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "bad token"}, status=401)
        after = int(request.query.get("after", "0"))
        self.polled_after.append(after)
        waiting = [u for u in self.updates if u["id"] > after]
        if not waiting:
            self._new.clear()
            try:
                async with asyncio.timeout(float(request.query.get("wait", "1"))):
                    await self._new.wait()
            except TimeoutError:
                pass
            waiting = [u for u in self.updates if u["id"] > after]
        return web.json_response(waiting[:50])

    async def _send(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "bad token"}, status=401)
        body = await request.json()
        message = Sent(next(self._ids), str(body["chat"]), str(body["text"]),
                       list(body.get("buttons") or []))  # fmt: skip
        self.sent.append(message)
        return web.json_response({"id": message.id})

    async def _edit(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "bad token"}, status=401)
        body = await request.json()
        message = next((m for m in self.sent if str(m.id) == str(body["id"])), None)
        if message is None:
            return web.json_response({"error": "no such message"}, status=404)
        message.edits.append(str(body["text"]))
        message.buttons = []
        return web.json_response({"id": message.id})
