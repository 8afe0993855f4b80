"""The dashboard's usage view: resource-hours over time per team from the usage history store,
and the decayed fair-share view of admission fair sharing.

Usage over time is the usage report's per-bucket query
(:func:`phalanx.store.report.resource_seconds_per_bucket`), read for a window of the last 24
hours, 7 days or 30 days, per LocalQueue, namespace or ClusterQueue, in hourly or daily
buckets (:func:`phalanx.store.plot.bucket_width`, as ``phalanx report usage --plot`` draws
them). The buckets are aligned to whole hours or days (UTC); the last one ends now. The
queries run in a worker thread (:meth:`UsageReader.read`), never on the event loop, and
their result is kept :data:`CACHE_SECONDS` per window and grouping, so many browsers cost one
query. What a viewer may see is cut from the cached result (:func:`usage_view`): a LocalQueue
or namespace only if it may read that namespace, ClusterQueues only with the cluster view.

The fair-share view is live, from the objects: for each ClusterQueue with
``UsageBasedAdmissionFairSharing``, each of its LocalQueues' decayed usage (its status
``fairSharing.admissionFairSharingStatus.consumedResources``, written by the operator) beside
its fair share, its weight (``spec.fairSharing.weight``, 1 by default) over the weights of the
ClusterQueue's LocalQueues.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from phalanx.operator.afs import consumed_from_status
from phalanx.quotas.quantity import QuantityError, parse_quantity
from phalanx.store import db, plot, report

__all__ = [
    "BY",
    "CACHE_SECONDS",
    "WINDOWS",
    "UsageData",
    "UsageReader",
    "buckets_for",
    "fair_share",
    "read_usage",
    "usage_view",
]

WINDOWS = {"24h": dt.timedelta(hours=24), "7d": dt.timedelta(days=7), "30d": dt.timedelta(days=30)}
BY = ("localqueue", "namespace", "clusterqueue")
CACHE_SECONDS = 30.0
GPU = "nvidia.com/gpu"
AFS_MODE = "UsageBasedAdmissionFairSharing"
NO_STORE = (
    "No usage history store: start `phalanx dashboard` with --store URL (the store the "
    "operator writes, its --store), or serve the dashboard from the operator, which reads its "
    "own store (docs/store.md)."
)


@dataclass(frozen=True)
class UsageData:
    """One window's buckets: group -> per bucket -> resource -> base units x seconds."""

    window: str
    by: str
    starts: list[dt.datetime]
    until: dt.datetime
    width: dt.timedelta
    held: Mapping[str, list[dict[str, float]]]


def buckets_for(window: str, now: dt.datetime) -> tuple[dt.datetime, dt.timedelta]:
    """The first bucket's start and the bucket width for ``window`` ending ``now`` (naive
    UTC): as many whole hours (days) as the window holds, aligned to the hour (day), the last
    one the current, partial, one."""
    span = _window(window)
    width = plot.bucket_width(span)
    count = span // width
    epoch = dt.datetime(1970, 1, 1)
    current = epoch + ((now - epoch) // width) * width
    return current - (count - 1) * width, width


def read_usage(engine: Any, *, window: str, by: str, now: dt.datetime) -> UsageData:
    """The buckets of ``window`` per ``by`` (see :data:`BY`), through the report's query."""
    if by not in BY:
        raise ValueError(f"by={by!r}: use one of {', '.join(BY)}")
    since, width = buckets_for(window, now)
    held = report.resource_seconds_per_bucket(engine, since=since, until=now, width=width, by=by)
    starts = []
    start = since
    while start < now:
        starts.append(start)
        start += width
    return UsageData(window=window, by=by, starts=starts, until=now, width=width, held=held)


def usage_view(
    data: UsageData,
    *,
    resource: str,
    can_read: Callable[[str], bool],
    cluster_scoped: bool,
) -> dict[str, Any]:
    """What one viewer sees of ``data``: the groups it may read, each with ``resource``'s
    hours (in its display unit) per bucket and in total; the resources any of them held."""
    head: dict[str, Any] = {
        "window": data.window,
        "by": data.by,
        "resource": resource,
        "unit": report.resource_unit(resource)[0],
        "width": "hour" if data.width <= dt.timedelta(hours=1) else "day",
        "starts": [s.isoformat() + "Z" for s in data.starts],
        "until": data.until.isoformat(timespec="seconds") + "Z",
    }
    if data.by == "clusterqueue" and not cluster_scoped:
        return {
            **head,
            "series": [],
            "resources": [],
            "refused": "Not shown: you may not list ClusterQueues; group by LocalQueue or "
            "namespace.",
        }
    per_unit = 3600 * report.resource_unit(resource)[1]
    series = []
    resources: set[str] = set()
    for group, buckets in sorted(data.held.items()):
        namespace = group.split("/", 1)[0]
        if data.by != "clusterqueue" and not can_read(namespace):
            continue
        hours = [held.get(resource, 0.0) / per_unit for held in buckets]
        for held in buckets:
            resources.update(r for r, v in held.items() if v)
        series.append(
            {"group": group, "hours": [round(h, 6) for h in hours], "total": round(sum(hours), 6)}
        )
    return {**head, "series": series, "resources": sorted(resources | {resource})}


def _window(window: str) -> dt.timedelta:
    span = WINDOWS.get(window)
    if span is None:
        raise ValueError(f"window={window!r}: use one of {', '.join(WINDOWS)}")
    return span


class UsageReader:
    """The store, read off the event loop, each (window, grouping) at most once per ``ttl``.

    ``url`` None: no store (the view says how to enable one)."""

    def __init__(self, url: str | None, *, ttl: float = CACHE_SECONDS) -> None:
        self.url = url
        self.ttl = ttl
        self._engine: Any = None
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, UsageData]] = {}
        self._inflight: dict[tuple[str, str], asyncio.Task[UsageData]] = {}

    async def read(self, *, window: str, by: str) -> UsageData:
        """The cached data, or a fresh read in a worker thread (one per key at a time).
        Raises ValueError for a bad window or grouping, :class:`~phalanx.store.db.StoreError`
        when the store cannot be read."""
        _window(window)
        if by not in BY:
            raise ValueError(f"by={by!r}: use one of {', '.join(BY)}")
        key = (window, by)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        task = self._inflight.get(key)
        if task is None:
            # A task, not the request's own await: a browser that leaves does not cancel the
            # read the others wait for.
            task = asyncio.get_running_loop().create_task(self._fresh(key))
            self._inflight[key] = task
        return await asyncio.shield(task)

    async def _fresh(self, key: tuple[str, str]) -> UsageData:
        try:
            data = await asyncio.to_thread(self._read, *key)
        finally:
            self._inflight.pop(key, None)
        self._cache[key] = (time.monotonic(), data)
        return data

    def _read(self, window: str, by: str) -> UsageData:
        assert self.url is not None
        try:
            with self._lock:
                if self._engine is None:
                    engine = db.open_engine(self.url, create=False)
                    if db.current_revision(engine) is None:
                        engine.dispose()
                        raise db.StoreError(
                            f"store {self.url!r} is empty; the operator creates it (or run "
                            "`phalanx store upgrade`)"
                        )
                    self._engine = engine
            now = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
            return read_usage(self._engine, window=window, by=by, now=now)
        except SQLAlchemyError as error:  # unreachable, locked, a schema from another version
            raise db.StoreError(f"cannot read the store: {error}") from error

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None


# -- the decayed fair-share view ------------------------------------------------------------------


def _weight(obj: Mapping[str, Any]) -> float:
    value = ((obj.get("spec") or {}).get("fairSharing") or {}).get("weight")
    if value is None:
        return 1.0
    try:
        return parse_quantity(str(value), resource="cpu") / 1000
    except QuantityError:
        return 1.0


def fair_share(
    cluster_queues: Mapping[str, Mapping[str, Any]],
    local_queues: Mapping[str, Mapping[str, Any]],
    *,
    can_read: Callable[[str], bool],
    cluster_scoped: bool,
) -> list[dict[str, Any]]:
    """Per ClusterQueue with admission fair sharing, the LocalQueues the viewer may read:
    weight, fair share (weight over the sum of its LocalQueues' weights) and decayed usage
    per resource. Each one's share of the ClusterQueue's decayed usage, and the total, only
    for a viewer with the cluster view (they are sums over every team's queues)."""
    out = []
    for name, cq in sorted(cluster_queues.items()):
        mode = ((cq.get("spec") or {}).get("admissionScope") or {}).get("admissionMode")
        if mode != AFS_MODE:
            continue
        members = sorted(
            (
                lq
                for lq in local_queues.values()
                if (lq.get("spec") or {}).get("clusterQueue") == name
            ),
            key=lambda q: (_meta(q, "namespace"), _meta(q, "name")),
        )
        weights = {id(lq): _weight(lq) for lq in members}
        consumed = {id(lq): consumed_from_status(lq) or {} for lq in members}
        total_weight = sum(weights.values())
        total: dict[str, float] = {}
        for usage in consumed.values():
            for resource, value in usage.items():
                total[resource] = total.get(resource, 0.0) + value
        rows = []
        for lq in members:
            if not can_read(_meta(lq, "namespace")):
                continue
            usage = consumed[id(lq)]
            row: dict[str, Any] = {
                "namespace": _meta(lq, "namespace"),
                "name": _meta(lq, "name"),
                "weight": weights[id(lq)],
                "fair": round(weights[id(lq)] / total_weight, 4) if total_weight else 0.0,
                "consumed": {r: round(v, 3) for r, v in sorted(usage.items())},
            }
            if cluster_scoped:
                row["share"] = {
                    r: round(usage.get(r, 0.0) / v, 4) if v else 0.0
                    for r, v in sorted(total.items())
                }
            rows.append(row)
        if rows:
            out.append(
                {
                    "clusterQueue": name,
                    "total": {r: round(v, 3) for r, v in sorted(total.items())}
                    if cluster_scoped
                    else None,
                    "queues": rows,
                }
            )
    return out


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")
