"""Property: random headers and bodies thrown at a running `echo-bot run` never get a 5xx
and never run anything (no request can carry a valid signature), and the daemon stays up."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.channels.test_webhook import CONFIG, ENV
from tests.conftest import read_store
from tests.proc import daemon_process

PATHS = [
    "/hooks/gh",
    "/hooks/std",
    "/hooks/bearer",
    "/hooks/cmd",
    "/hooks/filtered",
    "/hooks/ask",
    "/hooks/nope",
    "/hooks/gh/deliveries/0123",
    "/hooks/",
]
SIGNATURE_HEADERS = [
    "X-Hub-Signature-256",
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "Authorization",
    "Content-Type",
]
# Framing headers would make the request itself inconsistent (the client sets them).
FRAMING = {"content-length", "transfer-encoding", "host", "connection", "expect"}

# Header values: latin-1 text without CR/LF (http.client sends it as raw bytes, so
# 0x80-0xff arrive as bytes that are not UTF-8).
header_text = st.text(
    alphabet=st.characters(min_codepoint=1, max_codepoint=255, exclude_characters="\r\n"),
    max_size=80,
)
plausible_values = st.one_of(
    header_text,
    st.sampled_from(["application/json", "application/vnd.github+json", "text/plain", "ping"]),
    st.builds(lambda h: f"sha256={h}", st.text("0123456789abcdef", min_size=0, max_size=64)),
    st.builds(lambda t: f"Bearer {t}", header_text),
    st.builds(lambda t: f"v1,{t}", st.text("ABCDEFabcdef0123456789+/=", max_size=48)),
    st.builds(lambda d: str(int(time.time()) + d), st.integers(min_value=-1000, max_value=1000)),
)
header_names = st.one_of(
    st.sampled_from(SIGNATURE_HEADERS),
    st.sampled_from(SIGNATURE_HEADERS).map(str.upper),
    st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,24}", fullmatch=True),
).filter(lambda name: name.lower() not in FRAMING)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
bodies = st.one_of(
    st.binary(max_size=2000),
    st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"ref": st.text(max_size=40)}).map(lambda v: json.dumps(v).encode()),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE"]))
    path = draw(st.sampled_from(PATHS))
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["Content-Type"] = "application/json"  # get past 415 to the signature check
    for name, value in draw(st.lists(st.tuples(header_names, plausible_values), max_size=8)):
        headers[name] = value
    return method, path, headers, draw(bodies)


def post(port: int, method: str, path: str, headers: dict[str, str], body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def webhook_inbox_rows(state: Path) -> list[Any]:
    return read_store(state, lambda tx: tx.inbox.recent("webhook"))


def test_random_requests_never_5xx_and_never_run(tmp_path: Path) -> None:
    with daemon_process(tmp_path, CONFIG, ENV) as (_config, state, port):
        statuses: list[int] = []

        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(request=requests())
        def throw(request: tuple[str, str, dict[str, str], bytes]) -> None:
            method, path, headers, body = request
            status = post(port, method, path, headers, body)
            statuses.append(status)
            assert status < 500, (status, request)
            assert 400 <= status < 500, (status, request)  # no signature: never accepted

        throw()
        assert len(statuses) >= 100
        assert {401, 415} <= set(statuses)  # the signature check itself was reached
        with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=10)) as conn:
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
        assert webhook_inbox_rows(state) == []
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    assert "delivery failed" not in log
    # The only tracebacks are aiohttp's own for requests its parser refused (answered 400).
    assert log.count("Traceback") == log.count("aiohttp.http_exceptions.BadHttpMessage: 400")
