"""A channel's connection to its peer, kept by the host: its state as /healthz shows
it, the waits between tries, and the one difference the owner needs told — *fix your
config* or *the peer is away*.

A channel reports what it sees (``connected``, ``reconnecting``, ``refused``) to the
``Link`` the host made for it (``ChannelHost.link``), which logs each change once and
is what /healthz and the delivery worker read. A channel that declares
``Capabilities.connects`` leaves its first contact to the host: the host calls its
``connect()`` after ``start()``, and

- ``ConfigError`` at the first try fails the start: ``run`` exits 2 with that line;
- ``PeerAway`` (or no answer in ``CONNECT_TIMEOUT``) leaves the daemon running, the
  channel "degraded", and ``connect()`` tried again with a ``Backoff`` until it
  succeeds (a ``ConfigError`` then leaves the channel "down", said once);

so a new channel cannot turn a peer's outage into a dead daemon, nor a refused token
into endless retries. A channel that receives by asking (a poll, a sync) runs its loop
through ``Link.receive``: one daemon of those sharing a store at a time, resumed from
the stored position, the peer away ridden out, a bug logged and the loop going on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import ConfigError, PeerAway

CONNECT_TIMEOUT = 30.0  # seconds the first contact with a peer may take
STANDBY_CHECK = 1.0  # seconds between looks at a receiving lease another daemon holds
OK, DEGRADED, DOWN, STARTING = "ok", "degraded", "down", "starting"


class Backoff:
    """The waits between tries at a peer that cannot be reached: doubling from ``first``
    to ``cap`` seconds, each a random 75-100 % of that (jitter), so that daemons which
    lost the same server do not all come back to it in step. ``reset`` after a success."""

    def __init__(self, first: float = 1.0, cap: float = 60.0) -> None:
        self.first, self.cap = first, cap
        self._next = first

    def reset(self) -> None:
        self._next = self.first

    def next(self) -> float:
        wait = self._next * random.uniform(0.75, 1.0)
        self._next = min(self._next * 2, self.cap)
        return wait

    async def wait(self) -> None:
        await asyncio.sleep(self.next())


class Link:
    """One channel's connection as the host keeps it. ``facts`` are the channel's own
    lines for /healthz (its mode, its bot, a counter); a falsy fact is not shown.

    A connection may have parts that come and go apart (Slack's Web API and its socket):
    each reports under its own ``part``, and the link is "ok" once no part is away."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.status = STARTING
        self.error: str | None = None
        self.facts: dict[str, object] = {}
        # Whether the first contact made makes it "ok"; False: the channel says so itself
        # later (Matrix, once its first sync is in: before, its sends may not encrypt).
        self.ok_after_connect = True
        self.connect_timeout = CONNECT_TIMEOUT
        self.backoff = Backoff()
        self._away: dict[str, str] = {}
        self._log = logging.getLogger("channels").getChild(channel)  # as its own log
        self._retrying: asyncio.Task[None] | None = None
        self._standby: bool | None = None  # another daemon does the work (None: not asked)

    def connected(self, part: str = "peer") -> None:
        """``part`` reaches the peer (again)."""
        self._away.pop(part, None)
        self.backoff.reset()
        if self._away:
            self.status, self.error = DEGRADED, next(iter(self._away.values()))
            return
        if self.status == DEGRADED:
            self._log.info("%s: connected again", self.channel)
        self.status, self.error = OK, None

    def back(self, part: str) -> None:
        """``part`` reached the peer again: as ``connected`` when it was away, nothing
        when it was not (a call that worked says nothing of a link still starting)."""
        if part in self._away:
            self.connected(part)

    def reconnecting(self, error: str, part: str = "peer") -> None:
        """``part`` cannot reach the peer now; it is tried again. Logged once until the
        error changes."""
        self._away[part] = error
        if self.status != DEGRADED or self.error != error:
            self._log.warning("%s: %s (retrying)", self.channel, error)
        self.status, self.error = DEGRADED, error

    def refused(self, error: str) -> None:
        """The peer refused what the owner must fix (a token): down until a restart."""
        if self.status != DOWN or self.error != error:
            self._log.error("%s: %s; fix it and restart", self.channel, error)
        self.status, self.error = DOWN, error

    async def pause(self) -> None:
        """Wait before the next try at the peer: 1 s doubling to 60 s, jittered, back to
        the shortest once ``connected``."""
        await self.backoff.wait()

    def count(self, fact: str) -> None:
        """One more of ``fact`` (a rate limit waited out)."""
        self.facts[fact] = int(self.facts.get(fact) or 0) + 1  # type: ignore[call-overload]

    def state(self) -> dict[str, object]:
        """What /healthz shows of the channel, and what delivery reads ("ok" or not)."""
        state: dict[str, object] = {"status": self.status}
        state.update((key, value) for key, value in self.facts.items() if value)
        if self.error:
            state["error"] = self.error
        return state

    async def takes_turn(self, hold: Awaitable[bool], doing: str, now: str, elsewhere: str) -> bool:
        """Whether this daemon does the channel's one-at-a-time work now (its poll, its
        sync), with several daemons on one store: ``hold`` asks the store's lease
        (``ChannelHost.hold``). A change is said once (``now`` / ``elsewhere``); a
        daemon standing by is "ok", its /healthz saying another daemon does ``doing``;
        the store away is ``reconnecting`` (nobody could store what comes in anyway)."""
        try:
            mine = await hold
        except Exception as exc:
            self.reconnecting(f"cannot tell whether to {doing}: {exc}")
            return False
        if self._standby is None or mine == self._standby:  # the first answer, or a change
            self._log.info("%s: %s", self.channel, now if mine else elsewhere)
        self._standby = not mine
        self.facts[doing] = None if mine else "another daemon"
        if not mine:
            self.connected()
        return mine

    async def receive(
        self,
        once: Callable[[], Awaitable[Any]],
        *,
        resume: Callable[[], Awaitable[Any]],
        turn: Callable[[], Awaitable[bool]] | None = None,
        away: tuple[type[BaseException], ...] = (),
        peer: str = "the peer",
    ) -> None:
        """The channel's receiving loop, for as long as it runs: ``once`` a round (one
        poll, one sync), after ``resume`` (from the position the last receiver stored)
        at the start and after standing by. ``turn`` (several daemons on one store:
        whether this one receives now, ``takes_turn``) is looked at before each round,
        every STANDBY_CHECK while it says no. An error in ``away`` is the peer out of
        reach: said, then a pause; any other is a bug: logged, said, paused, and the
        loop goes on (a channel's bug never ends its receiving)."""
        fresh = True
        while True:
            try:
                if turn is not None and not await turn():
                    fresh = True  # another daemon receives: its position will be stored
                    await asyncio.sleep(STANDBY_CHECK)
                    continue
                if fresh:
                    await resume()
                    fresh = False
                await once()
            except away as exc:
                self.reconnecting(f"cannot reach {peer}: {exc}")
                await self.pause()
            except Exception as exc:
                self._log.exception("%s: receiving failed; going on", self.channel)
                self.reconnecting(f"receiving failed: {exc}")
                fresh = True
                await self.pause()

    async def first_contact(self, connect: Callable[[], Awaitable[Any]]) -> None:
        """``connect`` once now; on ``PeerAway`` (or no answer in time), again in the
        background until it succeeds. A ``ConfigError`` now is raised (the start fails);
        one later leaves the link down; anything else later is logged and tried again."""
        try:
            await self._bounded(connect)
        except PeerAway as exc:
            self.reconnecting(str(exc))
            self._retrying = asyncio.create_task(self._again(connect))
            return
        self._made()

    async def _again(self, connect: Callable[[], Awaitable[Any]]) -> None:
        while True:
            await self.backoff.wait()
            try:
                await self._bounded(connect)
            except ConfigError as exc:
                self.refused(str(exc))
                return
            except PeerAway as exc:
                self.reconnecting(str(exc))
                continue
            except Exception as exc:  # the channel's bug: logged, tried again, never left dead
                self._log.exception("%s: connecting failed", self.channel)
                self.reconnecting(f"connecting failed: {exc!r}")
                continue
            self._made()
            return

    def _made(self) -> None:
        if self.ok_after_connect:
            self.connected()
        else:
            self.backoff.reset()

    async def close(self) -> None:
        """Stop trying (the channel stops)."""
        if self._retrying is not None:
            self._retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrying

    async def _bounded(self, connect: Callable[[], Awaitable[Any]]) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout):
                await connect()
        except TimeoutError:
            raise PeerAway(f"no answer in {self.connect_timeout:g} s") from None
