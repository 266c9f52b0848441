"""No process a shell_exec call starts outlives the call (Linux; elsewhere: its session).

A child that calls ``setsid`` (or double-forks into a new session) leaves the call's
process group, so killing the group is not enough. Two things close that gap:

- **The daemon is a child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``, set the first
  time a call starts). A process whose parent exits is then re-parented to the daemon
  instead of init, so everything a call starts keeps the daemon as an ancestor.
- **After every call, a sweep** reads ``/proc`` and stops (SIGSTOP), SIGKILLs, then
  reaps, the call's processes until none is left: every process in the call's session
  (its session id is the call's pid), every descendant of the call's pid, every child of
  the daemon that appeared during the call (not there before it started) and is neither
  a running call's own program, nor in the daemon's session, nor in another running
  call's session, and every descendant of those. Spawning and sweeping take turns (one
  lock per event loop), so a sweep never mistakes another call's fresh program for an
  orphan. A kill goes through a pidfd after checking the process's start time, so a
  recycled pid is never hit.

Without ``/proc`` or the subreaper (other systems), only the session is swept: there a
child that calls ``setsid`` and whose parent exits escapes to init.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
import weakref
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
_HAVE_PROC = os.path.isdir("/proc/self")
_SWEEP_SECONDS = 5.0

# Pids of the programs of calls that are running now (asyncio waits for those).
_LEADERS: set[int] = set()
_GUARDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process a child subreaper (once). False where that is not possible."""
    global _subreaper
    if _subreaper is None:
        _subreaper = False
        if sys.platform.startswith("linux"):
            import ctypes  # only here: most daemons never start a shell call

            try:
                libc = ctypes.CDLL(None, use_errno=True)
                arg = ctypes.c_ulong
                status = libc.prctl(PR_SET_CHILD_SUBREAPER, arg(1), arg(0), arg(0), arg(0))
                _subreaper = status == 0
            except (OSError, AttributeError):
                pass
        if not _subreaper:
            log.warning("shell_exec: cannot become a child subreaper; only sessions are swept")
    return _subreaper


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    start: int  # clock ticks after boot: with the pid, the identity of a process
    state: str

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X", "x")


def _read_stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain anything, even ")": split after the last.
    fields = raw.rsplit(")", 1)[-1].split()
    try:
        return Proc(pid, int(fields[1]), int(fields[3]), int(fields[19]), fields[0])
    except (IndexError, ValueError):
        return None


def process_table() -> dict[int, Proc]:
    """Every process this user can see in /proc (empty where there is no /proc)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    table = {}
    for name in names:
        if name.isdigit() and (proc := _read_stat(int(name))) is not None:
            table[proc.pid] = proc
    return table


def children_of_us() -> frozenset[tuple[int, int]]:
    me = os.getpid()
    return frozenset((p.pid, p.start) for p in process_table().values() if p.ppid == me)


def _descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def call_processes(
    table: dict[int, Proc],
    leader: int,
    before: frozenset[tuple[int, int]],
    others: frozenset[int],
) -> list[Proc]:
    """The processes of the call whose program had pid ``leader`` (not the program)."""
    me, my_sid = os.getpid(), os.getsid(0)
    roots = {leader}
    for proc in table.values():
        if proc.sid == leader:
            roots.add(proc.pid)
        elif (
            proc.ppid == me
            and (proc.pid, proc.start) not in before
            and proc.pid not in others
            and proc.sid not in others
            and proc.sid != my_sid
        ):
            roots.add(proc.pid)  # an orphan of this call, re-parented to us
    members = (roots | _descendants(table, roots)) - {leader, me} - others
    return [table[pid] for pid in members if pid in table]


def _signal(proc: Proc, signum: signal.Signals) -> None:
    """Send ``signum`` to ``proc`` unless its pid now names another process."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd here: the start-time check must do
        current = _read_stat(proc.pid)
        if current is not None and current.start == proc.start:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signum)
        return
    try:
        current = _read_stat(proc.pid)
        if current is not None and current.start == proc.start:
            with suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, signum)
    finally:
        os.close(fd)


def _reap(pid: int) -> None:
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def sweep(leader: int, before: frozenset[tuple[int, int]], others: frozenset[int]) -> int:
    """Kill and reap every process of the call until none is left; how many were found."""
    me = os.getpid()
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + _SWEEP_SECONDS
    while True:
        procs = call_processes(process_table(), leader, before, others)
        seen.update((p.pid, p.start) for p in procs)
        live = [p for p in procs if not p.dead]
        ours = [p for p in procs if p.dead and p.ppid == me]
        if not live and not ours:  # what is left is a zombie someone else reaps
            return len(seen)
        # Stopped all first, then killed: killed one by one, a process saw another die
        # and went on before its own SIGKILL came (a setsid shell's `wait; touch
        # marker` touched it, on a loaded machine). A stopped process runs nothing.
        for proc in live:
            _signal(proc, signal.SIGSTOP)
        for proc in live:
            _signal(proc, signal.SIGKILL)
        for proc in ours:
            _reap(proc.pid)
        if time.monotonic() > deadline:
            log.warning("shell_exec: %d processes of pid %d survived the sweep", len(live), leader)
            return len(seen)
        time.sleep(0.01)


def _guard() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    guard = _GUARDS.get(loop)
    if guard is None:
        guard = _GUARDS[loop] = asyncio.Lock()
    return guard


class CallProcesses:
    """Start one call's program and, at the end, take down everything it started."""

    def __init__(self) -> None:
        self.leader: int | None = None
        self._before: frozenset[tuple[int, int]] = frozenset()

    async def start(self, *argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
        become_subreaper()
        async with _guard():
            self._before = await asyncio.to_thread(children_of_us)
            proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True, **kwargs)
            self.leader = proc.pid
            _LEADERS.add(proc.pid)
        return proc

    async def sweep(self, *, final: bool = False) -> int:
        """Kill and reap the call's processes (not its program); how many there were.

        ``final`` once the program has been reaped: the call is then over.
        """
        leader = self.leader
        if leader is None:
            return 0
        if not _HAVE_PROC:  # other systems: what is left of the call's session
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)
        try:
            async with _guard():
                others = frozenset(_LEADERS - {leader})
                return await asyncio.to_thread(sweep, leader, self._before, others)
        finally:
            if final:
                _LEADERS.discard(leader)
                self.leader = None
