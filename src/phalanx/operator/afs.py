"""Decayed usage in the operator: restore, sample, and persist it, for LocalQueues or for
ClusterQueues.

The core keeps each LocalQueue's decayed usage (admission fair sharing,
``Scheduler.fair_usage``) and, with Phalanx's decayed fair sharing, each ClusterQueue's
(``Scheduler.decayed_usage``). One :class:`FairUsageKeeper` per kind; below, "LocalQueue"
reads "ClusterQueue" for the second, whose status carries the same
``fairSharing.admissionFairSharingStatus`` beside its ``weightedShare``. Between cycles, the
leader

- restores a LocalQueue it has no usage for (a new leader, a restart, a LocalQueue that just
  joined a ClusterQueue with ``UsageBasedAdmissionFairSharing``) from its status
  ``fairSharing.admissionFairSharingStatus.consumedResources``, as Kueue does (and, as Kueue,
  from ``now``: the time the operator was down does not decay it); when the status has none
  (a LocalQueue migrated from a Kueue without admission fair sharing, or a status lost) and
  the usage history store is configured, it rebuilds the usage from the store's reservations
  of that LocalQueue (``phalanx.store.decay``). Those queries run once per leader, before its
  first cycle, in a worker thread and within :data:`STORE_REBUILD_SECONDS` (:meth:`prefetch`):
  a slow or unreachable database delays the first cycle by at most that, never blocks the
  event loop (liveness, webhooks), and a LocalQueue it did not answer for starts empty;
- samples each LocalQueue every ``usageSamplingInterval``; ``queuestatus`` writes the sampled
  value to the LocalQueue's status (only the leader runs this, so only the leader writes).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, Literal

from phalanx.admission.fair_usage import DecayedUsage, UsageLedger
from phalanx.admission.scheduler import Scheduler
from phalanx.operator.state import ClusterState
from phalanx.quotas.quantity import QuantityError, format_quantity, parse_quantity

__all__ = ["FairUsageKeeper", "consumed_from_status", "decayed_status", "status_of"]

QueueKind = Literal["LocalQueue", "ClusterQueue"]

logger = logging.getLogger(__name__)

STORE_REBUILD_SECONDS = 30.0


def consumed_from_status(queue: Mapping[str, Any]) -> dict[str, float] | None:
    """``consumedResources`` of a LocalQueue (or ClusterQueue) object as floats in Kueue's
    units, or None when its status has no ``admissionFairSharingStatus``."""
    fair = (queue.get("status") or {}).get("fairSharing") or {}
    status = fair.get("admissionFairSharingStatus")
    if not isinstance(status, Mapping):
        return None
    consumed: dict[str, float] = {}
    for resource, quantity in (status.get("consumedResources") or {}).items():
        try:
            # Milli precision whatever the resource: parse as if it were CPU.
            consumed[str(resource)] = parse_quantity(quantity, resource="cpu") / 1000
        except QuantityError:
            logger.warning("event=afs_bad_status resource=%s quantity=%r", resource, quantity)
    return consumed


def status_of(usage: DecayedUsage) -> dict[str, Any]:
    """The LocalQueue's ``status.fairSharing`` for what was last sampled; ``weightedShare`` 0
    as Kueue writes it."""
    return {"weightedShare": 0, "admissionFairSharingStatus": decayed_status(usage)}


def decayed_status(usage: DecayedUsage) -> dict[str, Any]:
    """``admissionFairSharingStatus`` for what was last sampled: quantities at milli
    precision (``750m``), ``lastUpdate`` in RFC 3339."""
    when = dt.datetime.fromtimestamp(usage.reported_at / 1000, tz=dt.UTC)
    return {
        "consumedResources": {
            resource: format_quantity(round(value * 1000), resource="cpu")
            for resource, value in sorted(usage.reported.items())
        },
        "lastUpdate": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


class FairUsageKeeper:
    """Restores, rebuilds and samples the decayed usage of one kind of queue."""

    def __init__(
        self,
        scheduler: Scheduler,
        state: ClusterState,
        *,
        store_url: str | None = None,
        kind: QueueKind = "LocalQueue",
    ) -> None:
        self.scheduler = scheduler
        self.state = state
        self.store_url = store_url
        self.kind: QueueKind = kind
        self._engine: Any = None
        self._rebuilt: dict[str, dict[str, float]] = {}
        """Queue key -> usage rebuilt from the store by :meth:`prefetch`, until used."""

    @property
    def ledger(self) -> UsageLedger | None:
        s = self.scheduler
        return s.fair_usage if self.kind == "LocalQueue" else s.decayed_usage

    def keys(self) -> list[str]:
        """The queues whose decayed usage the core keeps, in order."""
        s = self.scheduler
        if self.ledger is None:
            return []
        return s.fair_sharing_local_queues() if self.kind == "LocalQueue" else sorted(s.queues)

    async def prefetch(self, now_ms: int, *, timeout: float = STORE_REBUILD_SECONDS) -> None:
        """Rebuild from the store, in a worker thread, the usage of every LocalQueue whose
        status has none; :meth:`sync` uses the results. Bounded by ``timeout``: what is not
        answered by then starts empty (a thread cannot be cancelled; its late answer is
        dropped)."""
        if self.ledger is None or not self.store_url:
            return
        keys = [
            key
            for key, obj in self.state.objects[self.kind].items()
            if consumed_from_status(obj) is None
        ]
        if not keys:
            return

        def rebuild() -> dict[str, dict[str, float]]:
            found: dict[str, dict[str, float]] = {}
            for key in keys:
                consumed = self._from_store(key, now_ms)
                if consumed is None:
                    break  # the store is unavailable: it said so once
                if any(consumed.values()):
                    found[key] = consumed
            return found

        try:
            async with asyncio.timeout(timeout):
                self._rebuilt = await asyncio.to_thread(rebuild)
        except TimeoutError:
            logger.warning(
                "event=afs_store_rebuild_timeout kind=%s queues=%d timeout_s=%.0f"
                " action=start_empty",
                self.kind,
                len(keys),
                timeout,
            )

    def sync(self, now_ms: int) -> None:
        """Restore what is missing, then sample what is due."""
        ledger = self.ledger
        if ledger is None:
            return
        for key in self.keys():
            if ledger.get(key) is None:
                self._restore(ledger, key, now_ms)
        every = ledger.config.usage_sampling_interval_ms
        if self.kind == "LocalQueue":
            self.scheduler.sample_fair_usage(now_ms, every=every)
        else:
            self.scheduler.sample_decayed_usage(now_ms, every=every)

    def _restore(self, ledger: UsageLedger, key: str, now_ms: int) -> None:
        obj = self.state.get(self.kind, key)
        consumed = consumed_from_status(obj) if obj is not None else None
        source = "status"
        if consumed is None:
            consumed = self._rebuilt.pop(key, None)
            source = "store"
        if consumed is None:
            return  # the first sample starts it empty, now
        ledger.restore(key, consumed, now_ms)
        logger.info(
            "event=afs_restored kind=%s queue=%s source=%s consumed=%s",
            self.kind,
            key,
            source,
            consumed,
        )

    def _from_store(self, key: str, now_ms: int) -> dict[str, float] | None:
        from phalanx.store.db import StoreError, open_engine
        from phalanx.store.decay import cluster_queue_consumed, local_queue_consumed

        ledger = self.ledger
        assert ledger is not None and self.store_url is not None
        at = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC).replace(tzinfo=None)
        half_life_seconds = ledger.config.usage_half_life_ms / 1000
        try:
            if self._engine is None:
                self._engine = open_engine(self.store_url, create=False)
            if self.kind == "ClusterQueue":
                return cluster_queue_consumed(
                    self._engine, cluster_queue=key, at=at, half_life_seconds=half_life_seconds
                )
            namespace, _, name = key.partition("/")
            return local_queue_consumed(
                self._engine,
                namespace=namespace,
                local_queue=name,
                at=at,
                half_life_seconds=half_life_seconds,
            )
        except (StoreError, Exception) as error:  # the store is optional: start empty
            logger.warning(
                "event=afs_store_unavailable kind=%s queue=%s error=%r", self.kind, key, error
            )
            return None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
