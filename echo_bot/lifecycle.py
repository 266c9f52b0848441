"""One way for every part of the daemon to start and stop.

Each part is entered into one ``AsyncExitStack`` as it starts, so the stop order is the
reverse of the start order by construction, and a part that failed to start has nothing
to stop while everything started before it is still stopped. A part whose stop fails is
logged with its name; the others still stop."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[object]]


@asynccontextmanager
async def running(name: str, start: Step | None, stop: Step | None) -> AsyncIterator[None]:
    if start is not None:
        await start()
    try:
        yield
    finally:
        if stop is not None:
            try:
                await stop()
            except Exception:
                log.exception("stopping %s failed; going on with the rest", name)


class Parts:
    """The started parts of one run, in start order (a thin face on the exit stack)."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack
        self.names: list[str] = []

    async def start(self, name: str, start: Step | None = None, stop: Step | None = None) -> None:
        await self._stack.enter_async_context(running(name, start, stop))
        self.names.append(name)
