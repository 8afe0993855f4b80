"""A usage history store of a given size, for measuring the reports on it.

Synthetic Workloads over the last 30 days, each with the four transitions of a plain run
(created, quota reserved, admitted, finished) and the GPUs and CPU its reservation held;
a tenth are preempted once and admitted again. Rows are inserted in bulk with explicit ids.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, insert

from phalanx.store import report
from phalanx.store.models import EventResource, WorkloadEvent

__all__ = ["StoreBenchResult", "fill", "measure"]


@dataclass(frozen=True)
class StoreBenchResult:
    rows: int
    fill_seconds: float
    report_seconds: dict[str, float]


def fill(engine: Engine, *, rows: int, seed: int = 1, chunk: int = 20_000) -> tuple[int, float]:
    """Replace the store's contents with about ``rows`` lifecycle rows; return (rows, seconds)."""
    rng = random.Random(seed)
    started = time.perf_counter()
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    events: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    written = 0
    next_id = 1
    with engine.begin() as connection:
        connection.execute(delete(EventResource))
        connection.execute(delete(WorkloadEvent))

    def flush() -> None:
        nonlocal written
        if not events:
            return
        with engine.begin() as connection:
            connection.execute(insert(WorkloadEvent), events)
            if held:
                connection.execute(insert(EventResource), held)
        written += len(events)
        events.clear()
        held.clear()

    index = 0
    while written + len(events) < rows:
        team = rng.randrange(20)
        namespace, queue, cq = f"team-{team}", f"lq-{team}", f"cq-{team % 5}"
        created = now - dt.timedelta(seconds=rng.uniform(0, 30 * 86400))
        uid = f"uid-{index:08d}"
        base = {"uid": uid, "namespace": namespace, "name": f"job-{index}", "local_queue": queue}
        gpus = rng.choice((1, 2, 4, 8))
        at = created
        plan = ["created", "quota_reserved", "admitted"]
        if rng.random() < 0.1:
            plan += ["evicted", "preempted", "quota_released", "quota_reserved", "admitted"]
        plan.append("finished")
        for transition in plan:
            at += dt.timedelta(seconds=rng.uniform(1, 3600))
            event_id = next_id
            next_id += 1
            events.append(
                {
                    "id": event_id,
                    **base,
                    "transition": transition,
                    "at": created if transition == "created" else at,
                    "cluster_queue": None if transition == "created" else cq,
                    "reason": "Succeeded" if transition == "finished" else None,
                }
            )
            if transition == "quota_reserved":
                held.append(
                    {
                        "event_id": event_id,
                        "pod_set": "main",
                        "resource": "nvidia.com/gpu",
                        "flavor": "h100" if team % 2 else "a100",
                        "amount": gpus,
                    }
                )
        index += 1
        if len(events) >= chunk:
            flush()
    flush()
    return written, time.perf_counter() - started


def measure(engine: Engine, *, since_days: float = 30) -> dict[str, float]:
    """Seconds ``report usage --since {since_days}d`` takes for each grouping."""
    until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    since = until - dt.timedelta(days=since_days)
    took: dict[str, float] = {}
    for by in report.GROUPINGS:
        started = time.perf_counter()
        report.usage(engine, since=since, until=until, by=by)
        took[by] = round(time.perf_counter() - started, 3)
    return took
