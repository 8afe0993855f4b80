"""``phalanx devcluster``: the local control plane (etcd, API server, controller-manager,
scheduler, KWOK GPU nodes) that tests and the demo run against."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from phalanx.devcluster import addons, build, cluster, gomod, kueue_perf, pins
from phalanx.devcluster.topology import TopologyError


def _state_dir(args: argparse.Namespace) -> Path | None:
    value: Path | None = args.state_dir
    return value


def _print_status(st: cluster.ClusterStatus) -> None:
    if not st.components:
        print(f"no devcluster in {st.state_dir} (run: phalanx devcluster up)")
        return
    print(f"state dir:  {st.state_dir}")
    print(f"server:     {st.server}")
    print(f"kubeconfig: {st.kubeconfig}")
    for comp in st.components:
        health = "healthy" if comp.healthy else ("unhealthy" if comp.running else "stopped")
        pid = comp.pid if comp.pid is not None else "-"
        print(f"  {comp.name:<24} {health:<9} pid={pid:<8} {comp.detail}")
    expected = st.expected_nodes if st.expected_nodes is not None else "?"
    print(f"nodes: {st.nodes} ({st.ready_nodes} ready, topology {expected})")
    print("cluster: " + ("healthy" if st.healthy else "NOT healthy"))


def _up(args: argparse.Namespace) -> int:
    try:
        st = cluster.up(
            state_dir=_state_dir(args),
            topology_path=args.topology,
            timeout=args.timeout,
            with_=tuple(args.with_ or ()),
        )
    except (TopologyError, addons.AddonError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (cluster.DevclusterError, build.BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_status(st)
    return 0 if st.healthy else 1


def _down(args: argparse.Namespace) -> int:
    try:
        stopped = cluster.down(state_dir=_state_dir(args), purge=args.purge)
    except cluster.DevclusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def _status(args: argparse.Namespace) -> int:
    st = cluster.status(state_dir=_state_dir(args))
    _print_status(st)
    return 0 if st.healthy else 1


def _kubeconfig(args: argparse.Namespace) -> int:
    st = cluster.status(state_dir=_state_dir(args))
    if not st.kubeconfig.is_file():
        print(
            f"error: no kubeconfig at {st.kubeconfig}; run: phalanx devcluster up", file=sys.stderr
        )
        return 1
    print(st.kubeconfig)
    return 0


def _build(args: argparse.Namespace) -> int:
    try:
        names = _addon_names(args.with_ or [])
        cache = build.ensure_binaries()
        print(cache.bin_dir)
        for name in names:
            print(addons.ensure_built(addons.ADDONS[name]).binary_dir)
        if args.kueue_perf:
            print(kueue_perf.ensure_built().folder)
    except (build.BuildError, addons.AddonError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _addon_names(values: list[str]) -> tuple[str, ...]:
    """``--with`` values; ``all`` names every addon."""
    if any(n.strip() == "all" for v in values for n in v.split(",")):
        return tuple(addons.ADDONS)
    return addons.parse_names(values)


def _gomod(args: argparse.Namespace) -> int:
    root = pins.repo_root()
    try:
        changed = gomod.regenerate(root, build.find_go(), tidy=not args.no_tidy)
    except (gomod.GoModError, build.BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(("rewrote " if changed else "unchanged: ") + str(root / "devcluster/k8s/go.mod"))
    return 0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "devcluster",
        help="local control plane with KWOK GPU nodes",
        description=__doc__,
    )
    commands = parser.add_subparsers(dest="devcluster_command", metavar="ACTION", required=True)

    def add(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, help=help_text, description=help_text
        )
        sub.set_defaults(func=func)
        return sub

    state_help = "state folder (default: $PHALANX_CACHE or ~/.cache/phalanx, then /cluster)"
    up = add("up", _up, "start the cluster (build binaries if needed), or reuse a healthy one")
    up.add_argument(
        "--topology",
        type=Path,
        default=None,
        help="topology file (default: devcluster/topologies/small.yaml)",
    )
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per component")
    up.add_argument(
        "--with",
        dest="with_",
        action="append",
        metavar="ADDON[,ADDON]",
        help=f"also start these controllers beside the cluster ({', '.join(addons.ADDONS)});"
        " built from their pinned Go modules on first use",
    )
    down = add("down", _down, "stop the processes this state folder started")
    down.add_argument("--purge", action="store_true", help="also delete certificates, data, logs")
    status = add(
        "status", _status, "health of each component and the node count (exit 1 if unhealthy)"
    )
    kubeconfig = add("kubeconfig", _kubeconfig, "print the admin kubeconfig path")
    for sub in (up, down, status, kubeconfig):
        sub.add_argument("--state-dir", type=Path, default=None, help=state_help)
    built = add(
        "build", _build, "build the pinned binaries into the cache if missing; print the folder"
    )
    built.add_argument(
        "--with",
        dest="with_",
        action="append",
        metavar="ADDON[,ADDON]",
        help=f"also build these controllers ({', '.join(addons.ADDONS)}, or all); each folder"
        " is printed",
    )
    built.add_argument(
        "--kueue-perf",
        action="store_true",
        help=f"also build Kueue {kueue_perf.KUEUE_VERSION}'s scheduler-performance runner and"
        " minimalkueue (for 'phalanx bench compare'); its folder is printed",
    )
    gm = add("gomod", _gomod, "regenerate devcluster/k8s/go.mod's replaces from the k8s pin")
    gm.add_argument("--no-tidy", action="store_true", help="do not run go mod tidy afterwards")
