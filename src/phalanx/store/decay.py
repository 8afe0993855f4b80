"""A queue's decayed usage, rebuilt from the store's history: a LocalQueue's (admission fair
sharing) or a ClusterQueue's (decayed fair sharing).

A leader restores each queue's decayed usage from its status
(``fairSharing.admissionFairSharingStatus``). When a status has none — a LocalQueue migrated
from a Kueue without admission fair sharing, decayed fair sharing just turned on, or a status
lost — the leader rebuilds it here from the reservations the store holds in that queue
(a Workload's reservations elsewhere do not count): each reservation, held from its
``quota_reserved`` until what ended it (``quota_released``, ``finished``, ``deleted``; a later
reservation of the same Workload ends it at the eviction before it, or at itself) or until
``at`` if still open, contributes the decay kernel integrated exactly over that time
(``phalanx.admission.fair_usage.interval_consumed``)::

    consumed[r] = sum over reservations of
                  amount[r] x (0.5 ** ((at - end) / H) - 0.5 ** ((at - start) / H))

which is what Kueue's sampled recurrence gives for usage that is constant between samples.
Amounts are summed over flavors and pod sets per resource, in Kueue's units (CPU in cores).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from sqlalchemy import ColumnElement, Engine, and_, select

from phalanx.admission.fair_usage import interval_consumed, kueue_amount
from phalanx.store import events as ev
from phalanx.store.models import EventResource, WorkloadEvent

__all__ = ["cluster_queue_consumed", "local_queue_consumed"]

_ENDS = (ev.QUOTA_RELEASED, ev.FINISHED, ev.DELETED)


def local_queue_consumed(
    engine: Engine,
    *,
    namespace: str,
    local_queue: str,
    at: dt.datetime,
    half_life_seconds: float,
) -> dict[str, float]:
    """``consumedResources`` of LocalQueue ``namespace/local_queue`` at ``at`` (naive UTC)
    from its stored reservations; empty when the store holds none (or the half-life is 0)."""
    reserved_in = and_(
        WorkloadEvent.namespace == namespace, WorkloadEvent.local_queue == local_queue
    )
    return _consumed(engine, reserved_in, at=at, half_life_seconds=half_life_seconds)


def cluster_queue_consumed(
    engine: Engine, *, cluster_queue: str, at: dt.datetime, half_life_seconds: float
) -> dict[str, float]:
    """``consumedResources`` of ClusterQueue ``cluster_queue`` at ``at`` (naive UTC) from its
    stored reservations; empty when the store holds none (or the half-life is 0)."""
    reserved_in = WorkloadEvent.cluster_queue == cluster_queue
    return _consumed(engine, reserved_in, at=at, half_life_seconds=half_life_seconds)


def _consumed(
    engine: Engine,
    reserved_in: ColumnElement[bool],
    *,
    at: dt.datetime,
    half_life_seconds: float,
) -> dict[str, float]:
    """Decayed usage at ``at`` of the reservations matching ``reserved_in``."""
    if half_life_seconds <= 0:
        return {}
    # Events older than ~60 half-lives contribute less than 1e-18 of their amount.
    horizon = at - dt.timedelta(seconds=60 * half_life_seconds)
    uids = (
        select(WorkloadEvent.uid)
        .where(reserved_in, WorkloadEvent.transition == ev.QUOTA_RESERVED)
        .distinct()
    )
    with engine.connect() as connection:
        rows = connection.execute(
            select(WorkloadEvent.id, WorkloadEvent.uid, WorkloadEvent.transition, WorkloadEvent.at)
            .where(WorkloadEvent.uid.in_(uids), WorkloadEvent.at <= at)
            .order_by(WorkloadEvent.uid, WorkloadEvent.at, WorkloadEvent.id)
        ).all()
        held: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for event_id, resource, amount in connection.execute(
            select(EventResource.event_id, EventResource.resource, EventResource.amount)
            .join(WorkloadEvent, WorkloadEvent.id == EventResource.event_id)
            .where(
                WorkloadEvent.uid.in_(uids),
                reserved_in,
                WorkloadEvent.transition == ev.QUOTA_RESERVED,
                WorkloadEvent.at <= at,
            )
        ):
            held[event_id][resource] += kueue_amount(resource, amount)
    half_life_ms = half_life_seconds * 1000
    at_ms = _ms(at, at)
    consumed: dict[str, float] = defaultdict(float)

    def add(reservation: int, start: dt.datetime, end: dt.datetime) -> None:
        if end <= horizon:
            return
        for resource, amount in held.get(reservation, {}).items():
            consumed[resource] += interval_consumed(
                amount, _ms(start, at), _ms(end, at), at_ms, half_life_ms
            )

    open_: tuple[int, dt.datetime] | None = None
    evicted_at: dt.datetime | None = None
    uid = None
    for event_id, row_uid, transition, when in rows:
        if row_uid != uid:
            if open_ is not None:
                add(open_[0], open_[1], at)
            uid, open_, evicted_at = row_uid, None, None
        if transition == ev.QUOTA_RESERVED:
            if open_ is not None:
                add(open_[0], open_[1], evicted_at or when)
            open_, evicted_at = (event_id, when), None
        elif transition == ev.EVICTED and open_ is not None:
            evicted_at = when
        elif transition in _ENDS and open_ is not None:
            add(open_[0], open_[1], when)
            open_, evicted_at = None, None
    if open_ is not None:
        add(open_[0], open_[1], at)
    return {r: v for r, v in sorted(consumed.items()) if v}


def _ms(when: dt.datetime, at: dt.datetime) -> float:
    """Milliseconds relative to a fixed origin (only differences matter)."""
    return (when - at).total_seconds() * 1000
