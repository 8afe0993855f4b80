"""``phalanx bench e2e``: a Kueue scheduler-performance scenario through a real API server.

Registered by ``bench_cmd`` (``register_e2e``). Without ``--kubeconfig`` it starts (or
reuses; with ``--fresh`` empties and restarts; with ``--bare`` also runs the measured part on
etcd and kube-apiserver alone) the local control plane, installs the CRDs and runs a fresh
operator; with it, it drives a cluster where an operator already runs
(``--operator-metrics`` / ``--operator-pid`` then say where to read its API writes and CPU
time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from phalanx.cli.bench_scenario import (
    ScenarioError,
    load_rangespec,
    load_scenario,
    load_topology_file,
)

if TYPE_CHECKING:
    from phalanx.bench.core_replay import Scenario
    from phalanx.bench.result import E2EResult
    from phalanx.bench.tas import TopologySpec

__all__ = ["register_e2e", "run_local"]

REPORT_FIELDS = """\
report fields (--json keys; the text report shows the same figures):
  classes.<name>.avg_time_to_admission_ms
                        average time to admission of the workload class, counted from
                        each Workload's scheduled creation time (the generator's timeline:
                        start of the run + its creationIntervalMs steps), so creates that ran
                        late count against the system; this is what Kueue's rangespec
                        wlClassesMaxAvgTimeToAdmissionMs is checked against
  p50_time_to_admission_ms, p99_time_to_admission_ms
                        the same, over every admitted Workload
  classes.<name>.avg_admission_from_create_ms,
  p50_admission_from_create_ms, p99_admission_from_create_ms
                        time to admission from the Workload's actual creation (first sight,
                        as Kueue's recorder takes it); shown for comparison, never checked
  creation_lag_ms.{max,p50,p99}
                        actual minus scheduled creation time, per created Workload
  operator_rss_mib.{peak,end,samples,max_sample_gap_s}
                        resident memory of the operator process (--operator-pid, or the one
                        the bench starts): peak is the kernel's VmHWM (whole life, start-up
                        included), end is VmRSS when the last Workload finished; sampled from
                        /proc/<pid>/status every 0.5 s (null when the pid is unknown)
  release_latency_ms.{p50,p99,count,mean_cycle_interval}
                        from a Workload's Finished (as the bench's watch saw it) to the next
                        admission seen in its cohort of a Workload that existed by then: how
                        fast a release turns into work, next to the mean time between two
                        scheduling cycles (wall / cycles)
  real_wall_ms, ideal_ms, wall_over_ideal
                        from the origin of the schedule to the last Workload finished, vs
                        the ideal schedule
  api_writes, api_writes_per_admission, api_writes_by_verb, operator_cpu_s, cycles
                        from the operator's /metrics and /proc, over the run
  store_cpu_s, store_cpu_share
                        of operator_cpu_s, what the usage history store cost (its
                        phalanx_store_cpu_seconds; null when the operator ran without one)
  invariant_problems    quota or admission invariants broken during the run, and leaks;
                        for TAS, every admitted Workload's topologyAssignment: all pods
                        placed on the scenario's nodes, the required level (and each
                        slice's) one domain, no node over its allocatable cpu or pods
  tas.{nodes,assignments_checked}
                        TAS scenarios: the KWOK nodes the run created, and the
                        reservations whose topologyAssignment was judged (null otherwise)
  checks.{pass,problems}
                        Kueue's rangespec thresholds and Phalanx's own, as above
"""


def register_e2e(bench: Any) -> None:
    parser = bench.add_parser(
        "e2e",
        help="replay a Kueue scheduler-performance scenario through the API server (real time)",
        description=(
            "Create generator.yaml's queues and Workloads (at their creation intervals) on a"
            " real API server with the Phalanx operator running, finish each Workload"
            " runtimeMs after it is Admitted (as Kueue's runner does), and report wall time,"
            " time to admission per class, usage, API writes per admission and operator CPU."
            " With a rangespec.yaml beside the config, checks Kueue's thresholds (against real"
            " wall time) and Phalanx's own (wall <= 2 x ideal, <= 2 writes per admission)."
            " A TAS scenario (topology: in the config) also gets its nodes, created as KWOK"
            " nodes with the generator's labels and capacity and deleted at the end."
        ),
        epilog=REPORT_FIELDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True, metavar="FILE", help="generator.yaml")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="a cluster where the CRDs are installed and an operator already runs"
        " (default: the local control plane, with a fresh operator)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="devcluster state folder when no --kubeconfig is given (default: the devcluster's)",
    )
    add_control_plane_arguments(parser)
    parser.add_argument("--operator-metrics", metavar="URL", help="with --kubeconfig: its /metrics")
    parser.add_argument(
        "--operator-pid", type=int, metavar="PID", help="with --kubeconfig: its pid"
    )
    parser.add_argument(
        "--concurrency", type=int, default=48, help="requests in flight at most (48)"
    )
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="stop waiting after S seconds (10 x ideal)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="operator log and certificates (a new folder under the cache)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the scenario's objects in the cluster"
    )
    parser.set_defaults(func=_run)


def add_control_plane_arguments(parser: argparse.ArgumentParser) -> None:
    """``--fresh``, ``--bare`` and ``--v1beta1``, shared by ``bench e2e`` and ``bench
    compare``."""
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start the local control plane anew before the run: stop it and delete its state"
        " folder (etcd's data, certificates, logs, every object in it), as Kueue's runner starts"
        " envtest anew each run; without it a healthy control plane is reused",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="--fresh, and once the scenario's nodes and queues are in place stop KWOK,"
        " kube-scheduler and kube-controller-manager, so that the run has etcd and"
        " kube-apiserver alone, as Kueue's envtest has; `phalanx devcluster up` with the same"
        " --state-dir starts the whole plane again",
    )
    parser.add_argument(
        "--v1beta1",
        choices=("served", "off"),
        default="served",
        help="the CRDs the run installs: served (default) serves v1beta1 beside v1beta2, as"
        " an install does by default, and the API server converts every change of a Workload"
        " or queue through the operator's webhook for its v1beta1 watch cache; off installs"
        " them as `phalanx crds --v1beta1 off` writes them (Kueue's envtest CRDs convert"
        " v1beta1 without a webhook)",
    )


def control_plane_problem(args: argparse.Namespace) -> str | None:
    """Why ``--fresh`` (or ``--bare``, which implies it) cannot be taken with these
    arguments: it deletes a state folder, so the folder must be named (never the
    devcluster's default, where the demo lives). ``--v1beta1 off`` chooses the CRDs the run
    installs, so it needs the local control plane too."""
    if args.v1beta1 != "served" and getattr(args, "kubeconfig", None) is not None:
        return (
            "--v1beta1 off chooses the CRDs the run installs on the local control plane; with"
            " --kubeconfig the cluster's own CRDs are used: drop one of the two"
        )
    if not (args.fresh or args.bare):
        return None
    flag = "--bare" if args.bare else "--fresh"
    if getattr(args, "kubeconfig", None) is not None:
        return (
            f"{flag} restarts the local control plane; it cannot empty the cluster that"
            " --kubeconfig names: drop one of the two"
        )
    if args.state_dir is None:
        return (
            f"{flag} deletes the local control plane's state folder: name one of the bench's"
            " own with --state-dir (the default folder is the one `make demo` and your other"
            " work use)"
        )
    return None


def _run(args: argparse.Namespace) -> int:
    from phalanx.bench.e2e import E2EOptions, e2e_problems, run_e2e

    problem = control_plane_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    try:
        scenario = load_scenario(args.config)
        topology = load_topology_file(args.config)
        rangespec_path = args.config.parent / "rangespec.yaml"
        rangespec = load_rangespec(rangespec_path) if rangespec_path.exists() else None
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    unsliced = _balanced_without_slice_size(scenario)
    if unsliced:
        print(
            f"error: {args.config}: {unsliced}: tasConstraint balanced needs sliceSize (the"
            " Workload API requires podSetSliceSize with podSetSliceRequiredTopology); add"
            " sliceSize to that workload",
            file=sys.stderr,
        )
        return 2
    workdir = args.workdir or _default_workdir()
    if args.kubeconfig is None:
        result = run_local(
            scenario,
            topology=topology,
            state_dir=args.state_dir,
            workdir=workdir,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            cleanup=not args.keep,
            fresh=args.fresh,
            bare=args.bare,
            serve_v1beta1=args.v1beta1 == "served",
        )
    else:
        options = E2EOptions(
            kubeconfig=args.kubeconfig,
            workdir=workdir,
            start_operator=False,
            operator_metrics_url=args.operator_metrics,
            operator_pid=args.operator_pid,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            cleanup=not args.keep,
        )
        result = run_e2e(scenario, options, topology=topology)
    problems = rangespec.problems(result.as_bench_result()) if rangespec is not None else []
    problems += e2e_problems(result)
    if args.json:
        payload = result.to_json()
        payload["checks"] = {"pass": not problems, "problems": problems}
        print(json.dumps(payload, indent=2))
    else:
        _print_human(result.to_json(), problems)
    return 0 if not problems else 1


def _balanced_without_slice_size(scenario: Any) -> str | None:
    """The class name of a workload with a slice level but no slice size, if any."""
    for cohort in scenario.cohorts:
        for qset in cohort.queue_sets:
            for wset in qset.workload_sets:
                for template in wset.workloads:
                    request = template.topology
                    if request is not None and request.slice_level and not request.slice_size:
                        return str(template.class_name)
    return None


def run_local(
    scenario: Scenario,
    *,
    topology: TopologySpec | None = None,
    state_dir: Path | None,
    workdir: Path,
    concurrency: int = 48,
    timeout_s: float | None = None,
    cleanup: bool = True,
    fresh: bool = False,
    bare: bool = False,
    serve_v1beta1: bool = True,
) -> E2EResult:
    """Bench e2e on the local control plane (started or reused; with ``fresh``, stopped,
    its state folder deleted, and started anew) with a fresh operator, measuring the API
    server's and etcd's CPU by their pids. ``bare`` implies ``fresh``, and only etcd and
    kube-apiserver run from the end of the set-up on
    (:func:`phalanx.devcluster.cluster.stop_to_bare`);
    ``serve_v1beta1``: the CRDs installed serve v1beta1 (:func:`phalanx.api.crds.generate_crd`)."""
    from phalanx.api.crds import generate_crds
    from phalanx.bench.e2e import E2EOptions, run_e2e
    from phalanx.devcluster import cluster as devcluster

    if fresh or bare:
        devcluster.down(state_dir=state_dir, purge=True)
    status = devcluster.up(state_dir=state_dir)
    pids = {
        c.name: c.pid for c in status.components if c.pid and c.name in ("etcd", "kube-apiserver")
    }
    options = E2EOptions(
        kubeconfig=status.kubeconfig,
        workdir=workdir,
        start_operator=True,
        crds=tuple(
            yaml.safe_load(text) for text in generate_crds(serve_v1beta1=serve_v1beta1).values()
        ),
        concurrency=concurrency,
        timeout_s=timeout_s,
        control_plane_pids=pids,
        cleanup=cleanup,
        operator_service_account=True,
        before_run=partial(devcluster.stop_to_bare, state_dir=state_dir) if bare else None,
    )
    return run_e2e(scenario, options, topology=topology)


def _default_workdir() -> Path:
    from phalanx.devcluster.pins import cache_root

    return cache_root() / "bench-e2e" / time.strftime("%Y%m%d-%H%M%S")


def _print_human(r: dict[str, Any], problems: list[str]) -> None:
    print(f"scenario {r['scenario']}: {r['workloads']} workloads, {r['finished']} finished")
    print(
        f"  real wall {r['real_wall_ms']} ms, ideal {r['ideal_ms']} ms"
        f" ({r['wall_over_ideal']:.2f}x)"
    )
    print(
        f"  admissions {r['admissions']}, evictions {r['evictions']}; time to admission from"
        f" the scheduled creation p50 {r['p50_time_to_admission_ms']} ms,"
        f" p99 {r['p99_time_to_admission_ms']} ms (from the actual creation"
        f" p50 {r['p50_admission_from_create_ms']} ms,"
        f" p99 {r['p99_admission_from_create_ms']} ms)"
    )
    lag = r["creation_lag_ms"]
    print(
        f"  creation lag behind schedule: max {lag['max']} ms, p50 {lag['p50']} ms,"
        f" p99 {lag['p99']} ms"
    )
    rel = r["release_latency_ms"]
    print(
        f"  release to next admission in the cohort: p50 {rel['p50']} ms, p99 {rel['p99']} ms"
        f" ({rel['count']} releases; a cycle every {rel['mean_cycle_interval']} ms)"
    )
    rss = r["operator_rss_mib"]
    if rss is None:
        print("  operator RSS: unknown (no operator pid)")
    else:
        print(
            f"  operator RSS: peak {rss['peak']} MiB, end {rss['end']} MiB"
            f" ({rss['samples']} samples, longest gap {rss['max_sample_gap_s']} s)"
        )
    print(
        f"  operator: {r['api_writes']} API writes ({r['api_writes_per_admission']} per"
        f" admission), CPU {r['operator_cpu_s']} s, {r['cycles']} cycles"
    )
    if r["store_cpu_s"] is not None:
        print(
            f"  usage history store: CPU {r['store_cpu_s']} s"
            f" ({100 * (r['store_cpu_share'] or 0):.1f}% of the operator's)"
        )
    print(f"  writes by kind/verb: {r['api_writes_by_verb']}")
    print(f"  control plane CPU {r['control_plane_cpu_s']}, bench CPU {r['bench_cpu_s']} s")
    if r["v1beta1_served"] is False:
        print("  CRDs installed with v1beta1 not served (--v1beta1 off)")
    if r["stopped_components"]:
        print(f"  stopped before the run (--bare): {', '.join(r['stopped_components'])}")
    print("  workload classes (avg time to admission from the scheduled creation):")
    for name, c in r["classes"].items():
        print(
            f"    {name:24s} count {c['count']:6d}  avg time to admission"
            f" {c['avg_time_to_admission_ms']:8d} ms  (from creation"
            f" {c['avg_admission_from_create_ms']:8d} ms)  evictions {c['evictions']}"
        )
    print("  ClusterQueue classes:")
    for name, c in r["cq_classes"].items():
        print(f"    {name:24s} avg usage {c['avg_usage_pct']:5.1f}%")
    if r["tas"] is not None:
        print(
            f"  TAS: {r['tas']['nodes']} KWOK nodes; {r['tas']['assignments_checked']}"
            " topology assignments checked"
        )
    if r["operator_log"]:
        print(f"  operator log: {r['operator_log']}")
    print("PASS" if not problems else "FAIL")
    for problem in problems:
        print(f"  - {problem}")
