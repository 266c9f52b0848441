"""A person's file fetched over HTTP (echo_bot/downloads.py) from a real local server:
whole within the limit, refused past it, and each kind of answer read as what it means
for the turn (gone, refused, try again), a redirect never followed with the token."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from echo_bot.downloads import DownloadLimit, fetch_to, save_whole
from echo_bot.errors import ChannelError, MediaUnavailable

FILE = b"x" * 5000


async def serve(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name == "file":
        assert request.headers.get("Authorization") == "Bearer t"
        return web.Response(body=FILE, content_type="application/octet-stream")
    if name == "page":
        return web.Response(text="<html>sign in</html>", content_type="text/html")
    if name == "moved":
        raise web.HTTPFound("/file")
    status = int(name)
    return web.json_response({"errcode": f"E_{status}"}, status=status)


@pytest.fixture
async def base() -> object:
    app = web.Application()
    app.router.add_get("/{name}", serve)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/")


async def test_a_file_whole_or_none_within_its_limit(base: str, tmp_path: Path) -> None:
    target = tmp_path / "got.bin"
    auth = {"Authorization": "Bearer t"}
    roomy = DownloadLimit(10_000, None, "[net] max_download")
    size = await save_whole(target, lambda p: fetch_to(p, f"{base}/file", roomy, peer="Net",
                                                       headers=auth))  # fmt: skip
    assert size == len(FILE) and target.read_bytes() == FILE
    small = DownloadLimit(1000, None, "[net] max_download")
    with pytest.raises(MediaUnavailable, match=r"\[net\] max_download"):
        await save_whole(
            tmp_path / "big.bin",
            lambda p: fetch_to(p, f"{base}/file", small, peer="Net", headers=auth),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["got.bin"]  # no partial left


async def test_each_answer_means_what_it_says_for_the_turn(base: str, tmp_path: Path) -> None:
    limit = DownloadLimit(10_000, None, "[net] max_download")

    async def fetched(name: str, **options: object) -> None:
        await fetch_to(tmp_path / "p", f"{base}/{name}", limit, peer="Net", **options)  # type: ignore[arg-type]

    with pytest.raises(MediaUnavailable, match=r"Net has no such file \(HTTP 404 E_404\)"):
        await fetched("404", explain=lambda body: body["errcode"])
    with pytest.raises(MediaUnavailable, match="Net refused it"):
        await fetched("401")
    with pytest.raises(MediaUnavailable, match="Net refused it"):
        await fetched("moved")  # not followed: the token goes nowhere else
    for passing in ("429", "503"):
        with pytest.raises(ChannelError) as caught:
            await fetched(passing)
        assert caught.value.retryable and not isinstance(caught.value, MediaUnavailable)
    with pytest.raises(MediaUnavailable, match="a sign-in page"):
        await fetched("page", html_means="a sign-in page")
