"""The one way tests wait: ``eventually``.

A test waits for what it cannot be told about directly (a row in the store, a file a
tool wrote, a line a daemon logged, a request a fake peer received). ``eventually``
looks at ``check`` until it gives something truthy and returns that; a fake that knows
when its records change passes ``woken_by`` so it is looked at on every change instead
of every 50 ms. On time-out it fails with an ``AssertionError`` that says what was
awaited and, when ``what`` is a function, the state at that moment.
``eventually_blocking`` is the same wait for code without an event loop (a fake that
reads on a thread, the benchmarks).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

EVERY = 0.05  # seconds between two looks when nothing wakes the wait


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    timeout: float = 10.0,
    what: str | Callable[[], object] = "",
    *,
    woken_by: Callable[[], Awaitable[object]] | None = None,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None],
    timeout: float = 10.0,
    what: str | Callable[[], object] = "",
    *,
    woken_by: Callable[[], Awaitable[object]] | None = None,
) -> T: ...


async def eventually(
    check: Callable[[], object],
    timeout: float = 10.0,
    what: str | Callable[[], object] = "",
    *,
    woken_by: Callable[[], Awaitable[object]] | None = None,
) -> object:
    """Wait until ``check()`` (it may be async) gives a truthy value, and return it.

    ``woken_by()`` (if given) is awaited between two looks: a fake's change signal.
    Fails after ``timeout`` seconds with ``what`` (called, if it is a function, to
    describe the state then)."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                answer = check()
                if inspect.isawaitable(answer):
                    answer = await answer
                if answer:
                    return answer
                if woken_by is None:
                    await asyncio.sleep(EVERY)
                else:
                    await woken_by()
    except TimeoutError:
        raise AssertionError(_timed_out(check, timeout, what)) from None


def eventually_blocking(
    check: Callable[[], T | None],
    timeout: float = 10.0,
    what: str | Callable[[], object] = "",
    *,
    every: float = EVERY,
) -> T:
    """``eventually`` for code without an event loop: looks every ``every`` seconds."""
    deadline = time.monotonic() + timeout
    while not (answer := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(check, timeout, what))
        time.sleep(every)
    return answer


def _timed_out(check: object, timeout: float, what: str | Callable[[], object]) -> str:
    described = what() if callable(what) else what
    return f"not within {timeout} s: {described or check}"
