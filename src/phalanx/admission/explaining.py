"""Explanations for workloads the cycle could not admit: what was tried, and who holds it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING

from phalanx.admission.decisions import Explanation, PendingReason
from phalanx.admission.fair_usage import kueue_amount, resource_hours, weighted_usage
from phalanx.admission.flavors import Assignment
from phalanx.admission.records import Entry
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.fairshare import dominant_resource_share, share_path
from phalanx.quotas.resources import FlavorResource

if TYPE_CHECKING:
    from phalanx.admission.scheduler import Scheduler

__all__ = ["decayed_share_note", "explanation", "fair_usage_note", "holders"]


def holders(state: ClusterQueueState, assignment: Assignment, *, limit: int) -> list[str]:
    """Who holds the quota the workload needs: its queue's workloads, borrowing queues."""
    frs = set(assignment.usage) or assignment.tried()
    if limit <= 0:
        return []
    using = (e for e in state.running() if any(fr in e.usage for fr in frs))
    mine = list(islice(using, limit * 4))
    mine.sort(key=lambda e: (e.priority, -e.admitted_at, e.seq))
    names = [e.key for e in mine[:limit]]
    if state.node.parent is not None and len(names) < limit:
        borrowers = state.node.root.borrowers
        # In the order they started borrowing: deterministic, and no sort of a big cohort.
        others = (
            n.name for fr in sorted(frs) for n in borrowers.get(fr, ()) if n is not state.node
        )
        seen = dict.fromkeys(islice(others, limit - len(names)))
        names.extend(f"ClusterQueue/{name} (borrowing)" for name in seen)
    return names


def explanation(
    *,
    entry: Entry,
    state: ClusterQueueState,
    assignment: Assignment,
    reason: PendingReason | None,
    extra: str,
    blocking: Sequence[str],
    now: int,
    fair_sharing: str = "",
) -> Explanation:
    """Why ``entry`` is not admitted, from the flavor assignment that failed."""
    message = assignment.message or extra
    if extra and assignment.message:
        message = f"{assignment.message}; {extra}"
    if fair_sharing:
        message = f"{message}; {fair_sharing}" if message else fair_sharing
    return Explanation(
        workload=entry.key,
        cluster_queue=state.name,
        reason=reason or assignment.reason or PendingReason.WAITING_FOR_QUOTA,
        message=message or "does not fit",
        time=now,
        pod_sets=assignment.explain(),
        blocking=tuple(blocking),
        fair_sharing=fair_sharing,
    )


def fair_usage_note(
    s: Scheduler, state: ClusterQueueState, entry: Entry, went_first: Mapping[str, float]
) -> str:
    """Admission fair sharing: when a LocalQueue with lower decayed usage had a workload
    admitted ahead of ``entry`` in this cycle, say so with the numbers, in decayed
    resource-hours (``consumed x half-life / ln 2``), beside a fair split by weight."""
    ledger = s.fair_usage
    if ledger is None:
        return ""
    mine = s.local_queue_usage(entry.local_queue)
    ahead = sorted((u, lq) for lq, u in went_first.items() if lq != entry.local_queue and u < mine)
    if not ahead:
        return ""
    theirs, other = ahead[0]
    weights = ledger.config.resource_weights
    total = weight_sum = 0.0
    counted: set[str] = set()
    for key, lq in s.local_queues.items():
        if lq.cluster_queue != state.name:
            continue
        usage = ledger.get(key)
        consumed = usage.consumed if usage is not None else {}
        if key in (entry.local_queue, other):
            counted |= {r for r, v in consumed.items() if v and weights.get(r, 1.0)}
        total += weighted_usage(consumed, 1.0, weights)
        weight_sum += max(lq.fair_weight, 0.0)
    half_life = ledger.config.usage_half_life_ms
    unit = f"{next(iter(counted))}-hours" if len(counted) == 1 else "weighted resource-hours"
    fair = f"; a fair share by weight is {resource_hours(total / weight_sum, half_life):.1f}"
    return (
        f"admission fair sharing: LocalQueue {entry.local_queue} waited behind {other}, whose"
        f" decayed usage is lower: {resource_hours(mine, half_life):.1f} vs"
        f" {resource_hours(theirs, half_life):.1f} {unit} (half-life {_duration(half_life)}"
        f"{fair if weight_sum > 0 else ''})"
    )


def decayed_share_note(
    s: Scheduler,
    state: ClusterQueueState,
    usage: Mapping[FlavorResource, int],
    went_first: Mapping[str, tuple[int, ...]],
) -> str:
    """Decayed fair sharing: when a ClusterQueue of the same cohort tree, whose share on
    decayed usage was lower, had a workload admitted ahead of this head in this cycle, say
    so with the figures of the first node on the head's path that borrows in decayed terms
    with the head's ``usage`` added: its decayed usage and its fair amount (its subtree quota
    held throughout), both in decayed resource-hours (``consumed x half-life / ln 2``).
    Nothing when that node's decayed usage is not above what it holds now: then its current
    usage ordered it, as plain DRS would."""
    ledger, decayed = s.decayed_usage, s.share_usage
    node = state.node
    if ledger is None or decayed is None or node.parent is None:
        return ""
    cache = s.lendable_cache
    mine = share_path(node, usage, lendable_cache=cache, decayed=decayed)
    ahead = sorted(
        (path, name)
        for name, path in went_first.items()
        if name != state.name
        and name in s.queues
        and s.queues[name].node.root is node.root
        and path < mine
    )
    if not ahead:
        return ""
    other = s.queues[ahead[0][1]].node
    chain = [n for n in node.path_to_root() if n.parent is not None]
    for borrower in reversed(chain):
        share = dominant_resource_share(
            borrower, usage, lendable_cache=cache, decayed=decayed(borrower)
        )
        resource = share.dominant_resource
        if not resource:
            continue
        history = s.history_of(borrower).get(resource, 0.0)
        held = sum(n for fr, n in borrower.usage.items() if fr[1] == resource)
        if history <= held:
            return ""  # what it holds now ordered it, as plain DRS would
        quota = sum(n for fr, n in borrower.subtree.items() if fr[1] == resource)
        half_life = ledger.config.usage_half_life_ms
        theirs = s.history_of(other).get(resource, 0.0)
        used, fair, other_used = (
            resource_hours(kueue_amount(resource, amount), half_life)
            for amount in (history, quota, theirs)
        )
        kind = "Cohort" if borrower.is_cohort else "ClusterQueue"
        return (
            f"decayed fair sharing: {kind} {borrower.name} used {used:.1f} {resource}-hours"
            f" (decayed, half-life {_duration(half_life)}) vs a fair {fair:.1f} (its quota"
            f" held throughout); ClusterQueue {other.name} went first, having used"
            f" {other_used:.1f}"
        )
    return ""


def _duration(ms: int) -> str:
    """Milliseconds as a Go duration, the way the configuration writes it (``168h``)."""
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = rest / 1000
    text = f"{hours}h" if hours else ""
    text += f"{minutes}m" if minutes else ""
    if seconds or not text:
        text += f"{seconds:g}s"
    return text
