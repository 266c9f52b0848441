"""One bounded HTTP request for ``echo-bot doctor``'s look at a channel's peer: the whole
request within a timeout, the answer read up to MAX_ANSWER, redirects not followed, a
token only in the ``Authorization`` header, and whatever the network raised turned into
``Unreachable`` whose text never holds the secrets named (a URL may carry a token)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

from .errors import EchoBotError

TIMEOUT = 5.0  # seconds for each request
MAX_ANSWER = 256 * 1024


class Unreachable(EchoBotError):
    """The peer did not answer (the text says how)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the JSON it held, or None
    headers: Mapping[str, str]  # names in lower case

    @property
    def fields(self) -> dict[str, Any]:
        """The body when it is a JSON object, else empty."""
        return self.body if isinstance(self.body, dict) else {}


class Probe:
    """``async with Probe() as probe: answer = await probe.ask(...)``: one session."""

    def __init__(self, timeout: float = TIMEOUT) -> None:
        self.timeout = timeout

    async def __aenter__(self) -> Probe:
        from aiohttp import ClientSession, ClientTimeout

        self._session = ClientSession(timeout=ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._session.close()

    async def ask(
        self, method: str, url: str, *, token: str | None = None, body: Any = None,
        hide: Iterable[str] = (),
    ) -> Answer:  # fmt: skip
        from aiohttp import ClientError

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, allow_redirects=False
            ) as response:
                raw = await response.content.read(MAX_ANSWER)
                status = response.status
                got = {k.lower(): v for k, v in response.headers.items()}
        except (ClientError, TimeoutError, OSError, ValueError) as exc:
            detail = str(exc)
            for secret in hide:
                for form in {secret, quote(secret, safe=""), quote(secret, safe=":")}:
                    detail = detail.replace(form, "***")
            raise Unreachable(f"{type(exc).__name__} {detail}".strip()) from None
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        return Answer(status, parsed, got)
