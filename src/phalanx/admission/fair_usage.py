"""Kueue's admission fair sharing (AFS): a ClusterQueue serves its LocalQueues by decayed usage.

With ``admissionFairSharing`` in the Configuration and a ClusterQueue whose
``spec.admissionScope.admissionMode`` is ``UsageBasedAdmissionFairSharing``, the heads of the
ClusterQueue's LocalQueues are ordered by each LocalQueue's *weighted decayed usage* first,
lowest first, and only then by priority and FIFO (Kueue's ``queueOrderingFunc``)::

    usage(lq) = sum over resources r of  resourceWeights[r] (default 1) x consumed[r]
                / lq.spec.fairSharing.weight          (weight <= 0: infinite, always last)

``consumed`` is an exponentially decayed average of what the LocalQueue's admitted workloads
hold, per resource in Kueue's units (CPU in cores, memory in bytes, devices as counts; flavors
summed). Every ``usageSamplingInterval`` it moves towards the current usage::

    alpha    = 1 - 0.5 ** (elapsed / usageHalfLifeTime)     (0 when the half-life is 0)
    consumed = consumed x (1 - alpha) + current x alpha

and when a workload of the LocalQueue is admitted its *entry penalty* is added at once,
``alpha(usageSamplingInterval) x`` its requests, so that one sampling interval does not let
a LocalQueue with low usage take everything (Kueue pushes the penalty at quota reservation
and settles it into ``consumed`` when the workload is Admitted; Phalanx settles it at the
reservation, which is the same moment for a workload without admission checks).

``consumed`` for constant usage ``u`` held over ``[s, e)`` and sampled at ``T`` is the
integral of the kernel ``ln 2 / H x 0.5 ** ((T - t) / H)`` times ``u`` over ``[s, e)``, which
is what :func:`interval_consumed` computes exactly (the store rebuilds a LocalQueue's usage
from its history with it). ``consumed x H / ln 2`` is therefore the LocalQueue's decayed
resource-time: :func:`resource_hours` turns it into "GPU-hours" for explanations.

Everything here is pure: time comes in as ``now`` in milliseconds, the operator samples and
persists (``LocalQueue.status.fairSharing.admissionFairSharingStatus``), and restores a
LocalQueue's ``consumed`` with :meth:`UsageLedger.restore`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from phalanx.quotas.quantity import is_milli_resource

__all__ = [
    "ADMISSION_MODES",
    "NO_ADMISSION_FAIR_SHARING",
    "USAGE_BASED",
    "AdmissionFairSharing",
    "DecayedUsage",
    "UsageLedger",
    "alpha",
    "base_units",
    "decayed",
    "entry_penalty",
    "interval_consumed",
    "kueue_amount",
    "resource_hours",
    "weighted_usage",
]

USAGE_BASED = "UsageBasedAdmissionFairSharing"
NO_ADMISSION_FAIR_SHARING = "NoAdmissionFairSharing"
ADMISSION_MODES = (USAGE_BASED, NO_ADMISSION_FAIR_SHARING)
"""Kueue's ``spec.admissionScope.admissionMode`` values."""

_NO_WEIGHTS: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AdmissionFairSharing:
    """Kueue's Configuration ``admissionFairSharing`` (durations in milliseconds)."""

    usage_half_life_ms: int
    usage_sampling_interval_ms: int = 300_000
    """Kueue's default: 5 minutes."""
    resource_weights: Mapping[str, float] = field(default_factory=lambda: _NO_WEIGHTS)


def alpha(elapsed_ms: float, half_life_ms: float) -> float:
    """How far ``consumed`` moves towards the current usage in ``elapsed_ms`` (Kueue's
    ``calculateAlphaRate``: 0 when the half-life is 0)."""
    if half_life_ms <= 0:
        return 0.0
    return 1.0 - float(0.5 ** (max(0.0, elapsed_ms) / half_life_ms))


def decayed(
    consumed: Mapping[str, float],
    current: Mapping[str, float],
    elapsed_ms: float,
    half_life_ms: float,
) -> dict[str, float]:
    """``consumed x (1 - alpha) + current x alpha`` per resource (Kueue's
    ``CalculateDecayedConsumed``)."""
    a = alpha(elapsed_ms, half_life_ms)
    out = {r: v * (1.0 - a) for r, v in consumed.items()}
    for r, v in current.items():
        out[r] = out.get(r, 0.0) + v * a
    return out


def entry_penalty(requests: Mapping[str, float], config: AdmissionFairSharing) -> dict[str, float]:
    """What admitting a workload with ``requests`` adds to its LocalQueue at once (Kueue's
    ``CalculateEntryPenalty``): one sampling interval's worth of its usage."""
    a = alpha(config.usage_sampling_interval_ms, config.usage_half_life_ms)
    return {r: v * a for r, v in requests.items()}


def weighted_usage(
    consumed: Mapping[str, float],
    lq_weight: float,
    resource_weights: Mapping[str, float],
) -> float:
    """Kueue's ``CalculateUsage``: ``sum(resourceWeight x consumed) / weight``, resources in
    name order; a weight of 0 (or less) is infinite usage (always served last)."""
    total = 0.0
    for resource in sorted(consumed):
        total += resource_weights.get(resource, 1.0) * consumed[resource]
    if lq_weight <= 0:
        return math.inf
    return total / lq_weight


def kueue_amount(resource: str, base_units: float) -> float:
    """A quantity in the core's base units (milli-CPU, bytes, devices) as Kueue's float of the
    same quantity (``AsApproximateFloat64``: CPU in cores)."""
    return base_units / 1000 if is_milli_resource(resource) else float(base_units)


def base_units(resource: str, amount: float) -> float:
    """The inverse of :func:`kueue_amount`: Kueue's float in the core's base units (not
    rounded: decayed usage is fractional)."""
    return amount * 1000 if is_milli_resource(resource) else amount


def interval_consumed(
    amount: float, start_ms: float, end_ms: float, at_ms: float, half_life_ms: float
) -> float:
    """What ``amount`` held over ``[start, end)`` contributes to ``consumed`` at ``at``: the
    decay kernel integrated exactly. Equal to sampling Kueue's recurrence at any interval when
    the usage is constant between samples. Half-life 0: only what is held at ``at`` counts
    (``consumed`` is reset at every sample, as Kueue does)."""
    end_ms = min(end_ms, at_ms)
    if end_ms <= start_ms:
        return 0.0
    if half_life_ms <= 0:
        return 0.0
    later = float(0.5 ** ((at_ms - end_ms) / half_life_ms))
    earlier = float(0.5 ** ((at_ms - start_ms) / half_life_ms))
    return amount * (later - earlier)


def resource_hours(consumed: float, half_life_ms: float) -> float:
    """``consumed`` as decayed resource-hours: the integral of the usage weighted by the
    decay kernel's shape (1 now, 1/2 one half-life ago), ``consumed x H / ln 2``."""
    return consumed * half_life_ms / math.log(2) / 3_600_000


@dataclass(slots=True)
class DecayedUsage:
    """One queue's decayed usage: Kueue's ``admissionFairSharingStatus`` (a LocalQueue's, or,
    with Phalanx's decayed fair sharing, a ClusterQueue's)."""

    consumed: dict[str, float] = field(default_factory=dict)
    """Resource -> decayed usage in Kueue's units (``consumedResources``)."""
    last_update: int = 0
    """When ``consumed`` was last decayed (ms; ``lastUpdate``)."""
    penalties: float = 0.0
    """Entry penalties added since the last sample, weighted (for explanations)."""
    reported: dict[str, float] = field(default_factory=dict)
    reported_at: int = 0
    """``consumed`` and its time as of the last sample (or restore): what the queue's
    status shows (Kueue writes the status at sampling; admissions only move the cache)."""


class UsageLedger:
    """Decayed usage per queue key: a LocalQueue's ``namespace/name`` (admission fair sharing)
    or a ClusterQueue's name (decayed fair sharing); owned by the ``Scheduler``."""

    __slots__ = ("config", "entries", "version")

    def __init__(self, config: AdmissionFairSharing) -> None:
        self.config = config
        self.entries: dict[str, DecayedUsage] = {}
        self.version = 0
        """Bumped on every change: the operator rewrites a status only when it moved."""

    def get(self, key: str) -> DecayedUsage | None:
        return self.entries.get(key)

    def restore(self, key: str, consumed: Mapping[str, float], last_update: int) -> None:
        """Seed ``key`` from what was persisted (the LocalQueue's status, or the store)."""
        self.entries[key] = DecayedUsage(
            dict(consumed), last_update, reported=dict(consumed), reported_at=last_update
        )
        self.version += 1

    def forget(self, key: str) -> None:
        if self.entries.pop(key, None) is not None:
            self.version += 1

    def usage(self, key: str, lq_weight: float) -> float:
        entry = self.entries.get(key)
        consumed = entry.consumed if entry is not None else {}
        return weighted_usage(consumed, lq_weight, self.config.resource_weights)

    def sample(self, key: str, current: Mapping[str, float], now: int) -> DecayedUsage:
        """Decay ``key``'s usage towards ``current`` over the time since its last update (a
        new LocalQueue starts empty at ``now``; half-life 0 resets it, as Kueue)."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = DecayedUsage({}, now)
        elif self.config.usage_half_life_ms <= 0:
            entry.consumed = {}
        else:
            entry.consumed = decayed(
                entry.consumed, current, now - entry.last_update, self.config.usage_half_life_ms
            )
        entry.last_update = max(entry.last_update, now)
        entry.penalties = 0.0
        entry.reported, entry.reported_at = dict(entry.consumed), entry.last_update
        self.version += 1
        return entry

    def charge(
        self, key: str, requests: Mapping[str, float], current: Mapping[str, float], now: int
    ) -> dict[str, float]:
        """A workload of ``key`` was admitted (``current`` already includes it): decay to
        ``now`` and add its entry penalty (Kueue's push and settlement). Returns the penalty."""
        config = self.config
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = DecayedUsage({}, now)
        if config.usage_half_life_ms > 0:
            entry.consumed = decayed(
                entry.consumed, current, now - entry.last_update, config.usage_half_life_ms
            )
        penalty = entry_penalty(requests, config)
        for resource, amount in penalty.items():
            if amount:
                entry.consumed[resource] = entry.consumed.get(resource, 0.0) + amount
        entry.last_update = max(entry.last_update, now)
        entry.penalties += weighted_usage(penalty, 1.0, config.resource_weights)
        self.version += 1
        return penalty
