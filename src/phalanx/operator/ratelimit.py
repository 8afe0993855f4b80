"""A token bucket: ``burst`` tokens, refilled at ``rate`` per second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``take()`` is True while a token is left; tokens come back at ``rate`` per second up to
    ``burst``. A ``rate`` of 0 means no limit (every ``take()`` is True)."""

    def __init__(
        self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate >= 0 and burst >= 1, not {rate}/{burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        if self.rate == 0:
            return True
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def delay(self) -> float:
        """Seconds until ``take()`` can be True (0: now)."""
        if self.rate == 0:
            return 0.0
        tokens = min(float(self.burst), self._tokens + (self._clock() - self._at) * self.rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    async def acquire(self) -> None:
        """Wait for a token and take it."""
        while not self.take():
            await asyncio.sleep(self.delay())
