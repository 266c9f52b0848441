"""This daemon's row in the store's ``instances``: written before anything takes work,
refreshed every beat, removed last. On a shared store a daemon holds its leases for as
long as its row is fresh, so the row outlives every part that may hold one."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from . import __version__
from .cluster import BEAT
from .logs import log_retrying
from .store import Store, Tx
from .store.meta import InstanceRow

log = logging.getLogger(__name__)

# How often the row is refreshed (`status` counts one unseen for three beats as gone:
# overview.INSTANCE_GONE_AFTER).
INSTANCE_BEAT = BEAT


def boot_id() -> str:
    """This machine's current boot and this process's pid namespace ('' where the kernel
    does not say): two daemons with the same one see each other's pids (containers on one
    host share the boot, not the pids)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pids = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{pids}"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class InstanceMembership:
    """Joins the list of live daemons at start, beats, and leaves it at stop."""

    def __init__(self, store: Store, *, label: str, started_at: float) -> None:
        self._store = store
        # The store's name for this process is what holds its leases; the label is what
        # people see ([bot] instance, else host-pid).
        self.name = store.instance or default_name()
        self.label = label
        self._started_at = started_at
        self._row: InstanceRow | None = None
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._store.run(self._join)
        self._beat = asyncio.create_task(self._beating(), name="instance-heartbeat")

    async def stop(self) -> None:
        """Leave: this daemon's leases are free at once (it is called after its turns
        and sends are done)."""
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        if self._row is not None:
            name = self._row.name
            await self._store.run(lambda tx: tx.meta.instance_gone(name))

    def _join(self, tx: Tx) -> None:
        boot = boot_id()
        for other in tx.meta.instances():
            # A daemon of this machine's current boot whose process is gone (killed,
            # crashed) gives up its leases at once, not after the lease time: a restart
            # goes on with its sessions without waiting.
            mine = boot and other.boot_id == boot and other.pid != os.getpid()
            if mine and not process_alive(other.pid):
                tx.meta.instance_gone(other.name)
        row = InstanceRow(
            name=self.name,
            label=self.label,
            host=socket.gethostname(),
            boot_id=boot,
            pid=os.getpid(),
            version=__version__,
            started_at=self._started_at,
            seen_at=time.time(),
        )
        tx.meta.instance_seen(row)
        tx.on_commit(lambda: setattr(self, "_row", row))

    async def _beating(self) -> None:
        while True:
            await asyncio.sleep(INSTANCE_BEAT)
            if self._row is None:
                continue
            seen = replace(self._row, seen_at=time.time())
            try:
                await self._store.run(partial(_seen, row=seen))
            except Exception:  # the store may be away for a while: next beat
                log_retrying(log, "refreshing this daemon's instance row failed")


def _seen(tx: Tx, row: InstanceRow) -> None:
    tx.meta.instance_seen(row)
