"""Workload lifecycle events, derived from a Workload object as the API holds it.

A pure function of the object: the operator calls it on every Workload version it observes
(its own writes included), and again on every Workload it holds when it fills a gap after a
database outage. Each event carries the time the Workload's own status gives the transition
(``creationTimestamp``, a condition's ``lastTransitionTime``), so deriving it twice yields the
same key (uid, transition, at), and the store keeps one row.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.quotas.quantity import QuantityError, parse_quantity

__all__ = [
    "ADMITTED",
    "CREATED",
    "DELETED",
    "EVICTED",
    "FINISHED",
    "PREEMPTED",
    "QUOTA_RELEASED",
    "QUOTA_RESERVED",
    "TRANSITIONS",
    "Event",
    "Usage",
    "deleted_event",
    "events_of",
    "parse_time",
    "signature",
]

CREATED = "created"
QUOTA_RESERVED = "quota_reserved"
ADMITTED = "admitted"
EVICTED = "evicted"
PREEMPTED = "preempted"
QUOTA_RELEASED = "quota_released"
FINISHED = "finished"
DELETED = "deleted"
TRANSITIONS = (
    CREATED,
    QUOTA_RESERVED,
    ADMITTED,
    EVICTED,
    PREEMPTED,
    QUOTA_RELEASED,
    FINISHED,
    DELETED,
)

# Kueue's condition types, and the transition each True condition records.
_CONDITIONS = {
    "QuotaReserved": QUOTA_RESERVED,
    "Admitted": ADMITTED,
    "Evicted": EVICTED,
    "Preempted": PREEMPTED,
    "Finished": FINISHED,
}


@dataclass(frozen=True)
class Usage:
    """One pod set's total of one resource in one flavor (base units)."""

    pod_set: str
    resource: str
    flavor: str
    amount: int


@dataclass(frozen=True)
class Event:
    uid: str
    transition: str
    at: dt.datetime
    namespace: str
    name: str
    local_queue: str | None = None
    cluster_queue: str | None = None
    priority: int | None = None
    reason: str | None = None
    message: str | None = None
    flavors: Mapping[str, Mapping[str, str]] | None = None
    topology: tuple[Mapping[str, Any], ...] | None = None
    usage: tuple[Usage, ...] = field(default=())

    @property
    def key(self) -> tuple[str, str, dt.datetime]:
        return (self.uid, self.transition, self.at)


@functools.lru_cache(maxsize=8192)
def parse_time(text: str) -> dt.datetime:
    """An RFC 3339 time from the API as naive UTC (what every backend stores alike). Cached:
    each version of a Workload repeats the times of the versions before it."""
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
    return parsed


def events_of(workload: Mapping[str, Any]) -> list[Event]:
    """Every transition ``workload`` records: its creation, each True lifecycle condition at
    its ``lastTransitionTime``, and ``QuotaReserved=False`` as the release of quota (an
    eviction's end, once the pods are gone; unpaired while still pending, which the reports
    ignore). A Workload without a UID or creation time yields none."""
    metadata = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    uid = metadata.get("uid")
    created = metadata.get("creationTimestamp")
    if not uid or not created:
        return []
    base: dict[str, Any] = {
        "uid": str(uid),
        "namespace": str(metadata.get("namespace") or ""),
        "name": str(metadata.get("name") or ""),
        "local_queue": spec.get("queueName"),
        "priority": spec.get("priority"),
    }
    admission = status.get("admission") or {}
    cluster_queue = admission.get("clusterQueue")
    events = [Event(transition=CREATED, at=parse_time(created), **base)]
    for condition in status.get("conditions") or ():
        transition = _CONDITIONS.get(str(condition.get("type")))
        when = condition.get("lastTransitionTime")
        if transition == QUOTA_RESERVED and condition.get("status") == "False" and when:
            transition = QUOTA_RELEASED
        elif transition is None or condition.get("status") != "True" or not when:
            continue
        extra: dict[str, Any] = {
            "reason": condition.get("reason"),
            "message": condition.get("message"),
        }
        if transition == QUOTA_RELEASED:
            pass
        elif transition in (QUOTA_RESERVED, ADMITTED):
            if not admission:
                continue  # a stale condition without the admission it describes
            extra |= {
                "cluster_queue": cluster_queue,
                "flavors": {
                    str(ps.get("name")): dict(ps.get("flavors") or {})
                    for ps in admission.get("podSetAssignments") or ()
                },
                "topology": _topology(admission),
            }
            if transition == QUOTA_RESERVED:
                extra["usage"] = _usage(admission)
        elif cluster_queue:
            extra["cluster_queue"] = cluster_queue
        events.append(Event(transition=transition, at=parse_time(when), **base, **extra))
    return events


def signature(workload: Mapping[str, Any]) -> tuple[Any, ...]:
    """What :func:`events_of` reads to decide which events there are: two versions of a
    Workload with the same signature yield events with the same keys. Cheap next to
    ``events_of`` (no time or quantity is parsed), so a writer fed every version of every
    Workload (most of them status writes that change no transition) derives only when it
    differs."""
    metadata = workload.get("metadata") or {}
    status = workload.get("status") or {}
    return (
        metadata.get("uid"),
        metadata.get("creationTimestamp"),
        bool(status.get("admission")),
        *(
            (c.get("type"), c.get("status"), c.get("lastTransitionTime"))
            for c in status.get("conditions") or ()
            if c.get("type") in _CONDITIONS
        ),
    )


def deleted_event(workload: Mapping[str, Any], *, at: dt.datetime) -> Event | None:
    """The Workload's deletion, observed at ``at`` (or its deletionTimestamp): ends a
    reservation that no Finished or Evicted condition ended."""
    metadata = workload.get("metadata") or {}
    uid = metadata.get("uid")
    if not uid:
        return None
    stamp = metadata.get("deletionTimestamp")
    return Event(
        uid=str(uid),
        transition=DELETED,
        at=parse_time(stamp) if stamp else at,
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        local_queue=(workload.get("spec") or {}).get("queueName"),
    )


def _topology(admission: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...] | None:
    found = tuple(
        {"podSet": ps.get("name"), **ps["topologyAssignment"]}
        for ps in admission.get("podSetAssignments") or ()
        if ps.get("topologyAssignment")
    )
    return found or None


def _usage(admission: Mapping[str, Any]) -> tuple[Usage, ...]:
    usage: list[Usage] = []
    for ps in admission.get("podSetAssignments") or ():
        flavors = ps.get("flavors") or {}
        for resource, quantity in (ps.get("resourceUsage") or {}).items():
            try:
                amount = parse_quantity(quantity, resource=resource)
            except QuantityError:
                continue  # the API server validated it; an odd value is not worth a crash
            usage.append(
                Usage(
                    pod_set=str(ps.get("name")),
                    resource=resource,
                    flavor=str(flavors.get(resource, "")),
                    amount=amount,
                )
            )
    return tuple(usage)
