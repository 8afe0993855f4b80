"""A usage history store of a given size, for measuring the reports on it.

Synthetic Workloads over the last 30 days, each with the four transitions of a plain run
(created, quota reserved, admitted, finished) and the GPUs and CPU its reservation held;
a tenth are preempted once and admitted again. Rows are inserted in bulk with explicit ids,
then the reservation intervals are computed from them in one pass (what the migration that
introduced them does to an existing store; the operator's writes maintain them as they go).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, insert, text

from phalanx.store import db, report
from phalanx.store.models import (
    EventResource,
    Reservation,
    ReservationPreemption,
    ReservationResource,
    WorkloadEvent,
)

__all__ = ["StoreBenchResult", "fill", "measure"]


@dataclass(frozen=True)
class StoreBenchResult:
    rows: int
    fill_seconds: float
    report_seconds: dict[str, float]


def fill(engine: Engine, *, rows: int, seed: int = 1, chunk: int = 20_000) -> tuple[int, float]:
    """Replace the store's contents with about ``rows`` lifecycle rows and their reservation
    intervals; return (rows, seconds)."""
    rng = random.Random(seed)
    started = time.perf_counter()
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    events: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    written = 0
    next_id = 1
    with engine.begin() as connection:
        for table in (
            ReservationPreemption,
            ReservationResource,
            Reservation,
            EventResource,
            WorkloadEvent,
        ):
            connection.execute(delete(table))

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
    with engine.begin() as connection:
        db.rebuild_reservations(connection)
    return written, time.perf_counter() - started


def measure(
    engine: Engine, *, since_days: float = 30, cpu: dict[str, float] | None = None
) -> dict[str, float]:
    """Seconds ``report usage --since {since_days}d`` takes for each grouping. With ``cpu``,
    also the CPU seconds each took: this process's, plus on a PostgreSQL server on this
    machine whose processes it may read, the server's (every child of the postmaster, the
    parallel workers that exited included)."""
    until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    since = until - dt.timedelta(days=since_days)
    took: dict[str, float] = {}
    for by in report.GROUPINGS:
        server = _server_cpu(engine)
        started, own = time.perf_counter(), time.process_time()
        report.usage(engine, since=since, until=until, by=by)
        took[by] = round(time.perf_counter() - started, 3)
        if cpu is not None:
            used = time.process_time() - own
            after = _server_cpu(engine)
            if server is not None and after is not None:
                used += after - server
            cpu[by] = round(used, 3)
    return took


def _server_cpu(engine: Engine) -> float | None:
    """User + system CPU seconds of a local PostgreSQL server so far, None if not readable."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as connection:
        backend = int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
    tick = os.sysconf("SC_CLK_TCK")
    try:
        postmaster = int(_stat(backend)[3])
        total = sum(int(v) for v in _stat(postmaster)[15:17])  # children reaped: cutime, cstime
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = _stat(int(entry.name))
                except OSError:
                    continue
                if int(fields[3]) == postmaster:
                    total += int(fields[13]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return None
    return total / tick


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields (0-based as proc(5) numbers them from 1), the command name
    (which may hold spaces) left out."""
    text_ = Path(f"/proc/{pid}/stat").read_text()
    return [text_[: text_.index(" ")], "comm", *text_[text_.rindex(")") + 2 :].split()]
