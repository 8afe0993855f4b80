"""Usage budgets: resource-hours per LocalQueue or ClusterQueue per period (a Phalanx extension).

A budget limits how much of one resource (``nvidia.com/gpu``, ``cpu``, any resource name) the
workloads of one LocalQueue or ClusterQueue may hold over time, in resource-hours per window.
Windows are ``period`` long, aligned to ``anchor`` (the Unix epoch unless configured)::

    k           = floor((now - anchor) / period)
    window(now) = [anchor + k x period, anchor + (k + 1) x period)

Usage in a window is every reservation's held amount (Kueue units: CPU in cores, devices as
counts, flavors summed) times the part of its time inside the window: the reservations that
ended in full, the running ones up to ``now``. When a scope's usage has reached its limit, its
workloads wait (``Wait``) until the window resets; a workload started under budget is admitted
whatever it will use (no runtime is predicted), so usage may end above the limit.

Everything is pure: time comes in as milliseconds, the scheduler reports each reservation's
start and end (:meth:`BudgetLedger.start`, :meth:`BudgetLedger.stop`), and the operator seeds
the usage a previous leader counted with :meth:`BudgetLedger.restore`.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "PREEMPTIBLE_NOTE",
    "PREEMPTIBLE_RANK",
    "Budget",
    "BudgetLedger",
    "Exceeded",
    "ScopeKind",
    "WhenExceeded",
    "format_hours",
    "format_time",
]

HOUR_MS = 3_600_000
PREEMPTIBLE_NOTE = "admitted preemptible"
"""Starts the message of a workload admitted over a ``Preemptible`` budget (its QuotaReserved
condition carries it after ``; ``, first so that a truncated message keeps it, and a restarted
scheduler reads it back from there)."""


class ScopeKind(enum.StrEnum):
    LOCAL_QUEUE = "LocalQueue"
    CLUSTER_QUEUE = "ClusterQueue"


class WhenExceeded(enum.StrEnum):
    WAIT = "Wait"
    """Its workloads wait out of the queue until the window resets."""
    PREEMPTIBLE = "Preemptible"
    """Its workloads are admitted, but preemptible: ranked below every priority when another
    workload looks for victims (:data:`PREEMPTIBLE_RANK`)."""


PREEMPTIBLE_RANK = -(2**63)
"""The priority a workload admitted over a ``Preemptible`` budget counts with as a victim."""


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget: ``resource_hours`` of ``resource`` per ``period_ms`` for one scope."""

    kind: ScopeKind
    scope: str
    """``namespace/name`` of a LocalQueue, or a ClusterQueue's name."""
    resource: str
    resource_hours: float
    period_ms: int
    anchor_ms: int = 0
    when_exceeded: WhenExceeded = WhenExceeded.WAIT

    @property
    def label(self) -> str:
        return f"{self.kind.value} {self.scope}"

    def window(self, now: int) -> tuple[int, int]:
        """The window holding ``now``: ``[start, end)`` in milliseconds."""
        start = self.anchor_ms + (now - self.anchor_ms) // self.period_ms * self.period_ms
        return start, start + self.period_ms

    def covers(self, local_queue: str, cluster_queue: str | None) -> bool:
        if self.kind == ScopeKind.LOCAL_QUEUE:
            return local_queue == self.scope
        return cluster_queue == self.scope


@dataclass(frozen=True, slots=True)
class Exceeded:
    """A budget found used up at ``now``: what a waiting workload's explanation says."""

    budget: Budget
    used_hours: float
    window: tuple[int, int]

    @property
    def message(self) -> str:
        b = self.budget
        start, end = self.window
        used = (
            f"{b.label} used {format_hours(self.used_hours)} of its"
            f" {format_hours(b.resource_hours)} {b.resource}-hours for the window"
            f" {format_time(start)}..{format_time(end)}"
        )
        if b.when_exceeded == WhenExceeded.PREEMPTIBLE:
            return f"{PREEMPTIBLE_NOTE} while it runs: {used}"
        return f"{used}; waits until it resets"


def format_hours(hours: float) -> str:
    """Four significant digits, trailing zeros kept to one decimal (``412.0``, ``0.0123``)."""
    text = f"{hours:.4g}"
    return text if "." in text or "e" in text else f"{text}.0"


def format_time(ms: int) -> str:
    """RFC 3339 in UTC, to the minute when that is exact (``2026-11-30T00:00Z``)."""
    when = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    if when.second == 0 and when.microsecond == 0:
        return when.strftime("%Y-%m-%dT%H:%MZ")
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


class _Account:
    """One budget's usage: the resource-milliseconds of ended reservations in the window
    starting at ``window_start``, and the open reservations, kept as sums so that the usage
    at ``now`` costs O(1) however many workloads run (it is read for every head tried)::

        running(now) = rate x (now - since) - weighted
        rate         = sum of the open amounts
        weighted     = sum of amount x (max(start, since) - since)

    ``since`` (the window's start, or the restore time if later) only grows; when it moves,
    ``weighted`` is recomputed once."""

    __slots__ = ("closed", "floor", "open", "rate", "since", "weighted", "window_start")

    def __init__(self) -> None:
        self.window_start = 0
        self.closed = 0.0
        self.floor = 0
        """Open reservations count from here on (what came before is in ``closed``)."""
        self.since = 0
        self.open: dict[str, tuple[int, float]] = {}
        """Workload key -> (start ms, amount held)."""
        self.rate = 0.0
        self.weighted = 0.0

    def move_since(self, since: int) -> None:
        self.since = since
        self.weighted = sum(a * max(0, s - since) for s, a in self.open.values())

    def add(self, key: str, start: int, amount: float) -> None:
        self.remove(key)
        self.open[key] = (start, amount)
        self.rate += amount
        self.weighted += amount * max(0, start - self.since)

    def remove(self, key: str) -> tuple[int, float] | None:
        held = self.open.pop(key, None)
        if held is None:
            return None
        if not self.open:  # no drift left behind by the additions and subtractions
            self.rate = self.weighted = 0.0
        else:
            start, amount = held
            self.rate -= amount
            self.weighted -= amount * max(0, start - self.since)
        return held

    def running(self, now: int) -> float:
        """The open reservations' resource-milliseconds from ``since`` to ``now`` (``now``
        no earlier than any start: the scheduler's time only moves forward)."""
        return max(0.0, self.rate * (now - self.since) - self.weighted)


class BudgetLedger:
    """Resource-time per budget; owned by the ``Scheduler``. Not thread-safe: one caller."""

    __slots__ = ("accounts", "budgets")

    def __init__(self, budgets: tuple[Budget, ...]) -> None:
        self.budgets = budgets
        self.accounts = [_Account() for _ in budgets]

    def start(
        self,
        key: str,
        *,
        local_queue: str,
        cluster_queue: str | None,
        amounts: Mapping[str, float],
        now: int,
    ) -> None:
        """Workload ``key`` reserved ``amounts`` (resource -> Kueue units) at ``now``."""
        for budget, account in zip(self.budgets, self.accounts, strict=True):
            amount = amounts.get(budget.resource, 0.0)
            if amount > 0 and budget.covers(local_queue, cluster_queue):
                account.add(key, now, amount)

    def stop(self, key: str, now: int) -> None:
        """Workload ``key`` released its reservation at ``now``: count it in full."""
        for budget, account in zip(self.budgets, self.accounts, strict=True):
            if key not in account.open:
                continue
            self._roll(budget, account, now)
            held = account.remove(key)
            assert held is not None
            start, amount = held
            account.closed += amount * max(0, now - max(start, account.since))

    def restore(self, index: int, used_hours: float, at: int) -> None:
        """Budget ``index`` had used ``used_hours`` in ``at``'s window up to ``at``, its
        running reservations included: those count from ``at`` on."""
        budget, account = self.budgets[index], self.accounts[index]
        account.window_start = budget.window(at)[0]
        account.closed = used_hours * HOUR_MS
        account.floor = at
        account.move_since(at)

    def used_hours(self, index: int, now: int) -> float:
        """Budget ``index``'s usage in ``now``'s window, running reservations up to ``now``."""
        budget, account = self.budgets[index], self.accounts[index]
        self._roll(budget, account, now)
        return (account.closed + account.running(now)) / HOUR_MS

    def exceeded(
        self,
        *,
        local_queue: str,
        cluster_queue: str | None,
        now: int,
        when: WhenExceeded = WhenExceeded.WAIT,
    ) -> Exceeded | None:
        """The first budget with ``when`` covering the scope that is used up at ``now`` (the
        one whose window resets last when several are), or None."""
        found: Exceeded | None = None
        for index, budget in enumerate(self.budgets):
            if budget.when_exceeded != when or not budget.covers(local_queue, cluster_queue):
                continue
            used = self.used_hours(index, now)
            if used >= budget.resource_hours:
                window = budget.window(now)
                if found is None or window[1] > found.window[1]:
                    found = Exceeded(budget, used, window)
        return found

    @staticmethod
    def _roll(budget: Budget, account: _Account, now: int) -> None:
        start = budget.window(now)[0]
        if start > account.window_start:
            account.window_start, account.closed = start, 0.0
            account.move_since(max(start, account.floor))
