"""The Workload status each of the core's decisions writes, as idempotent builders.

Each builder takes the Workload as the API last showed it and returns the status fields
Phalanx owns after the decision, or None when the Workload already shows it: a write whose
answer was lost is then recognised when it is read back (``StatusWriter.apply_status``),
never applied twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.admission.decisions import Admit
from phalanx.api import convert
from phalanx.operator import conditions as cond
from phalanx.operator.writer import StatusFn, owned_conditions

__all__ = ["Eviction", "admission_status", "evicted_status", "eviction_done_status"]


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


def admission_status(admit: Admit) -> StatusFn:
    """QuotaReserved and Admitted, with ``status.admission``."""
    admission = convert.admission_to_status(admit.admission)
    now = admit.time

    def build(current: dict[str, Any]) -> dict[str, Any] | None:
        status = current.get("status") or {}
        if status.get("admission") == admission and cond.is_true(
            status.get("conditions"), cond.QUOTA_RESERVED
        ):
            return None
        return {
            "conditions": cond.admitted(
                owned_conditions(current),
                cluster_queue=admit.admission.cluster_queue,
                now_ms=now,
            ),
            "admission": admission,
        }

    return build


def evicted_status(eviction: Eviction, *, now_ms: int) -> StatusFn:
    """Evicted (and Preempted) while the admission stays: the Workload still reserves its
    quota until its pods are gone."""

    def build(current: dict[str, Any]) -> dict[str, Any] | None:
        evicted = cond.condition((current.get("status") or {}).get("conditions"), cond.EVICTED)
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
            )
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
        if not status.get("admission") and not cond.is_true(
            status.get("conditions"), cond.QUOTA_RESERVED
        ):
            return None  # already done (by an earlier write, or by Kueue's runner)
        out: dict[str, Any] = {
            "conditions": cond.eviction_done(
                owned_conditions(current), reason=eviction.reason, now_ms=now_ms
            ),
            "admission": None,
        }
        if requeue is not None:
            out["requeueState"] = {
                "count": requeue[0],
                "requeueAt": cond.rfc3339(requeue[1]),
            }
        return out

    return build
