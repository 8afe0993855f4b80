"""A usage budget's resource-hours in its current window, read back from the store.

At a leader's start the usage each budget counted so far in its window is rebuilt from the
reservation intervals (``workload_reservations``, :mod:`phalanx.store.intervals`): every
reservation of the budget's scope overlapping ``[since, at)`` counts what it held of the
budget's resource (flavors summed, Kueue units: CPU in cores) times its time inside that
range; one still open, or ended by an event the store has at or after ``at``, up to ``at``.
These are the usage report's overlap rules (:mod:`phalanx.store.report`), for one scope.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from phalanx.admission.fair_usage import kueue_amount

__all__ = ["used_resource_hours"]

_US_PER_HOUR = 3_600_000_000

_HELD = """
SELECT r.start_us, r.end_us, r.closed_us, x.amount
FROM workload_reservations r
JOIN workload_reservation_resources x ON x.reservation_id = r.id
WHERE r.closed_us > :since AND r.start_us < :until
  AND (r.stray_until_us IS NULL OR r.stray_until_us >= :since)
  AND x.resource = :resource AND {scope}"""
_LOCAL_QUEUE = "r.namespace = :namespace AND r.local_queue = :local_queue"
_CLUSTER_QUEUE = "r.cluster_queue = :cluster_queue"


def used_resource_hours(
    engine: Engine,
    *,
    resource: str,
    since_us: int,
    at_us: int,
    local_queue: str | None = None,
    cluster_queue: str | None = None,
) -> float:
    """Resource-hours of ``resource`` held in ``[since_us, at_us)`` (microseconds since the
    epoch) by LocalQueue ``local_queue`` (``namespace/name``) or ClusterQueue
    ``cluster_queue``: exactly one of them."""
    if (local_queue is None) == (cluster_queue is None):
        raise ValueError("give exactly one of local_queue or cluster_queue")
    params: dict[str, object] = {"since": since_us, "until": at_us, "resource": resource}
    if local_queue is not None:
        params["namespace"], _, params["local_queue"] = local_queue.partition("/")
        statement = text(_HELD.format(scope=_LOCAL_QUEUE))
    else:
        params["cluster_queue"] = cluster_queue
        statement = text(_HELD.format(scope=_CLUSTER_QUEUE))
    total = 0
    with engine.connect() as connection:
        for start, end, closed, amount in connection.execute(statement, params):
            until = end if closed < at_us and end is not None else at_us
            held = min(until, at_us) - max(start, since_us)
            if held > 0:
                total += amount * held
    return kueue_amount(resource, total) / _US_PER_HOUR
