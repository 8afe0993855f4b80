"""Usage budgets in the operator, without a cluster: ``budgets`` in ``--config`` (problems
named by field), and a new leader's budgets seeded from the store's history (or from now,
without a store)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from phalanx.admission.budgets import Budget, ScopeKind, WhenExceeded
from phalanx.admission.model import ClusterQueue, FlavorQuotas, LocalQueue, ResourceGroup
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.operator.budgets import BudgetKeeper
from phalanx.operator.configfile import ConfigFileError, parse
from phalanx.operator.metrics import Metrics
from phalanx.quotas.resources import ResourceQuota
from phalanx.store import db
from phalanx.store import events as ev

GPU = "nvidia.com/gpu"
HOUR = 3_600_000


def _config(*budgets: Any) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "budgets": list(budgets),
    }


def test_budgets_are_read_in_order() -> None:
    parsed = parse(
        _config(
            {"localQueue": "team-a/main", "resource": GPU, "resourceHours": 400, "period": "168h"},
            {
                "clusterQueue": "research",
                "resource": "cpu",
                "resourceHours": 0.5,
                "period": "24h",
                "periodStart": "2026-11-30T06:00:00+01:00",
                "whenExceeded": "Wait",
            },
        )
    )
    assert parsed.budgets == (
        Budget(ScopeKind.LOCAL_QUEUE, "team-a/main", GPU, 400.0, 168 * HOUR),
        Budget(
            ScopeKind.CLUSTER_QUEUE,
            "research",
            "cpu",
            0.5,
            24 * HOUR,
            anchor_ms=int(dt.datetime(2026, 11, 30, 5, tzinfo=dt.UTC).timestamp() * 1000),
        ),
    )
    assert parse({**_config(), "budgets": None}).budgets == ()


_OK = {"localQueue": "team-a/main", "resource": GPU, "resourceHours": 1, "period": "1h"}


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({**_OK, "period": "a week"}, "budgets[1].period: required, a duration"),
        ({**_OK, "period": "0s"}, "budgets[1].period: must be above 0"),
        ({**_OK, "resourceHours": -1}, "budgets[1].resourceHours: required, a number 0 or more"),
        ({**_OK, "resourceHours": "400"}, "budgets[1].resourceHours:"),
        ({k: v for k, v in _OK.items() if k != "resource"}, "budgets[1].resource: required"),
        ({**_OK, "clusterQueue": "cq"}, "budgets[1]: set exactly one of localQueue"),
        ({**_OK, "localQueue": "main"}, "budgets[1].localQueue: must be namespace/name"),
        ({**_OK, "periodStart": "2026-11-30"}, "budgets[1].periodStart: must be an RFC 3339"),
        ({**_OK, "periodStart": "2026-11-30T00:00:00"}, "budgets[1].periodStart: must be"),
        ({**_OK, "whenExceeded": "Later"}, "budgets[1].whenExceeded: must be one of Wait,"),
        ({**_OK, "gpuHours": 3}, "budgets[1].gpuHours: not a budget field"),
        ({**_OK, "period": "2h"}, "budgets[1]: budgets[0] already limits nvidia.com/gpu of"),
        ("x", "budgets[1]: must be a mapping"),
    ],
)
def test_each_problem_names_its_field(budget: Any, message: str) -> None:
    with pytest.raises(ConfigFileError) as info:
        parse(_config(_OK, budget))
    assert any(p.startswith(message) for p in info.value.problems), info.value.problems


def test_budgets_must_be_a_list() -> None:
    with pytest.raises(ConfigFileError) as info:
        parse({**_config(), "budgets": _OK})
    assert info.value.problems == ["budgets: must be a list of budgets, got dict"]


def test_same_scope_other_resource_is_another_budget() -> None:
    assert len(parse(_config(_OK, {**_OK, "resource": "cpu"})).budgets) == 2


# -- a new leader -----------------------------------------------------------------------------


def _scheduler(budget: Budget) -> Scheduler:
    s = Scheduler(config=SchedulerConfig(budgets=(budget,)))
    group = ResourceGroup((GPU,), (FlavorQuotas("default", {GPU: ResourceQuota(8)}),))
    s.apply_cluster_queue(ClusterQueue("cq", resource_groups=(group,)))
    s.apply_local_queue(LocalQueue("team-a", "main", "cq"))
    return s


def test_a_new_leader_seeds_budgets_from_the_store(tmp_path: Path) -> None:
    """2 GPUs held for the last 3 hours, the window (24h, from midnight) started 12 hours ago:
    6 GPU-hours used; the metrics show it. Without a store: 0, counted from now."""
    url = f"sqlite:///{tmp_path}/store.db"
    engine = db.open_engine(url)
    db.upgrade(engine)
    now = dt.datetime(2026, 12, 3, 12)
    now_ms = int(now.replace(tzinfo=dt.UTC).timestamp() * 1000)
    db.write_events(
        engine,
        [
            ev.Event(
                uid="u1",
                transition=ev.QUOTA_RESERVED,
                at=now - dt.timedelta(hours=3),
                namespace="team-a",
                name="w",
                local_queue="main",
                cluster_queue="cq",
                usage=(ev.Usage(pod_set="main", resource=GPU, flavor="default", amount=2),),
            )
        ],
    )
    engine.dispose()
    budget = Budget(ScopeKind.LOCAL_QUEUE, "team-a/main", GPU, 5.0, 24 * HOUR)
    s = _scheduler(budget)
    metrics = Metrics()
    keeper = BudgetKeeper(s, store_url=url, metrics=metrics)
    asyncio.run(keeper.prefetch(now_ms))
    assert s.budget_usage(now_ms) == [(budget, pytest.approx(6.0))]
    keeper.export(now_ms + HOUR)
    labels = {"scope": "LocalQueue team-a/main", "resource": GPU}
    used = metrics.registry.get_sample_value("phalanx_budget_used_resource_hours", labels)
    limit = metrics.registry.get_sample_value("phalanx_budget_limit_resource_hours", labels)
    assert (used, limit) == (6.0, 5.0)  # nothing running in the core yet

    plain = _scheduler(budget)
    asyncio.run(BudgetKeeper(plain, store_url=None, metrics=Metrics()).prefetch(now_ms))
    assert plain.budget_usage(now_ms + HOUR) == [(budget, 0.0)]


def test_preemptible_is_read() -> None:
    parsed = parse(
        _config(
            {
                "localQueue": "team-a/main",
                "resource": GPU,
                "resourceHours": 4,
                "period": "24h",
                "whenExceeded": "Preemptible",
            }
        )
    )
    assert [b.when_exceeded for b in parsed.budgets] == [WhenExceeded.PREEMPTIBLE]
