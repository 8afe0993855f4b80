"""Usage budgets in the operator: usage restored from the store at a leader's start, metrics.

The core counts each budget's resource-time from the reservations it sees
(``Scheduler.budgets``). A new leader (a restart, a failover) first seeds it with what the
budget used in its current window before, from the usage history store's reservation intervals
(``phalanx.store.budget_usage``): once, before its first cycle, in a worker thread and within
:data:`STORE_READ_SECONDS`, so a slow database never blocks the event loop. Without a store
(or when it does not answer) a budget counts only from the operator's start: logged once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from phalanx.admission.budgets import Budget, ScopeKind
from phalanx.admission.scheduler import Scheduler
from phalanx.operator.metrics import Metrics

__all__ = ["BudgetKeeper"]

logger = logging.getLogger(__name__)

STORE_READ_SECONDS = 30.0


class BudgetKeeper:
    def __init__(self, scheduler: Scheduler, *, store_url: str | None, metrics: Metrics) -> None:
        self.scheduler = scheduler
        self.store_url = store_url
        self.metrics = metrics

    async def prefetch(self, now_ms: int, *, timeout: float = STORE_READ_SECONDS) -> None:
        """Seed every budget with its usage in ``now_ms``'s window up to ``now_ms``."""
        ledger = self.scheduler.budgets
        if ledger is None:
            return
        budgets = ledger.budgets
        used: list[float] | None = None
        if not self.store_url:
            logger.warning(
                "event=budgets_without_store budgets=%d"
                " action=count_from_start (usage before this start is not known)",
                len(budgets),
            )
        else:
            try:
                async with asyncio.timeout(timeout):
                    used = await asyncio.to_thread(self._from_store, budgets, now_ms)
            except TimeoutError:
                logger.warning(
                    "event=budgets_store_timeout timeout_s=%.0f action=count_from_start", timeout
                )
        for index, budget in enumerate(budgets):
            hours = used[index] if used is not None else 0.0
            self.scheduler.restore_budget_usage(index, hours, now_ms)
            if used is not None:
                logger.info(
                    "event=budget_restored scope=%s resource=%s used_hours=%.4f source=store",
                    budget.label,
                    budget.resource,
                    hours,
                )

    def _from_store(self, budgets: tuple[Budget, ...], now_ms: int) -> list[float] | None:
        from phalanx.store.budget_usage import used_resource_hours
        from phalanx.store.db import open_engine

        engine: Any = None
        try:
            engine = open_engine(str(self.store_url), create=False)
            found = []
            for budget in budgets:
                start = budget.window(now_ms)[0]
                scope = (
                    {"local_queue": budget.scope}
                    if budget.kind == ScopeKind.LOCAL_QUEUE
                    else {"cluster_queue": budget.scope}
                )
                found.append(
                    used_resource_hours(
                        engine,
                        resource=budget.resource,
                        since_us=start * 1000,
                        at_us=now_ms * 1000,
                        **scope,
                    )
                )
            return found
        except Exception as error:  # the store is optional: count from the start
            logger.warning(
                "event=budgets_store_unavailable error=%r action=count_from_start", error
            )
            return None
        finally:
            if engine is not None:
                engine.dispose()

    def export(self, now_ms: int) -> None:
        """``phalanx_budget_used_resource_hours`` and ``..._limit_...`` for every budget."""
        for budget, used in self.scheduler.budget_usage(now_ms):
            labels = (budget.label, budget.resource)
            self.metrics.budget_used.labels(*labels).set(used)
            self.metrics.budget_limit.labels(*labels).set(budget.resource_hours)
