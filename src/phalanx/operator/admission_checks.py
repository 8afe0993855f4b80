"""Admission checks as Kueue's workload controller applies them, as pure functions.

Kueue admits in two phases: the scheduler reserves quota (``QuotaReserved=True``), and the
Workload is ``Admitted`` only once every AdmissionCheck that applies to it is ``Ready`` in its
``status.admissionChecks``. Which checks apply follows the ClusterQueue's
``admissionChecksStrategy``: a check with ``onFlavors`` applies when one of the workload's
assigned flavors is listed, one without applies always. A check in ``Retry`` evicts the
workload (it is requeued at the check's retry time), one in ``Rejected`` deactivates it.

Everything here works on the Workload and ClusterQueue as the API shows them (dicts) and
returns new values; :mod:`phalanx.operator.checks` writes them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.operator import conditions as cond

__all__ = [
    "ADMITTED_UNSATISFIED",
    "EVICTED_BY_CHECK",
    "PENDING",
    "READY",
    "REJECTED",
    "RETRY",
    "PodSetChanges",
    "all_ready",
    "applicable_checks",
    "checks_message",
    "in_state",
    "parse_time",
    "quota_reserved",
    "reset_on_eviction",
    "retry_requeue_at",
    "sync_states",
    "with_state",
]

PENDING = "Pending"
READY = "Ready"
RETRY = "Retry"
REJECTED = "Rejected"

EVICTED_BY_CHECK = "AdmissionCheck"
"""Kueue's eviction reason (and deactivation cause) for a check in Retry or Rejected."""
ADMITTED_UNSATISFIED = "UnsatisfiedAdmissionChecks"
"""Kueue's ``Admitted=False`` reason while quota is reserved and a check is not Ready."""

CheckState = dict[str, Any]


def _strategy(cluster_queue: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = cluster_queue.get("spec") or {}
    return list((spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or ())


def _queue_flavors(cluster_queue: Mapping[str, Any]) -> set[str]:
    spec = cluster_queue.get("spec") or {}
    return {
        str(f.get("name"))
        for group in spec.get("resourceGroups") or ()
        for f in group.get("flavors") or ()
    }


def applicable_checks(
    cluster_queue: Mapping[str, Any] | None, admission: Mapping[str, Any] | None
) -> list[str]:
    """The checks a workload of ``cluster_queue`` must pass, sorted by name (Kueue's order).

    With an ``admission``: those whose flavors meet the assigned ones. Without one (not
    reserved yet): only those that apply to every flavor of the queue, as Kueue lists them.
    """
    if cluster_queue is None:
        return []
    all_flavors = _queue_flavors(cluster_queue)
    assigned = (
        {
            str(f)
            for psa in admission.get("podSetAssignments") or ()
            for f in (psa.get("flavors") or {}).values()
        }
        if admission
        else None
    )
    names = []
    for rule in _strategy(cluster_queue):
        flavors = set(rule.get("onFlavors") or ()) or all_flavors
        if (assigned is not None and flavors & assigned) or (
            assigned is None and flavors >= all_flavors
        ):
            names.append(str(rule["name"]))
    return sorted(names)


def sync_states(
    current: Sequence[Mapping[str, Any]] | None, required: Sequence[str], *, now_ms: int
) -> list[CheckState] | None:
    """``status.admissionChecks`` with a Pending entry for each required check it lacks and
    without the entries no longer required; None when it is already so (Kueue's
    ``syncAdmissionCheckConditions``)."""
    existing = {str(c.get("name")): dict(c) for c in current or ()}
    if set(existing) == set(required):
        return None
    out = []
    for name in sorted(required):
        out.append(
            existing.get(name)
            or {
                "name": name,
                "state": PENDING,
                "message": "",
                "lastTransitionTime": cond.rfc3339(now_ms),
            }
        )
    return out


def with_state(
    current: Sequence[Mapping[str, Any]] | None, update: Mapping[str, Any], *, now_ms: int
) -> list[CheckState]:
    """``current`` with the check named in ``update`` replaced by it; the transition time
    moves only when the state changes (Kueue's ``SetAdmissionCheckState``)."""
    out: list[CheckState] = []
    found = False
    for c in current or ():
        if c.get("name") != update.get("name"):
            out.append(dict(c))
            continue
        found = True
        merged = {**c, **update}
        if c.get("state") != update.get("state"):
            merged["lastTransitionTime"] = cond.rfc3339(now_ms)
        out.append({k: v for k, v in merged.items() if v is not None})
    if not found:
        out.append(
            {
                "lastTransitionTime": cond.rfc3339(now_ms),
                **{k: v for k, v in update.items() if v is not None},
            }
        )
    return sorted(out, key=lambda c: str(c.get("name")))


def all_ready(states: Iterable[Mapping[str, Any]] | None) -> bool:
    return all(c.get("state") == READY for c in states or ())


def in_state(states: Iterable[Mapping[str, Any]] | None, state: str) -> list[Mapping[str, Any]]:
    return [c for c in states or () if c.get("state") == state]


def checks_message(checks: Sequence[Mapping[str, Any]], state: str) -> str:
    """Kueue's ``buildAdmissionChecksMessage``: ``AdmissionCheck in Retry state: "prov"
    (message)``."""
    parts = []
    for c in sorted(checks, key=lambda c: str(c.get("name"))):
        message = c.get("message") or ""
        parts.append(f'"{c.get("name")}" ({message})' if message else f'"{c.get("name")}"')
    noun = "AdmissionChecks" if len(checks) > 1 else "AdmissionCheck"
    return f"{noun} in {state} state: {'; '.join(parts)}"


def quota_reserved(
    conditions: Sequence[Mapping[str, Any]] | None, *, ready: bool, now_ms: int
) -> list[dict[str, Any]]:
    """``Admitted`` for a workload whose quota is reserved: True once its checks are all
    Ready, else False with Kueue's ``UnsatisfiedAdmissionChecks``."""
    if ready:
        return cond.set_condition(
            conditions,
            cond.ADMITTED,
            status=True,
            reason="Admitted",
            message="The workload is admitted",
            now_ms=now_ms,
        )
    return cond.set_condition(
        conditions,
        cond.ADMITTED,
        status=False,
        reason=ADMITTED_UNSATISFIED,
        message="The workload has not all checks ready",
        now_ms=now_ms,
    )


def reset_on_eviction(
    states: Sequence[Mapping[str, Any]] | None, *, now_ms: int
) -> list[CheckState] | None:
    """Every check back to Pending once the eviction completes, a Retry counted in
    ``retryCount`` (Kueue's ``resetChecksOnEviction``); None when there are none to reset."""
    if not states or all(c.get("state") == PENDING for c in states):
        return None
    out = []
    for c in states:
        if c.get("state") == PENDING:
            out.append(dict(c))
            continue
        reset: CheckState = {
            "name": c.get("name"),
            "state": PENDING,
            "message": f"Reset to Pending after eviction. Previously: {c.get('state')}",
            "lastTransitionTime": cond.rfc3339(now_ms),
        }
        if c.get("requeueAfterSeconds") is not None:
            reset["requeueAfterSeconds"] = c["requeueAfterSeconds"]
        retries = c.get("retryCount")
        if c.get("state") == RETRY:
            retries = int(retries or 0) + 1
        if retries is not None:
            reset["retryCount"] = retries
        out.append(reset)
    return out


def retry_requeue_at(states: Iterable[Mapping[str, Any]] | None) -> int | None:
    """When a workload evicted by checks in Retry may be tried again, in ms: the latest
    ``lastTransitionTime + requeueAfterSeconds`` of those checks (Kueue's
    ``GetMaxRetryTime``); None when none says."""
    latest = None
    for c in in_state(states, RETRY):
        after = c.get("requeueAfterSeconds")
        since = parse_time(c.get("lastTransitionTime"))
        if after is None or since is None:
            continue
        at = since + int(after) * 1000
        latest = at if latest is None else max(latest, at)
    return latest


@dataclass(frozen=True)
class PodSetChanges:
    """What Ready checks add to a pod set's pods when the Job starts (Kueue's
    ``podSetUpdates``, merged over every check)."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, states: Iterable[Mapping[str, Any]] | None, pod_set: str) -> PodSetChanges:
        changes = cls()
        for c in states or ():
            for update in c.get("podSetUpdates") or ():
                if update.get("name") != pod_set:
                    continue
                changes.labels.update(update.get("labels") or {})
                changes.annotations.update(update.get("annotations") or {})
                changes.node_selector.update(update.get("nodeSelector") or {})
                for toleration in update.get("tolerations") or ():
                    if toleration not in changes.tolerations:
                        changes.tolerations.append(dict(toleration))
        return changes


def parse_time(value: object) -> int | None:
    """An RFC 3339 timestamp in ms since the epoch; None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return int(parsed.timestamp() * 1000)
