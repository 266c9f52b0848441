"""The systemd notify protocol, spoken directly (a datagram to ``$NOTIFY_SOCKET``).

READY=1 once the store is open and the channels have started, STATUS= lines, WATCHDOG=1
at half of ``$WATCHDOG_USEC`` from the event loop itself (a blocked loop stops the
pings, and systemd restarts the daemon), STOPPING=1 on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = "\0" + address[1:]  # abstract namespace
        elif address.startswith("/"):
            self._address = address
        self._socket: socket.socket | None = None
        if self._address is not None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.setblocking(False)
        usec = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        mine = not watchdog_pid or watchdog_pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 2_000_000 if usec.isdigit() and mine else None
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def send(self, *lines: str) -> None:
        if self._socket is None or self._address is None:
            return
        try:
            self._socket.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:  # systemd gone or socket full: never fatal
            log.debug("notify failed: %s", exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self) -> None:
        if self._task is not None:
            self._task.cancel()  # no ping may follow STOPPING=1
        self.send("STOPPING=1", "STATUS=stopping")

    def start_watchdog(self) -> None:
        if self.watchdog_interval and self._socket is not None:
            self._task = asyncio.create_task(self._watchdog(self.watchdog_interval))

    async def _watchdog(self, interval: float) -> None:
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close()
            self._socket = None
