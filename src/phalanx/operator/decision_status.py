"""The Workload status each of the core's decisions writes, as idempotent builders.

Each builder takes the Workload as the API last showed it and returns the status fields
Phalanx owns after the decision, or None when the Workload already shows it: a write whose
answer was lost is then recognised when it is read back (``StatusWriter.apply_status``),
never applied twice.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.admission.decisions import Admit
from phalanx.api import convert
from phalanx.operator import admission_checks as ac
from phalanx.operator import conditions as cond
from phalanx.operator.writer import StatusFn, owned_conditions

__all__ = [
    "Eviction",
    "accumulated_execution_seconds",
    "admission_status",
    "count_eviction",
    "evicted_at_once_status",
    "evicted_status",
    "eviction_done_status",
]


@dataclass
class Eviction:
    """An eviction in progress: the Workload holds its quota until its pods are gone."""

    reason: str
    message: str
    cluster_queue: str
    preemption_reason: str | None = None
    backoff: bool = False
    written: bool = False
    released_at: int = 0
    """When the pods were gone; the core releases the quota as of then, once the API shows
    the eviction done (never before: the API must not show a preemptor and its victim both
    reserving)."""
    requeue: tuple[int, int] | None = None
    """With backoff: the (count, requeueAt ms) written as requeueState, as the core will apply."""
    requeue_at: int | None = None
    """Evicted by an admission check in Retry: not tried again before then (ms)."""


def admission_status(
    admit: Admit, *, checks: Callable[[Mapping[str, Any]], Sequence[str]] | None = None
) -> StatusFn:
    """QuotaReserved and Admitted, with ``status.admission``. ``checks`` gives the
    AdmissionChecks that apply to an admission: with any, ``Admitted`` waits until all are
    Ready (Kueue's two-phase admission) and ``status.admissionChecks`` lists them."""
    admission = convert.admission_to_status(admit.admission)
    now = admit.time

    def build(current: dict[str, Any]) -> dict[str, Any] | None:
        status = current.get("status") or {}
        if status.get("admission") == admission and cond.is_true(
            status.get("conditions"), cond.QUOTA_RESERVED
        ):
            return None
        out: dict[str, Any] = {
            "conditions": cond.admitted(
                owned_conditions(current),
                cluster_queue=admit.admission.cluster_queue,
                now_ms=now,
                note=admit.over_budget,
            ),
            "admission": admission,
        }
        required = checks(admission) if checks is not None else ()
        states = status.get("admissionChecks") or []
        if required or states:
            states = ac.sync_states(states, required, now_ms=now) or states
            out["admissionChecks"] = states
            out["conditions"] = ac.quota_reserved(
                out["conditions"], ready=ac.all_ready(states), now_ms=now
            )
        return out

    return build


def evicted_status(eviction: Eviction, *, now_ms: int) -> StatusFn:
    """Evicted (and Preempted) while the admission stays: the Workload still reserves its
    quota until its pods are gone."""

    def build(current: dict[str, Any]) -> dict[str, Any] | None:
        conditions = (current.get("status") or {}).get("conditions")
        if cond.is_true(conditions, cond.FINISHED):
            return None  # finished meanwhile: it keeps its admission, nothing to evict
        evicted = cond.condition(conditions, cond.EVICTED)
        if (
            evicted is not None
            and evicted.get("status") == "True"
            and evicted.get("reason") == eviction.reason
        ):
            return None
        status: dict[str, Any] = {
            "conditions": cond.evicted(
                owned_conditions(current),
                reason=eviction.reason,
                message=eviction.message,
                now_ms=now_ms,
                preemption_reason=eviction.preemption_reason,
            ),
            "schedulingStats": count_eviction(current, reason=eviction.reason),
        }
        admission = (current.get("status") or {}).get("admission")
        if admission:
            status["admission"] = admission
        return status

    return build


def eviction_done_status(
    eviction: Eviction, *, now_ms: int, requeue: tuple[int, int] | None
) -> StatusFn:
    """The eviction completed: the reservation and the admission go, with the requeue
    state when the eviction backs off."""

    def build(current: dict[str, Any]) -> dict[str, Any] | None:
        status = current.get("status") or {}
        if cond.is_true(status.get("conditions"), cond.FINISHED):
            return None  # finished meanwhile: it keeps its admission (its quota is released)
        if not status.get("admission") and not cond.is_true(
            status.get("conditions"), cond.QUOTA_RESERVED
        ):
            return None  # already done (by an earlier write, or by Kueue's runner)
        out: dict[str, Any] = {
            "conditions": cond.eviction_done(
                owned_conditions(current),
                reason=eviction.reason,
                message=eviction.message,
                now_ms=now_ms,
            ),
            "admission": None,
        }
        checks = ac.reset_on_eviction(status.get("admissionChecks"), now_ms=now_ms)
        if checks is not None:
            out["admissionChecks"] = checks
        accumulated = accumulated_execution_seconds(current, now_ms=now_ms)
        if accumulated is not None:
            out["accumulatedPastExecutionTimeSeconds"] = accumulated
        if requeue is not None:
            out["requeueState"] = {
                "count": requeue[0],
                "requeueAt": cond.rfc3339(requeue[1]),
            }
        return out

    return build


def evicted_at_once_status(
    eviction: Eviction, *, now_ms: int, requeue: tuple[int, int] | None
) -> StatusFn:
    """Evicted and its eviction done in one write, for a Workload that nothing owns: no Job,
    pod or other object runs for it, so there is nothing to wait for between the two (the
    reservation goes with the ``Evicted`` condition). A Workload finished meanwhile keeps
    its admission: nothing is written."""
    evict = evicted_status(eviction, now_ms=now_ms)
    done = eviction_done_status(eviction, now_ms=now_ms, requeue=requeue)

    def build(current: dict[str, Any]) -> dict[str, Any] | None:
        status = current.get("status") or {}
        if cond.is_true(status.get("conditions"), cond.FINISHED):
            return None
        first = evict(current) or {}
        second = done({**current, "status": {**status, **first}})
        if second is None:
            return first or None
        return {**first, **second}

    return build


def accumulated_execution_seconds(current: dict[str, Any], *, now_ms: int) -> int | None:
    """``status.accumulatedPastExecutionTimeSeconds`` once the admission ends, as Kueue keeps
    it: the seconds since ``Admitted`` last turned True added to what earlier admissions
    accumulated; None when the Workload is not admitted."""
    status = current.get("status") or {}
    admitted = cond.condition(status.get("conditions"), cond.ADMITTED)
    if admitted is None or admitted.get("status") != "True":
        return None
    since = _parse_time(admitted.get("lastTransitionTime"))
    if since is None:
        return None
    past = int(status.get("accumulatedPastExecutionTimeSeconds") or 0)
    return past + max(0, (now_ms - since) // 1000)


def count_eviction(current: dict[str, Any], *, reason: str) -> dict[str, Any]:
    """``status.schedulingStats`` with one more eviction for ``reason`` (Kueue counts them
    per reason and underlying cause; Phalanx's evictions have no underlying cause)."""
    stats = (current.get("status") or {}).get("schedulingStats") or {}
    evictions = [dict(e) for e in stats.get("evictions") or ()]
    for entry in evictions:
        if entry.get("reason") == reason and not entry.get("underlyingCause"):
            entry["count"] = int(entry.get("count") or 0) + 1
            break
    else:
        evictions.append({"reason": reason, "underlyingCause": "", "count": 1})
    return {**stats, "evictions": evictions}


def _parse_time(value: object) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return int(parsed.replace(tzinfo=datetime.UTC).timestamp() * 1000)
