"""Workload status as Kueue writes it: conditions, reasons and messages, as pure functions.

Each function takes the Workload's current conditions and returns the new list; a condition's
``lastTransitionTime`` only moves when its status changes, as metav1.Condition requires.
Phalanx writes status with server-side apply under its own field manager, so conditions that
others own (Kueue's performance runner sets ``Finished``) are never overwritten.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "ADMITTED",
    "EVICTED",
    "FINISHED",
    "MANAGED_TYPES",
    "PODS_READY",
    "PREEMPTED",
    "QUOTA_RESERVED",
    "REQUEUED",
    "REQUEUED_AT_ONCE",
    "admitted",
    "condition",
    "evicted",
    "eviction_done",
    "finished",
    "is_true",
    "pending",
    "pods_ready",
    "requeued_again",
    "rfc3339",
    "set_condition",
    "truncate",
]

QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
PODS_READY = "PodsReady"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"
FINISHED = "Finished"
MANAGED_TYPES = (QUOTA_RESERVED, ADMITTED, PODS_READY, EVICTED, PREEMPTED, REQUEUED, FINISHED)

# metav1.Condition.message is at most 32768 bytes; Kueue truncates to 1024 for readability.
_MESSAGE_LIMIT = 1024
Condition = dict[str, Any]


def rfc3339(now_ms: int) -> str:
    return (
        datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.UTC)
        .replace(microsecond=0)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
    )


def truncate(message: str) -> str:
    if len(message) <= _MESSAGE_LIMIT:
        return message
    return message[: _MESSAGE_LIMIT - 3] + "..."


def condition(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> Condition | None:
    for c in conditions or ():
        if c.get("type") == kind:
            return dict(c)
    return None


def is_true(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> bool:
    c = condition(conditions, kind)
    return c is not None and c.get("status") == "True"


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    kind: str,
    *,
    status: bool,
    reason: str,
    message: str,
    now_ms: int,
    generation: int | None = None,
) -> list[Condition]:
    """Return ``conditions`` with ``kind`` set; its transition time moves only on a change."""
    text = "True" if status else "False"
    out: list[Condition] = []
    found = False
    for c in conditions or ():
        if c.get("type") != kind:
            out.append(dict(c))
            continue
        found = True
        updated = dict(c)
        if c.get("status") != text:
            updated["lastTransitionTime"] = rfc3339(now_ms)
        updated.update(status=text, reason=reason, message=truncate(message))
        if generation is not None:
            updated["observedGeneration"] = generation
        out.append(updated)
    if not found:
        new: Condition = {
            "type": kind,
            "status": text,
            "reason": reason,
            "message": truncate(message),
            "lastTransitionTime": rfc3339(now_ms),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out


def pending(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    inadmissible: bool,
    message: str,
    now_ms: int,
) -> list[Condition]:
    """Not admitted: ``QuotaReserved=False`` with why (Kueue: Pending or Inadmissible)."""
    return set_condition(
        conditions,
        QUOTA_RESERVED,
        status=False,
        reason="Inadmissible" if inadmissible else "Pending",
        message=message,
        now_ms=now_ms,
    )


def admitted(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    cluster_queue: str,
    now_ms: int,
    note: str = "",
) -> list[Condition]:
    """QuotaReserved and Admitted; ``note`` ends QuotaReserved's message (a workload admitted
    over a Preemptible budget: the budget's message)."""
    message = f"Quota reserved in ClusterQueue {cluster_queue}"
    out = set_condition(
        conditions,
        QUOTA_RESERVED,
        status=True,
        reason="QuotaReserved",
        message=f"{message}; {note}" if note else message,
        now_ms=now_ms,
    )
    out = set_condition(
        out,
        ADMITTED,
        status=True,
        reason="Admitted",
        message="The workload is admitted",
        now_ms=now_ms,
    )
    # Kueue resets an earlier eviction when the workload gets quota again.
    for kind in (EVICTED, PREEMPTED):
        previous = condition(out, kind)
        if previous is not None and previous.get("status") == "True":
            out = set_condition(
                out,
                kind,
                status=False,
                reason="QuotaReserved",
                message=f"Previously: {previous.get('message', '')}",
                now_ms=now_ms,
            )
    return out


def evicted(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    reason: str,
    message: str,
    now_ms: int,
    preemption_reason: str | None = None,
) -> list[Condition]:
    """``Evicted=True`` (and ``Preempted=True`` when preempted); quota is still held until
    the workload's pods are gone (:func:`eviction_done`)."""
    out = set_condition(
        conditions, EVICTED, status=True, reason=reason, message=message, now_ms=now_ms
    )
    if preemption_reason is not None:
        out = set_condition(
            out, PREEMPTED, status=True, reason=preemption_reason, message=message, now_ms=now_ms
        )
    return out


# Evictions whose workload Kueue marks ``Requeued=True`` when the eviction completes; after
# the others the workload waits for something to change, and ``Requeued`` turns True with the
# reason of that change (:func:`requeued_again`).
REQUEUED_AT_ONCE = frozenset({"Preempted", "NodeFailures"})
_REQUEUED_AGAIN = {
    "Deactivated": ("Reactivated", "The workload was reactivated"),
    "PodsReadyTimeout": ("BackoffFinished", "The workload backoff was finished"),
    "AdmissionCheck": ("BackoffFinished", "The workload backoff was finished"),
    "ClusterQueueStopped": (
        "ClusterQueueRestarted",
        "The ClusterQueue was restarted after being stopped",
    ),
    "LocalQueueStopped": (
        "LocalQueueRestarted",
        "The LocalQueue was restarted after being stopped",
    ),
}


def eviction_done(
    conditions: Sequence[Mapping[str, Any]] | None, *, reason: str, message: str, now_ms: int
) -> list[Condition]:
    """The evicted workload released its quota, as Kueue's Job reconciler writes it: the
    reservation and the admission go with the eviction's message, ``Requeued`` is True only
    after a preemption (or node failures), else False with the eviction's reason, and
    ``PodsReady``, when the workload has one, is back to ``WaitForStart``."""
    out = set_condition(
        conditions,
        QUOTA_RESERVED,
        status=False,
        reason="Pending",
        message=message,
        now_ms=now_ms,
    )
    out = set_condition(
        out,
        ADMITTED,
        status=False,
        reason="NoReservation",
        message="The workload has no reservation",
        now_ms=now_ms,
    )
    if condition(out, PODS_READY) is not None:
        out = pods_ready(out, admitted=False, ready=False, now_ms=now_ms)
    return set_condition(
        out,
        REQUEUED,
        status=reason in REQUEUED_AT_ONCE,
        reason=reason,
        message=message,
        now_ms=now_ms,
    )


def requeued_again(
    conditions: Sequence[Mapping[str, Any]] | None, *, now_ms: int
) -> list[Condition] | None:
    """``Requeued=True`` again once the workload is back in its queue after an eviction that
    left it ``Requeued=False`` (reactivated, backoff over, queue restarted); None when there
    is nothing to change."""
    requeued = condition(conditions, REQUEUED)
    if requeued is None or requeued.get("status") != "False":
        return None
    again = _REQUEUED_AGAIN.get(str(requeued.get("reason")))
    if again is None:
        return None
    return set_condition(
        conditions, REQUEUED, status=True, reason=again[0], message=again[1], now_ms=now_ms
    )


_NOT_READY = "Not all pods are ready or succeeded"
_WAITING_FOR_RECOVERY = "At least one pod has failed, waiting for recovery"


def pods_ready(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    admitted: bool = True,
    ready: bool,
    now_ms: int,
) -> list[Condition]:
    """``PodsReady`` as Kueue's Job reconciler computes it: False ``WaitForStart`` while not
    admitted or before the pods first became ready; True ``Started`` (``Recovered`` after a
    recovery); once started, a pod lost makes it False ``WaitForRecovery``."""
    current = condition(conditions, PODS_READY)
    previous = None if current is None else current.get("reason")
    if not admitted:
        status, reason, message = False, "WaitForStart", _NOT_READY
    elif ready:
        recovered = previous in ("WaitForRecovery", "Recovered")
        status, reason = True, "Recovered" if recovered else "Started"
        message = "All pods reached readiness and the workload is running"
    elif current is not None and (current.get("status") == "True" or previous == "WaitForRecovery"):
        status, reason, message = False, "WaitForRecovery", _WAITING_FOR_RECOVERY
    else:
        status, reason, message = False, "WaitForStart", _NOT_READY
    return set_condition(
        conditions, PODS_READY, status=status, reason=reason, message=message, now_ms=now_ms
    )


def finished(
    conditions: Sequence[Mapping[str, Any]] | None, *, succeeded: bool, message: str, now_ms: int
) -> list[Condition]:
    return set_condition(
        conditions,
        FINISHED,
        status=True,
        reason="Succeeded" if succeeded else "Failed",
        message=message,
        now_ms=now_ms,
    )
