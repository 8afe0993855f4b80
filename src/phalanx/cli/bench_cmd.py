"""``phalanx bench``: benchmarks. ``bench core`` replays a Kueue scheduler-performance
scenario through the scheduling core in virtual time.

Other benchmarks plug in as ``bench`` subcommands from their own modules (``bench_placement``
with ``register_placement``, ``bench_e2e`` with ``register_e2e``), found when installed.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from phalanx.bench.core_replay import BenchResult, replay
from phalanx.cli.bench_scenario import (
    ScenarioError,
    load_rangespec,
    load_scenario,
    load_topology_file,
)

__all__ = ["core_problems", "register"]

# Subcommands contributed by other modules: (module, registration function).
_PLUGINS = (
    ("phalanx.cli.bench_placement", "register_placement"),
    ("phalanx.cli.bench_e2e", "register_e2e"),
    ("phalanx.cli.bench_explain", "register_explain"),
    ("phalanx.cli.bench_state", "register_state"),
    ("phalanx.cli.bench_compare", "register_compare"),
)

# Acceptance of issue 3/6 for the baseline: the replay may take at most this much longer
# than the ideal schedule.
WALL_OVER_IDEAL = 1.3


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks (core, ...)",
        description="Benchmarks of Phalanx's parts against Kueue's published scenarios.",
    )
    bench = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    core = bench.add_parser(
        "core",
        help="replay a Kueue scheduler-performance scenario through the core (virtual time)",
        description=(
            "Replay generator.yaml (kubernetes-sigs/kueue test/performance/scheduler format)"
            " through the pure scheduling core in virtual time: workloads arrive at their"
            " creation intervals, run runtimeMs once admitted, restart when preempted. With a"
            " rangespec.yaml beside the config, checks Kueue's thresholds."
        ),
    )
    core.add_argument("--config", type=Path, required=True, metavar="FILE", help="generator.yaml")
    core.add_argument("--json", action="store_true", help="print the result as JSON")
    core.add_argument(
        "--eviction-ms",
        type=int,
        default=0,
        metavar="MS",
        help="virtual time a preempted workload takes to stop (default 0)",
    )
    core.add_argument(
        "--cpu-budget-s",
        type=float,
        default=None,
        metavar="S",
        help="fail if the core uses more CPU seconds than this (default: the virtual wall"
        " time, i.e. the core must keep up in real time)",
    )
    core.set_defaults(func=_run_core)
    for module_name, function in _PLUGINS:
        if importlib.util.find_spec(module_name) is not None:
            getattr(importlib.import_module(module_name), function)(bench)


def core_problems(
    result: BenchResult, *, wall_checks: bool = True, cpu_budget_s: float | None = None
) -> list[str]:
    """Phalanx's own acceptance checks on top of Kueue's rangespec: no invariant broken, the
    schedule within 1.3x of the ideal one, and the core's CPU within budget (by default the
    virtual wall time: the core keeps up in real time)."""
    problems = list(result.invariant_violations)
    if wall_checks and result.virtual_wall_ms > WALL_OVER_IDEAL * result.ideal_ms:
        problems.append(
            f"virtual wall {result.virtual_wall_ms} ms > {WALL_OVER_IDEAL} x ideal"
            f" {result.ideal_ms} ms"
        )
    if cpu_budget_s is None:
        if result.core_cpu_s * 1000 >= result.virtual_wall_ms:
            problems.append(
                f"core CPU {result.core_cpu_s:.2f} s does not keep up with virtual wall"
                f" {result.virtual_wall_ms / 1000:.2f} s"
            )
    elif result.core_cpu_s >= cpu_budget_s:
        problems.append(f"core CPU {result.core_cpu_s:.2f} s >= budget {cpu_budget_s} s")
    return problems


def _run_core(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.config)
        topology = load_topology_file(args.config)
        rangespec_path = args.config.parent / "rangespec.yaml"
        rangespec = load_rangespec(rangespec_path) if rangespec_path.exists() else None
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    placement = None
    if topology is not None:
        from phalanx.cli.bench_topology import build_placement

        placement = build_placement(topology)
    try:
        result = replay(
            scenario,
            placement=placement,
            cpu_clock=time.process_time,
            eviction_ms=args.eviction_ms,
            after_build=_freeze_scenario,
        )
    finally:
        gc.unfreeze()
    problems = rangespec.problems(result) if rangespec is not None else []
    problems += core_problems(result, wall_checks=topology is None, cpu_budget_s=args.cpu_budget_s)
    if args.json:
        payload = result.to_json()
        if rangespec is not None:
            payload["checks"] = {"pass": not problems, "problems": problems}
        print(json.dumps(payload, indent=2))
    else:
        _print_human(result, problems, checked=rangespec is not None)
    return 0 if not problems else 1


def _freeze_scenario() -> None:
    """Keep the pre-built scenario out of the collector's passes (see ``replay``)."""
    gc.collect()
    gc.freeze()


def _print_human(result: BenchResult, problems: list[str], *, checked: bool) -> None:
    print(f"scenario {result.scenario}: {result.workloads} workloads")
    print(
        f"  virtual wall {result.virtual_wall_ms} ms, ideal {result.ideal_ms} ms"
        f" ({result.virtual_wall_ms / max(result.ideal_ms, 1):.2f}x)"
    )
    print(f"  admissions {result.admissions}, evictions {result.evictions}")
    print(
        f"  core CPU {result.core_cpu_s:.2f} s over {result.decisions} decisions"
        f" ({result.us_per_decision:.0f} us/decision, {result.cycles} cycles,"
        f" {result.attempts} flavor assignments)"
    )
    print("  workload classes:")
    for name, c in sorted(result.classes.items()):
        print(
            f"    {name:24s} count {c.count:6d}  avg time to admission"
            f" {c.avg_time_to_admission_ms:8d} ms  evictions {c.evictions}"
        )
    print("  ClusterQueue classes:")
    for name, pct in sorted(result.cq_classes.items()):
        print(f"    {name:24s} avg usage {pct:5.1f}%")
    if checked or problems:
        print("PASS" if not problems else "FAIL")
        for problem in problems:
            print(f"  - {problem}")
