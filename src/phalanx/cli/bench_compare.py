"""``phalanx bench compare``: Kueue's own scheduler-performance runner with minimalkueue, then
``phalanx bench e2e`` on the same scenario, side by side with the ratios.

Registered by ``bench_cmd`` (``register_compare``). Kueue's side is built from its pinned Go
module (``phalanx.devcluster.kueue_perf``) and runs on an envtest control plane made of the
local control plane's own kube-apiserver and etcd binaries; it runs first and alone, then
Phalanx's side runs on the local control plane (started, or reused; with ``--fresh`` started
anew from an empty etcd, as Kueue's side always is; with ``--bare`` also reduced to etcd and
kube-apiserver for the measured run, as Kueue's envtest is) with a fresh operator.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from phalanx.cli.bench_e2e import add_control_plane_arguments, control_plane_problem
from phalanx.cli.bench_scenario import ScenarioError, load_scenario, load_topology_file

__all__ = ["register_compare"]

DEFAULT_TIMEOUT_S = 1800.0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def register_compare(bench: Any) -> None:
    parser = bench.add_parser(
        "compare",
        help="run Kueue's scheduler-performance runner (minimalkueue) and bench e2e side by side",
        description=(
            "Run Kueue v0.19.2's own scheduler-performance runner with minimalkueue"
            " (test/performance/scheduler, built from the Go module proxy into the cache) on an"
            " envtest control plane made of the local control plane's kube-apiserver and etcd,"
            " then 'phalanx bench e2e' on the same generator.yaml, and print both side by side"
            " with the ratios Phalanx/Kueue: wall, average time to admission per workload class"
            " (from first sight, as Kueue's recorder counts it), API-server CPU per admission"
            " and controller CPU per admission. Exit 1 unless both admitted every workload."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, metavar="FILE", help="generator.yaml")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="devcluster state folder for Phalanx's side (default: the devcluster's)",
    )
    add_control_plane_arguments(parser)
    parser.add_argument(
        "--workdir",
        type=Path,
        help="Kueue's output and the operator's log (default: a new folder under the cache)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="S",
        help=f"each side gives up after S seconds (default {int(DEFAULT_TIMEOUT_S)}, for both:"
        " the same patience on each side)",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    problem = control_plane_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.config)
        topology = load_topology_file(args.config)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from phalanx.bench.kueue_compare import (
        KUEUE_ATTEMPTS,
        KueueOutputError,
        compare,
        parse_kueue_output,
        phalanx_side,
        render,
        stopped_early,
    )
    from phalanx.bench.kueue_run import KueueRunError, run_kueue
    from phalanx.cli.bench_e2e import run_local
    from phalanx.devcluster import addons, build, kueue_perf

    workdir = args.workdir or _default_workdir()
    try:
        control_plane = build.ensure_binaries()
        harness = kueue_perf.ensure_built()
    except (build.BuildError, addons.AddonError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    timeout_s = args.timeout or DEFAULT_TIMEOUT_S
    if args.fresh or args.bare:
        # Down before Kueue's side too: nothing of ours idles beside it.
        from phalanx.devcluster import cluster as devcluster

        devcluster.down(state_dir=args.state_dir, purge=True)
    _progress(f"Kueue {kueue_perf.KUEUE_VERSION}: runner + minimalkueue on envtest ({workdir})")
    attempts: list[Path] = []
    try:
        while True:
            output_dir = workdir / ("kueue" if not attempts else f"kueue-{len(attempts) + 1}")
            attempts.append(output_dir)
            kueue_run = run_kueue(
                runner=harness.runner,
                minimalkueue=harness.minimalkueue,
                crd_dir=harness.crd_dir,
                assets_dir=control_plane.bin_dir,
                config=args.config,
                output_dir=output_dir,
                timeout_s=timeout_s,
                enable_tas=topology is not None,
            )
            kueue = parse_kueue_output(
                kueue_run.output_dir,
                apiserver_cpu_s=kueue_run.apiserver_cpu_s,
                etcd_cpu_s=kueue_run.etcd_cpu_s,
            )
            if not stopped_early(kueue) or len(attempts) >= KUEUE_ATTEMPTS:
                break
            _progress(
                f"Kueue's recorder stopped with {kueue.admitted}/{kueue.workloads} workloads"
                f" admitted, {kueue.wall_ms} ms in, before its timeout: its exit check read"
                " stale ClusterQueue status; running Kueue's side again"
                f" ({len(attempts) + 1}/{KUEUE_ATTEMPTS})"
            )
    except (KueueRunError, KueueOutputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    kueue.extra["runs"] = len(attempts)
    _progress("Phalanx: bench e2e on the local control plane")
    result = run_local(
        scenario,
        topology=topology,
        state_dir=args.state_dir,
        workdir=workdir / "phalanx",
        timeout_s=timeout_s,
        fresh=args.fresh,
        bare=args.bare,
        serve_v1beta1=args.v1beta1 == "served",
    )
    e2e = result.to_json()
    (workdir / "phalanx-e2e.json").write_text(json.dumps(e2e, indent=2))
    comparison = compare(scenario.name, kueue, phalanx_side(e2e))
    if args.json:
        payload = comparison.to_json()
        payload["workdir"] = str(workdir)
        print(json.dumps(payload, indent=2))
    else:
        print(render(comparison))
        print(f"  Kueue's output: {kueue_run.output_dir}; bench e2e's: {workdir / 'phalanx'}")
    return 0 if not comparison.problems() else 1


def _progress(line: str) -> None:
    sys.stderr.write(f"[bench compare] {line}\n")
    sys.stderr.flush()


def _default_workdir() -> Path:
    from phalanx.devcluster.pins import cache_root

    return cache_root() / "bench-compare" / time.strftime("%Y%m%d-%H%M%S")
