"""When the queue of pending requests changes, every open console hears it.

A request created or decided here is announced by the store right after its COMMIT
(``ApprovalRequested``, ``ApprovalDecided``); on PostgreSQL one made by another daemon
arrives as its NOTIFY ("approval", or "*" after the listener reconnected). Each open
page's stream waits on its own ``Listener`` and reads the queue again when woken.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..store import ApprovalDecided, ApprovalRequested, Store


class Listener:
    """One open page's wake-up: set when something changed since it last looked."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def changed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s; True when something changed (and clear it)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()
        woken = self._event.is_set()
        self._event.clear()
        return woken


class Feed:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.listeners: set[Listener] = set()
        self.closed = asyncio.Event()

    def start(self) -> None:
        self.store.subscribe(ApprovalRequested, self._changed)
        self.store.subscribe(ApprovalDecided, self._changed)
        self.store.on_wake(self._woken)

    async def stop(self) -> None:
        """Unsubscribe and end every open stream."""
        self.store.unsubscribe(ApprovalRequested, self._changed)
        self.store.unsubscribe(ApprovalDecided, self._changed)
        self.store.off_wake(self._woken)
        self.closed.set()
        self.notify()

    def listen(self) -> Listener:
        listener = Listener()
        self.listeners.add(listener)
        return listener

    def forget(self, listener: Listener) -> None:
        self.listeners.discard(listener)

    def notify(self) -> None:
        for listener in self.listeners:
            listener.wake()

    def _changed(self, _event: ApprovalRequested | ApprovalDecided) -> None:
        self.notify()

    def _woken(self, kinds: str) -> None:
        if "approval" in kinds.split(",") or kinds == "*":
            self.notify()
