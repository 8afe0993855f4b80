"""``phalanx simulate fair-sharing``: a bursty team and a quiet one, replayed through the core;
prints each team's waits side by side (docs/scheduling.md). By default both share one
ClusterQueue, with plain ordering and with admission fair sharing; with ``--cohort`` each has
its own ClusterQueue in one cohort, with fair sharing on what is held now and on decayed
usage (``decayedFairSharing``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from phalanx.bench.fair_sim import CohortTeams, TeamResult, TwoTeams, simulate, simulate_cohort
from phalanx.operator.configfile import parse_duration

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="scheduling scenarios in virtual time (fair-sharing)",
        description="Replay a scheduling scenario through the core in virtual time.",
    )
    kinds = parser.add_subparsers(dest="scenario", metavar="SCENARIO", required=True)
    fair = kinds.add_parser(
        "fair-sharing",
        help="a bursty and a quiet team in one ClusterQueue: plain ordering vs admission fair"
        " sharing",
    )
    defaults = TwoTeams()
    fair.add_argument("--days", type=int, default=defaults.days, help="virtual days (7)")
    fair.add_argument(
        "--cohort",
        action="store_true",
        help="each team its own ClusterQueue in one cohort: fair sharing on what is held now"
        " vs on decayed usage (decayedFairSharing)",
    )
    fair.add_argument(
        "--half-life",
        metavar="DURATION",
        help="usageHalfLifeTime (6h; 24h with --cohort)",
    )
    fair.add_argument(
        "--sampling", default="5m", metavar="DURATION", help="usageSamplingInterval (5m)"
    )
    fair.add_argument("--json", action="store_true", help="print the result as JSON")
    fair.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    half_life_text = args.half_life or ("24h" if args.cohort else "6h")
    try:
        half_life = parse_duration(half_life_text)
        sampling = parse_duration(args.sampling)
    except ValueError as error:
        print(f"error: --half-life/--sampling: {error} is not a duration such as 6h or 5m")
        return 2
    if sampling <= 0 or args.days <= 0:
        print("error: --sampling and --days must be above 0")
        return 2
    half_life_ms, sampling_ms = round(half_life * 1000), round(sampling * 1000)
    runs: dict[str, dict[str, TeamResult]]
    if args.cohort:
        cohort = CohortTeams(days=args.days, half_life_ms=half_life_ms, sampling_ms=sampling_ms)
        runs = {
            "drs-now": simulate_cohort(cohort, decayed=False),
            "drs-decayed": simulate_cohort(cohort, decayed=True),
        }
        about = (
            f"two ClusterQueues of {cohort.gpus // 2} GPUs in a cohort, {cohort.days} days;"
            f" bursty: {cohort.burst_jobs} jobs x {cohort.burst_gpus} GPUs x"
            f" {cohort.burst_hours:g}h daily; quiet: {cohort.quiet_jobs} jobs x"
            f" {cohort.quiet_gpus} GPU x {cohort.quiet_hours:g}h daily at"
            f" {cohort.quiet_at_hours:g}h"
        )
    else:
        scenario = TwoTeams(days=args.days, half_life_ms=half_life_ms, sampling_ms=sampling_ms)
        runs = {
            "plain": simulate(scenario, admission_fair_sharing=False),
            "admission-fair-sharing": simulate(scenario, admission_fair_sharing=True),
        }
        about = (
            f"one ClusterQueue of {scenario.gpus} GPUs, {scenario.days} days; bursty: "
            f"{scenario.burst_jobs} jobs x {scenario.burst_gpus} GPUs x"
            f" {scenario.burst_hours:g}h daily; quiet: {scenario.quiet_gpus} GPU x"
            f" {scenario.quiet_hours:g}h every {scenario.quiet_every_hours:g}h"
        )
    if args.json:
        print(json.dumps({k: [r.as_dict() for r in v.values()] for k, v in runs.items()}))
        return 0
    print(f"{about}; half-life {half_life_text}, sampling {args.sampling}")
    print(
        f"{'ordering':<24} {'team':<7} {'jobs':>5} {'GPU-h':>7} {'mean wait h':>12}"
        f" {'p50':>6} {'p95':>6} {'max':>6}"
    )
    for name, teams in runs.items():
        for team in teams.values():
            row = team.as_dict()
            print(
                f"{name:<24} {team.team:<7} {row['jobs']:>5} {row['gpu_hours']:>7}"
                f" {row['mean_wait_h']:>12} {row['p50_wait_h']:>6} {row['p95_wait_h']:>6}"
                f" {row['max_wait_h']:>6}"
            )
    return 0
