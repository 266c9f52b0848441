"""How fast a channel sends, for every network alike: a budget per key (a chat; on Slack
a method in a conversation) and, where the network counts an account's sends together,
one for the account. Each budget is kept a little under the network's rate (``SLACK``):
networks count when a send arrives, not when it left, and a send that leaves on time can
arrive early next to the one before (a slower first request, a busy loop); their
buckets then fill a little faster than they are drained, which absorbs such jitter.

Real messages wait for their turn (``reserve`` / ``wait``). What may be left out —
a reply's preview, a typing indicator — goes only from spare budget (``spare``): one
send of the key's own and half the account's burst are always left for real messages,
it is never waited for, and nothing goes while a refusal holds the key.

A refusal ("too many requests", ``echo_bot.rate_limits``) holds the key for the wait it
asked for (``hold``), and the account too where there is one. A network whose account
limit is not published (Matrix: a homeserver's own ``rc_message``) learns it
(``learns``): after a refusal the account's sends are spaced by the wait it asked for,
grown at each further refusal and shrunk a little at each send (``sent``), so a long
burst meets the limit a few times instead of at every send past the allowance; the
spacing is dropped once the account has sent nothing for QUIET seconds (its allowance
has grown back by then).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

Rate = tuple[float, float]  # (sends a second, burst)

SLACK = 0.05  # kept under each rate
MAX_KEYS = 10_000  # budgets of idle keys are forgotten past this many
GROW, SHRINK = 1.5, 0.97  # a learned spacing after a further refusal, after a send
QUIET = 60.0  # seconds without a send after which a learned spacing is dropped


class TokenBucket:
    """A rate with a burst: ``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.clock = clock
        self.updated = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def delay(self) -> float:
        """Take one token; return how long to wait before using it."""
        self._refill()
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def wait_for_spare(self, reserve: float) -> float:
        """Seconds until one token is spare above ``reserve`` (0.0: now); takes none."""
        self._refill()
        if self.tokens - 1 >= reserve:
            return 0.0
        return (reserve + 1 - self.tokens) / self.rate

    def take(self) -> None:
        self._refill()
        self.tokens -= 1


class Pacer:
    """``rate``: a key's budget (or, given a key, its budget); ``overall``: the
    account's, when the network publishes one; ``learns``: the account's spacing is
    learned from refusals, up to that many seconds; ``keep``: sends of a key's budget
    left for real messages by ``spare``."""

    def __init__(
        self,
        rate: Rate | Callable[[str], Rate],
        *,
        overall: Rate | None = None,
        learns: float = 0.0,
        keep: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = rate if callable(rate) else (lambda key: rate)
        self._keys: dict[str, TokenBucket] = {}
        self._held: dict[str, float] = {}  # key → the clock's time it is free
        self._overall: TokenBucket | None = None
        self._overall_keep = 0.0
        if overall is not None:
            self._overall = TokenBucket(overall[0] / (1 + SLACK), overall[1], clock)
            self._overall_keep = overall[1] / 2
        self._account_held = 0.0
        self._keep = keep
        self._learns = learns
        self._spacing = 0.0  # seconds between two sends of the account, as last learned
        self._next_any = 0.0  # the account's next free slot, while spaced
        self._last_send = -QUIET
        self.clock = clock

    def _bucket(self, key: str) -> TokenBucket:
        bucket = self._keys.get(key)
        if bucket is None:
            if len(self._keys) >= MAX_KEYS:  # forget idle keys
                self._keys.clear()
            rate, burst = self._rate(key)
            bucket = self._keys[key] = TokenBucket(rate / (1 + SLACK), burst, self.clock)
        return bucket

    def _held_for(self, key: str | None, now: float) -> float:
        until = self._held.get(key, 0.0) if key is not None else 0.0
        return max(until, self._account_held) - now

    def _quiet(self, now: float) -> None:
        if self._spacing and now - self._last_send > QUIET:
            self._spacing = 0.0

    def reserve(self, key: str) -> float:
        """Count one send to ``key``; the seconds to wait before making it."""
        now = self.clock()
        self._quiet(now)
        delay = max(self._bucket(key).delay(), self._held_for(key, now))
        if self._overall is not None:
            delay = max(delay, self._overall.delay())
        if self._spacing:
            slot = max(self._next_any, now)  # taken before waiting: keys do not share it
            self._next_any = slot + self._spacing
            delay = max(delay, slot - now)
        self._last_send = now + delay
        return delay

    async def wait(self, key: str) -> None:
        delay = self.reserve(key)
        if delay > 0:
            await asyncio.sleep(delay)

    def spare(self, key: str | None) -> float:
        """Count one send to ``key`` (None: the account's budget alone, as a typing
        indicator takes) only from spare budget: 0.0 when counted, else the seconds
        until there may be some (nothing is counted then)."""
        now = self.clock()
        self._quiet(now)
        wait = self._held_for(key, now)
        if self._spacing:  # refused lately: the account has none to spare
            wait = max(wait, self._next_any - now, self._spacing)
        bucket = self._bucket(key) if key is not None else None
        if bucket is not None:
            wait = max(wait, bucket.wait_for_spare(self._keep))
        if self._overall is not None:
            wait = max(wait, self._overall.wait_for_spare(self._overall_keep))
        if wait > 0:
            return wait
        for taken in (bucket, self._overall):
            if taken is not None:
                taken.take()
        self._last_send = now
        return 0.0

    def hold(self, key: str, seconds: float) -> None:
        """The network refused a send to ``key`` for ``seconds``: the key waits, and the
        account where the network counts one (learning its spacing, if it learns)."""
        until = self.clock() + seconds
        if len(self._held) >= MAX_KEYS:  # forget the holds long over
            self._held = {k: t for k, t in self._held.items() if t > until - seconds}
        self._held[key] = max(self._held.get(key, 0.0), until)
        if self._overall is None and not self._learns:
            return
        self._account_held = max(self._account_held, until)
        if self._learns:
            self._next_any = max(self._next_any, until)
            self._last_send = until - seconds  # a send tried: the account is not quiet
            # Refused while spaced already: the spacing was too short (the wait asked
            # for is only until one more send is allowed, not the allowance's rate).
            grown = self._spacing * GROW if self._spacing else seconds
            self._spacing = min(max(grown, seconds), self._learns)

    def sent(self) -> None:
        """A send went through: a learned spacing shrinks a little, towards the
        allowance."""
        self._spacing *= SHRINK
