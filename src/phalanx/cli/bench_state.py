"""``phalanx bench state``: the operator's memory with a scenario's objects in its state
(no cluster). Hooked into ``bench`` by ``register_state``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from phalanx.cli.bench_scenario import ScenarioError, load_scenario, load_topology_file

__all__ = ["register_state"]


def register_state(bench_subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = bench_subparsers.add_parser(
        "state",
        help="the operator's memory with a scenario's objects in its state",
        description=(
            "Make the objects bench e2e would create for a scenario (nodes of its topology,"
            " ClusterQueues, LocalQueues, Namespaces, every Workload, as the API server serves"
            " them), pass them through the operator's cache, bridge and core as its informers"
            " would, run one scheduling cycle, and report the process's resident memory before"
            " and after (VmRSS; --max-mib fails the run above a limit). No cluster is needed."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="generator.yaml")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--max-mib",
        type=float,
        metavar="MIB",
        help="exit 1 if the resident memory after filling the state exceeds MIB",
    )
    parser.set_defaults(func=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    from phalanx.bench.state_rss import measure_state

    if args.max_mib is not None and not args.max_mib > 0:
        print(f"error: --max-mib {args.max_mib}: give a size in MiB above 0", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.config)
        topology = load_topology_file(args.config)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    figures = measure_state(scenario, topology)
    out = figures.to_json()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        rss = out["rss_mib"]
        print(
            f"{figures.objects} objects ({figures.workloads} Workloads, {figures.cluster_queues}"
            f" ClusterQueues, {figures.nodes} Nodes): resident {rss['after']} MiB"
            f" ({rss['state']} MiB more than the {rss['before']} MiB before; peak {rss['peak']}"
            f" MiB); ingest {out['ingest_s']} s, one cycle {out['cycle_s']} s admitting"
            f" {figures.admitted_in_cycle}"
        )
    if args.max_mib is not None and figures.rss_after_mib > args.max_mib:
        print(
            f"resident memory {figures.rss_after_mib:.1f} MiB > --max-mib {args.max_mib}",
            file=sys.stderr,
        )
        return 1
    return 0
