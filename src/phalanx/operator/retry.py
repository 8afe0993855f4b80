"""One retry scheme for every API path of the operator.

Every long-running writer (status writes, evictions, Job reconciles, the gate remover, queue
status) and every reader (the informers) backs off the same way when the API server is away,
and classifies a failed write the same way (``kube.outcome_unknown``): a definite *no* is a
failure; a transport failure, a 5xx or an unreadable answer may have landed and is read back
before anything is forgotten or repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.operator.kube import TRANSIENT_ERRORS, outcome_unknown

__all__ = ["TRANSIENT_ERRORS", "Backoff", "outcome_unknown"]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff, capped; a server's ``Retry-After`` wins when it asks for longer.

    ``delay(0)`` is ``initial``; each further attempt doubles it (``factor``) up to
    ``maximum``. The defaults are controller-runtime's rate limiter's shape with a smaller cap:
    0.5 s doubling to 30 s."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        computed = min(self.maximum, self.initial * self.factor ** max(0, attempt))
        if retry_after is not None:
            return max(computed, min(retry_after, self.maximum))
        return computed
