"""The token bucket the fake servers count a network's rate limits with: an
implementation of their own, apart from the channels' pacers they check."""

from __future__ import annotations

import time


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.capacity = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def wait(self, now: float) -> float:
        """Seconds until one token is available (0 if one is available now)."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self) -> None:
        self.tokens -= 1
