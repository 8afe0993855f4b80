"""The placement bench engine and its CLI piece, on a small cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random

import pytest

from phalanx.bench.placement import BenchReport, format_report, run_placement_bench, speed_bench
from phalanx.bench.placement_sim import FirstFitPlacer, PhalanxPlacer, simulate
from phalanx.bench.placement_workload import LEVELS, make_cluster, make_jobs
from phalanx.cli import bench_placement


@pytest.fixture(scope="module")
def report() -> BenchReport:
    return run_placement_bench(seed=3, quick=True, jobs=400, shape=(2, 4, 8))


def test_same_stream_same_policy_only_placement_differs() -> None:
    cluster = make_cluster(random.Random(1), blocks=2, racks=4, hosts=8)
    jobs = make_jobs(random.Random(2), count=300, total_gpus=cluster.total_gpus, load=0.9)
    ours = simulate(cluster, jobs, PhalanxPlacer(cluster, levels=LEVELS), warmup=3600)
    theirs = simulate(cluster, jobs, FirstFitPlacer(cluster), warmup=3600)
    assert ours.jobs == theirs.jobs == 300
    assert ours.gangs == theirs.gangs
    # Phalanx packs gangs into racks; opaque hostnames leave first-fit to chance.
    assert ours.single_rack_share > theirs.single_rack_share
    assert 0 < ours.utilisation <= 1 and 0 < theirs.utilisation <= 1


def test_first_fit_fills_nodes_in_name_order() -> None:
    cluster = make_cluster(random.Random(1), blocks=1, racks=1, hosts=4)
    placer = FirstFitPlacer(cluster)
    jobs = make_jobs(random.Random(5), count=50, total_gpus=cluster.total_gpus, load=0.5)
    job = next(j for j in jobs if j.pods == 1 and j.gpus_per_pod == 8)
    first = sorted(n.name for n in cluster.nodes)[0]
    assert placer.start(job) == ((first, 1),)
    placer.finish(job)
    assert placer.start(job) == ((first, 1),)


def test_quality_results_are_deterministic_for_a_seed(report: BenchReport) -> None:
    again = run_placement_bench(seed=3, quick=True, jobs=400, shape=(2, 4, 8))
    assert again.quality == report.quality
    assert again.speed.calls == report.speed.calls


def test_speed_bench_times_every_call() -> None:
    cluster = make_cluster(random.Random(1), blocks=1, racks=2, hosts=8)
    result = speed_bench(random.Random(2), cluster, calls=200)
    assert result.calls == result.placed + result.failed == 200
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms


def test_report_formats_and_serialises(report: BenchReport) -> None:
    text = format_report(report)
    assert "p99" in text and "gangs within one rack" in text and "first-fit" in text
    payload = json.loads(json.dumps(report.to_json()))
    assert payload["quality"][0]["placer"] == "phalanx"
    assert payload["speed"]["nodes"] == 64


def test_acceptance_problems_name_what_is_not_met(report: BenchReport) -> None:
    slow = dataclasses.replace(report, speed=dataclasses.replace(report.speed, p99_ms=12.0))
    swapped = dataclasses.replace(report, quality=(report.quality[1], report.quality[0]))
    assert any("p99" in p for p in bench_placement.acceptance_problems(slow))
    assert any("single-rack" in p for p in bench_placement.acceptance_problems(swapped))


def test_cli_registers_under_bench(
    report: BenchReport, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="phalanx bench")
    bench_placement.register_placement(parser.add_subparsers(dest="what"))
    monkeypatch.setattr(bench_placement, "run_placement_bench", lambda **_: report)
    args = parser.parse_args(["placement", "--json", "--seed", "3"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == 3
    bad = parser.parse_args(["placement", "--load", "0"])
    assert bad.func(bad) == 2
