"""``phalanx bench explain``: ``explain`` and ``what-if`` latency on a core with many pending
workloads (target: under 1 s each). Hooked into ``bench`` by ``register_explain``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from phalanx.bench.insight_bench import InsightBench, run_insight_bench

__all__ = ["acceptance_problems", "register_explain"]

LIMIT_MS = 1000.0


def register_explain(bench_subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = bench_subparsers.add_parser(
        "explain",
        help="explain and what-if latency on a core with many pending workloads",
        description=(
            "Build a core whose quota is in use (some borrowed) with --pending workloads"
            " waiting, run one cycle, then time explain on pending workloads and what-if on new"
            " ones (p50/p99/max)."
        ),
    )
    parser.add_argument("--pending", type=int, default=15_000, help="pending workloads")
    parser.add_argument(
        "--cluster-queues", type=int, default=50, help="ClusterQueues, 5 per cohort (default 50)"
    )
    parser.add_argument("--explains", type=int, default=2000, help="explain calls timed")
    parser.add_argument("--what-ifs", type=int, default=500, help="what-if calls timed")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless every call took under 1 s"
    )
    parser.set_defaults(func=_run)
    return parser


def acceptance_problems(result: InsightBench) -> list[str]:
    return [
        f"{name} max {stats.max_ms:.1f} ms >= {LIMIT_MS:.0f} ms"
        for name, stats in (("explain", result.explain), ("what-if", result.what_if))
        if stats.max_ms >= LIMIT_MS
    ]


def _run(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--pending", args.pending),
        ("--cluster-queues", args.cluster_queues),
        ("--explains", args.explains),
        ("--what-ifs", args.what_ifs),
    ):
        if value < 1:
            print(f"error: {flag} must be at least 1, got {value}", file=sys.stderr)
            return 2
    result = run_insight_bench(
        pending=args.pending,
        cluster_queues=args.cluster_queues,
        explains=args.explains,
        what_ifs=args.what_ifs,
    )
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(result.text())
    problems = acceptance_problems(result)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if args.check and problems else 0
