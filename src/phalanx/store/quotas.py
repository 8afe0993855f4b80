"""ClusterQueue quotas over time: what the usage report compares usage with.

The writer records a *version* of a ClusterQueue's quotas for every spec generation it sees
(``metadata.generation`` grows with every spec change) and one at its deletion; each holds
from its time to the next version of the same ClusterQueue name. Versions are keyed by
(UID, generation, deleted), so a relist, a restart or a new leader writes nothing twice. A
generation's time is the ClusterQueue's creation for its first one, else when the writer first
saw it: a change made while no leader ran dates from the next leader's start (it has no other
time: the API keeps none for a spec change).

:func:`quota_use` then says, per ClusterQueue and resource over a window, how much quota it
had (nominal x time), how much of it was used and how much it used beyond it (borrowed),
from the reservation intervals (:mod:`phalanx.store.intervals`).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select, text, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from phalanx.quotas.quantity import QuantityError, parse_quantity
from phalanx.store import intervals
from phalanx.store.models import QuotaAmount, QuotaVersion

__all__ = [
    "QuotaSnapshot",
    "QuotaUse",
    "created_at",
    "live_queues",
    "quota_use",
    "snapshot_of",
    "write_snapshots",
]

Amount = tuple[str, str, int, int | None, int | None]
"""(flavor, resource, nominal, borrowingLimit, lendingLimit) in the resource's base unit."""
_Key = tuple[str, int, bool]


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    """One version of a ClusterQueue's quotas (see the module docstring)."""

    uid: str
    generation: int
    deleted: bool
    cluster_queue: str
    cohort: str | None
    at: dt.datetime
    """Naive UTC."""
    amounts: tuple[Amount, ...] = ()

    @property
    def key(self) -> _Key:
        return (self.uid, self.generation, self.deleted)


def _utc(text_: str) -> dt.datetime | None:
    try:
        parsed = dt.datetime.fromisoformat(text_.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(dt.UTC).replace(tzinfo=None)


def created_at(cq: Mapping[str, Any]) -> dt.datetime | None:
    """A ClusterQueue's ``creationTimestamp``, naive UTC (None if absent or unreadable)."""
    return _utc(str((cq.get("metadata") or {}).get("creationTimestamp") or ""))


def _quantity(value: Any, resource: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_quantity(value, resource=resource)
    except (QuantityError, TypeError, ValueError):
        return None


def snapshot_of(
    cq: Mapping[str, Any], *, seen_at: dt.datetime, deleted: bool = False
) -> QuotaSnapshot | None:
    """The version a ClusterQueue object stands for, seen at ``seen_at`` (naive UTC); None
    without a UID. A quantity that does not parse (the webhook refuses those) is left out
    rather than stopping the feed."""
    metadata = cq.get("metadata") or {}
    uid = metadata.get("uid")
    if not uid:
        return None
    generation = int(metadata.get("generation") or 1)
    at = seen_at
    if generation == 1 and not deleted:
        at = created_at(cq) or seen_at
    spec = cq.get("spec") or {}
    amounts: list[Amount] = []
    if not deleted:
        for group in spec.get("resourceGroups") or ():
            for flavor in group.get("flavors") or ():
                for res in flavor.get("resources") or ():
                    name = str(res.get("name") or "")
                    nominal = _quantity(res.get("nominalQuota", 0), name)
                    if not name or nominal is None:
                        continue
                    amounts.append(
                        (
                            str(flavor.get("name") or ""),
                            name,
                            nominal,
                            _quantity(res.get("borrowingLimit"), name),
                            _quantity(res.get("lendingLimit"), name),
                        )
                    )
    return QuotaSnapshot(
        uid=str(uid),
        generation=generation,
        deleted=deleted,
        cluster_queue=str(metadata.get("name") or ""),
        cohort=spec.get("cohortName") or spec.get("cohort") or None,
        at=at,
        amounts=tuple(sorted(amounts)),
    )


def write_snapshots(engine: Engine, snapshots: Sequence[QuotaSnapshot]) -> int:
    """Insert the versions not yet stored, in one transaction; return how many were new. A
    concurrent writer inserting the same key in between makes the batch fail on the unique
    key; it is then written one version at a time, each skipping what is there."""
    unique = list({s.key: s for s in snapshots}.values())
    if not unique:
        return 0
    try:
        with Session(engine) as session, session.begin():
            return _insert_missing(session, unique)
    except IntegrityError:
        written = 0
        for one in unique:
            try:
                with Session(engine) as session, session.begin():
                    written += _insert_missing(session, [one])
            except IntegrityError:
                continue
        return written


def _insert_missing(session: Session, snapshots: Sequence[QuotaSnapshot]) -> int:
    keys = [s.key for s in snapshots]
    present: set[_Key] = set()
    for start in range(0, len(keys), 300):
        rows = session.execute(
            select(QuotaVersion.uid, QuotaVersion.generation, QuotaVersion.deleted).where(
                tuple_(QuotaVersion.uid, QuotaVersion.generation, QuotaVersion.deleted).in_(
                    keys[start : start + 300]
                )
            )
        )
        present.update((uid, int(gen), bool(deleted)) for uid, gen, deleted in rows)
    new = [s for s in snapshots if s.key not in present]
    for snap in new:
        version = QuotaVersion(
            uid=snap.uid,
            generation=snap.generation,
            deleted=snap.deleted,
            cluster_queue=snap.cluster_queue,
            cohort=snap.cohort,
            at_us=intervals.micros(snap.at),
        )
        session.add(version)
        session.flush()
        for flavor, resource, nominal, borrowing, lending in snap.amounts:
            session.add(
                QuotaAmount(
                    version_id=version.id,
                    flavor=flavor,
                    resource=resource,
                    nominal=nominal,
                    borrowing_limit=borrowing,
                    lending_limit=lending,
                )
            )
    return len(new)


def live_queues(engine: Engine) -> list[tuple[str, str, int]]:
    """(UID, name, latest generation) of every ClusterQueue whose deletion is not stored."""
    with Session(engine) as session:
        rows = session.execute(
            select(
                QuotaVersion.uid,
                QuotaVersion.cluster_queue,
                QuotaVersion.generation,
                QuotaVersion.deleted,
            )
        ).all()
    deleted = {uid for uid, _, _, gone in rows if gone}
    latest: dict[str, tuple[str, int]] = {}
    for uid, name, generation, _ in rows:
        if uid not in deleted and (uid not in latest or generation > latest[uid][1]):
            latest[uid] = (str(name), int(generation))
    return [(uid, name, gen) for uid, (name, gen) in sorted(latest.items())]


@dataclass
class QuotaUse:
    """One ClusterQueue's quota and its use of one resource over a window, in base units x
    seconds, summed over flavors. Only the time its quota is known (from its first stored
    version on) counts in any of the three."""

    quota: float = 0.0
    used: float = 0.0
    borrowed: float = 0.0
    """Usage beyond the nominal quota, per flavor, integrated over time."""

    @property
    def used_share(self) -> float | None:
        """``used / quota``; None without quota."""
        return self.used / self.quota if self.quota > 0 else None


_HELD = """
SELECT r.cluster_queue, x.flavor, x.resource, r.a, r.b, x.amount
FROM (
  SELECT r.id, r.cluster_queue,
    CASE WHEN r.start_us > :since THEN r.start_us ELSE :since END AS a,
    CASE WHEN r.closed_us < :until THEN r.end_us ELSE :until END AS b
  FROM workload_reservations r
  WHERE r.cluster_queue IS NOT NULL AND {overlapping}
) r
JOIN workload_reservation_resources x ON x.reservation_id = r.id
WHERE r.b > r.a"""


def quota_use(
    engine: Engine, *, since: dt.datetime, until: dt.datetime, overlapping: str
) -> dict[str, dict[str, QuotaUse]]:
    """ClusterQueue -> resource -> :class:`QuotaUse` over ``[since, until)`` (naive UTC).

    ``overlapping`` is the report's SQL condition selecting the reservations ``r`` that may
    overlap the window. Per ClusterQueue name, flavor and resource it sweeps the reservations'
    clipped intervals together with the quota versions' steps."""
    lo, hi = intervals.micros(since), intervals.micros(until)
    held: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    steps: dict[str, list[tuple[int, dict[tuple[str, str], int]]]] = defaultdict(list)
    with engine.connect() as connection:
        statement = text(_HELD.format(overlapping=overlapping))
        for cq, flavor, resource, a, b, amount in connection.execute(
            statement, {"since": lo, "until": hi}
        ):
            events = held[(str(cq), str(flavor), str(resource))]
            events.append((int(a), int(amount)))
            events.append((int(b), -int(amount)))
        versions = connection.execute(
            select(
                QuotaVersion.id,
                QuotaVersion.cluster_queue,
                QuotaVersion.at_us,
                QuotaAmount.flavor,
                QuotaAmount.resource,
                QuotaAmount.nominal,
            )
            .outerjoin(QuotaAmount, QuotaAmount.version_id == QuotaVersion.id)
            .where(QuotaVersion.at_us < hi)
            .order_by(QuotaVersion.cluster_queue, QuotaVersion.at_us, QuotaVersion.id)
        )
        last_id: int | None = None
        for vid, cq, at_us, flavor, resource, nominal in versions:
            if vid != last_id:
                steps[str(cq)].append((int(at_us), {}))
                last_id = vid
            if flavor is not None:
                steps[str(cq)][-1][1][(str(flavor), str(resource))] = int(nominal)
        connection.rollback()
    result: dict[str, dict[str, QuotaUse]] = defaultdict(dict)
    keys = set(held) | {
        (cq, fr[0], fr[1]) for cq, versions_ in steps.items() for _, q in versions_ for fr in q
    }
    for cq, flavor, resource in sorted(keys):
        use = result[cq].setdefault(resource, QuotaUse())
        _sweep(
            use,
            held.get((cq, flavor, resource), ()),
            [(at, quotas.get((flavor, resource), 0)) for at, quotas in steps.get(cq, ())],
            lo,
            hi,
        )
    return dict(result)


def _sweep(
    use: QuotaUse,
    usage_steps: Iterable[tuple[int, int]],
    nominal_steps: Sequence[tuple[int, int]],
    lo: int,
    hi: int,
) -> None:
    """Add one flavor-resource's quota, use and borrowing over ``[lo, hi)`` to ``use``.
    ``usage_steps``: (time, +amount / -amount); ``nominal_steps``: (time, nominal) in time
    order; the nominal quota is unknown before the first of them."""
    nominal: int | None = None
    pending = list(nominal_steps)
    index = 0
    while index < len(pending) and pending[index][0] <= lo:
        nominal = pending[index][1]
        index += 1
    changes: list[tuple[int, int, int | None]] = [(t, delta, None) for t, delta in usage_steps]
    changes.extend((t, 0, n) for t, n in pending[index:] if t < hi)
    changes.sort(key=lambda c: (c[0], c[2] is None))
    level = 0
    now = lo
    for at, delta, new_nominal in changes:
        at = max(lo, min(at, hi))
        if at > now and nominal is not None:
            seconds = (at - now) / 1e6
            use.quota += nominal * seconds
            use.used += level * seconds
            use.borrowed += max(0, level - nominal) * seconds
        now = max(now, at)
        level += delta
        if new_nominal is not None:
            nominal = new_nominal
    if hi > now and nominal is not None:
        seconds = (hi - now) / 1e6
        use.quota += nominal * seconds
        use.used += level * seconds
        use.borrowed += max(0, level - nominal) * seconds
