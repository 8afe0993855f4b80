"""``phalanx bench explain`` runs small: every explain finds a pending workload's report and
every what-if gets a decision; the timings are counted and the acceptance check reads them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from phalanx.bench.insight_bench import LatencyStats, build, run_insight_bench
from phalanx.cli.bench_explain import acceptance_problems
from phalanx.cli.main import main


def test_a_small_run_times_every_call() -> None:
    result = run_insight_bench(pending=200, cluster_queues=10, explains=50, what_ifs=20)
    assert result.explain.count == 50
    assert result.what_if.count == 20
    assert sum(result.verdicts.values()) == 20
    assert {"Preempt", "Pending"} <= set(result.verdicts)
    assert result.explain.p50_ms <= result.explain.p99_ms <= result.explain.max_ms
    assert acceptance_problems(result) == []


def test_the_built_core_borrows_and_queues() -> None:
    s, admitted = build(pending=100, cluster_queues=10)
    assert admitted > 0
    assert any(n.is_borrowing(("default", "cpu")) for n in (st.node for st in s.queues.values()))
    # The waiting ones, plus running ones that found no quota left to borrow.
    assert sum(st.queue.pending for st in s.queues.values()) >= 100


def test_slow_calls_fail_the_check() -> None:
    result = run_insight_bench(pending=20, cluster_queues=5, explains=5, what_ifs=5)
    slow = LatencyStats(5, 1.0, 2.0, 1500.0)
    problems = acceptance_problems(dataclasses.replace(result, what_if=slow))
    assert problems == ["what-if max 1500.0 ms >= 1000 ms"]


def test_the_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "explain", "--pending", "50", "--cluster-queues", "5", "--json"])
    assert code == 0
    body = json.loads(capsys.readouterr().out)
    assert body["explain"]["count"] > 0 and body["what_if"]["count"] == 500


def test_a_bad_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "explain", "--pending", "0"]) == 2
    assert "--pending must be at least 1" in capsys.readouterr().err
