"""The doctor's bounded HTTP request (echo_bot/probe.py) against a real local server: the
answer's status, JSON and headers; a body that is no JSON; a redirect not followed; and
a peer that is not there, whose error never shows the token in the URL."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from echo_bot.probe import Probe, Unreachable

TOKEN = "123456:AAH-secret-token"


async def answer(request: web.Request) -> web.StreamResponse:
    if request.path == "/json":
        said = request.headers.get("Authorization", "")
        return web.json_response({"ok": True, "auth": said}, headers={"X-Scopes": "a,b"})
    if request.path == "/moved":
        raise web.HTTPFound("/json")
    return web.Response(text="<html>not json</html>", content_type="text/html")


async def test_an_answer_its_json_and_headers_and_no_redirect_followed() -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with TestServer(app, host="127.0.0.1") as server, Probe() as probe:
        base = str(server.make_url(""))
        got = await probe.ask("POST", f"{base}/json", token=TOKEN)
        assert got.status == 200 and got.fields == {"ok": True, "auth": f"Bearer {TOKEN}"}
        assert got.headers["x-scopes"] == "a,b"
        page = await probe.ask("GET", f"{base}/page")
        assert (page.status, page.body, page.fields) == (200, None, {})
        moved = await probe.ask("GET", f"{base}/moved")
        assert moved.status == 302


async def test_a_peer_not_there_is_unreachable_and_the_token_never_shows() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    async with Probe(timeout=2) as probe:
        with pytest.raises(Unreachable, match="Cannot connect"):
            await probe.ask("GET", f"http://127.0.0.1:{port}/bot{TOKEN}/getMe", hide=[TOKEN])
        # An error that quotes the URL (a bad api_base: the port out of range).
        with pytest.raises(Unreachable) as caught:
            await probe.ask("GET", f"http://127.0.0.1:99999/bot{TOKEN}/getMe", hide=[TOKEN])
    assert "/bot***/getMe" in str(caught.value) and "secret" not in str(caught.value)
