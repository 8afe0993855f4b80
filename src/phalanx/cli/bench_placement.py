"""``phalanx bench placement``: placement speed on 4,096 nodes and quality against first-fit.

Hooked into the ``bench`` command by ``register_placement(bench_subparsers)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from phalanx.bench.placement import BenchReport, format_report, run_placement_bench

__all__ = ["acceptance_problems", "register_placement"]

# Issue 4/6 acceptance: p99 placement time on 4,096 nodes under this many milliseconds.
P99_LIMIT_MS = 10.0
# "Equal" utilisation: within this absolute share of the baseline's.
UTILISATION_TOLERANCE = 0.005


def register_placement(bench_subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = bench_subparsers.add_parser(
        "placement",
        help="topology placement: p50/p99 speed on 4,096 nodes, quality vs first-fit",
        description=(
            "Time placement on a 4,096-node GPU topology, then replay one job stream through"
            " Phalanx's placement and a topology-blind first-fit in virtual time."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--seed", type=int, default=1, help="PRNG seed (default 1)")
    parser.add_argument(
        "--quick", action="store_true", help="smaller streams (about 4x faster, noisier)"
    )
    parser.add_argument(
        "--load",
        type=float,
        default=0.95,
        help="offered GPU load of the quality stream, as a share of capacity (default 0.95)",
    )
    parser.add_argument("--jobs", type=int, help="jobs in the quality stream (default 6000)")
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="Kueue's TASBalancedPlacement on: preferred gangs spread evenly (default off)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless p99 < 10 ms and Phalanx beats first-fit (rack share, stranding)",
    )
    parser.set_defaults(func=_run)
    return parser


def acceptance_problems(report: BenchReport) -> list[str]:
    problems = []
    if report.speed.p99_ms >= P99_LIMIT_MS:
        problems.append(f"p99 {report.speed.p99_ms:.2f} ms is not under {P99_LIMIT_MS} ms")
    ours, baseline = report.quality[0], report.quality[1]
    if ours.single_rack_share <= baseline.single_rack_share:
        problems.append("single-rack share is not ahead of first-fit")
    if ours.stranded_node_share >= baseline.stranded_node_share:
        problems.append("node fragmentation is not below first-fit")
    if ours.stranded_rack_share >= baseline.stranded_rack_share:
        problems.append("rack fragmentation is not below first-fit")
    if ours.utilisation < baseline.utilisation - UTILISATION_TOLERANCE:
        problems.append("utilisation is below first-fit")
    return problems


def _run(args: argparse.Namespace) -> int:
    if not 0 < args.load <= 2 or (args.jobs is not None and args.jobs < 1):
        print("error: --load must be in (0, 2] and --jobs at least 1", file=sys.stderr)
        return 2
    report = run_placement_bench(
        seed=args.seed, quick=args.quick, load=args.load, jobs=args.jobs, balanced=args.balanced
    )
    problems = acceptance_problems(report)
    if args.json:
        payload = report.to_json()
        payload["acceptance"] = {"ok": not problems, "problems": problems}
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(format_report(report))
        for problem in problems:
            print(f"NOT MET: {problem}")
    return 1 if args.check and problems else 0
