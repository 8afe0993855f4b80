"""``up``, ``down`` and ``status`` of the local control plane.

``up`` is idempotent: a healthy cluster is reused as it is; otherwise whatever is left of ours
is stopped and the five processes are started in order, each waited for before the next, and
the state file is rewritten after every start so that ``down`` can always find what runs.
Certificates and etcd data persist in the state folder across restarts; ``down --purge``
removes them.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from phalanx.devcluster import addons, build, components, nodes, pins, processes
from phalanx.devcluster.components import COMPONENTS, Layout, Ports
from phalanx.devcluster.http import ApiError, Endpoint
from phalanx.devcluster.kubeconfig import write_kubeconfig
from phalanx.devcluster.locks import file_lock
from phalanx.devcluster.pki import CertPair, Pki, ensure_pki
from phalanx.devcluster.processes import ProcessRecord
from phalanx.devcluster.state import ClusterState, load_state, save_state
from phalanx.devcluster.topology import Topology, load_topology

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

_KWOK_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "phalanx:kwok"},
    # KWOK stands in for every kubelet (node status, leases, pod status, deletes, events).
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "cluster-admin",
    },
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "phalanx:kwok"}],
}
_KUBECONFIG_USERS = ("admin", "controller-manager", "scheduler", "kwok")


class DevclusterError(RuntimeError):
    """The cluster could not be started or stopped; the message carries log tails."""


def _stderr_progress(line: str) -> None:
    sys.stderr.write(f"[devcluster] {line}\n")
    sys.stderr.flush()


def default_state_dir() -> Path:
    return pins.cache_root() / "cluster"


def default_topology() -> Path:
    return pins.repo_root() / "devcluster" / "topologies" / "small.yaml"


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str


@dataclass(frozen=True)
class ClusterStatus:
    state_dir: Path
    kubeconfig: Path
    server: str | None
    components: tuple[ComponentStatus, ...]
    nodes: int
    ready_nodes: int
    expected_nodes: int | None

    @property
    def healthy(self) -> bool:
        """The control plane's health; an addon's is its own (``up --with`` restarts it)."""
        core = [c for c in self.components if c.name in COMPONENTS]
        return bool(core) and all(c.healthy for c in core)


def _endpoint(component: str, layout: Layout, ports: Ports) -> Endpoint:
    pki_dir = layout.pki_dir
    admin = CertPair(pki_dir / "admin.crt", pki_dir / "admin.key")
    return Endpoint(components.base_url(component, ports), ca=pki_dir / "ca.crt", client=admin)


def _api(layout: Layout, ports: Ports) -> Endpoint:
    return _endpoint("kube-apiserver", layout, ports)


def _component_status(layout: Layout, state: ClusterState, name: str) -> ComponentStatus:
    record = state.processes.get(name)
    running = record is not None and processes.is_running(record)
    healthy, detail = False, "not running"
    if running:
        healthy, detail = _endpoint(name, layout, state.ports).probe(components.health_path(name))
    return ComponentStatus(
        name=name,
        pid=record.pid if record else None,
        running=running,
        healthy=healthy,
        detail=detail,
    )


def status(*, state_dir: Path | None = None) -> ClusterStatus:
    """Health of each component and the node count, without changing anything."""
    layout = Layout(state_dir or default_state_dir())
    state = load_state(layout)
    if state is None:
        return ClusterStatus(
            state_dir=layout.state_dir,
            kubeconfig=layout.admin_kubeconfig,
            server=None,
            components=(),
            nodes=0,
            ready_nodes=0,
            expected_nodes=None,
        )
    statuses = tuple(_component_status(layout, state, name) for name in COMPONENTS) + tuple(
        _addon_status(runtime) for runtime in addons.running(layout) if runtime.process
    )
    count = nodes.NodeCount(total=0, ready=0)
    if statuses[1].healthy:
        try:
            count = nodes.count_nodes(_api(layout, state.ports))
        except (ApiError, OSError) as exc:
            log.warning("event=node_count_failed error=%s", exc)
    return ClusterStatus(
        state_dir=layout.state_dir,
        kubeconfig=layout.admin_kubeconfig,
        server=components.base_url("kube-apiserver", state.ports),
        components=statuses,
        nodes=count.total,
        ready_nodes=count.ready,
        expected_nodes=state.expected_nodes,
    )


def _addon_status(runtime: addons.AddonRuntime) -> ComponentStatus:
    healthy, detail = addons.healthy(runtime)
    record = runtime.process
    return ComponentStatus(
        name=runtime.addon.name,
        pid=record.pid if record else None,
        running=record is not None and processes.is_running(record),
        healthy=healthy,
        detail=detail,
    )


def _stop_all(layout: Layout, state: ClusterState) -> list[str]:
    """Stop our recorded processes in reverse start order, the addons first; return those
    that would not die."""
    stubborn: list[str] = addons.stop_all(layout)
    _, left = _stop_components(layout, state, reversed(COMPONENTS))
    return stubborn + left


def _stop_components(
    layout: Layout, state: ClusterState, names: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Stop the recorded processes of ``names``, in that order, and record what still runs;
    return the names stopped and, as "name (pid N)", those that would not die."""
    remaining = dict(state.processes)
    stopped: list[str] = []
    stubborn: list[str] = []
    for name in names:
        record = remaining.get(name)
        if record is None:
            continue
        if processes.stop(record):
            del remaining[name]
            stopped.append(name)
        else:
            stubborn.append(f"{name} (pid {record.pid})")
    save_state(
        layout,
        ClusterState(
            ports=state.ports,
            bin_dir=state.bin_dir,
            topology=state.topology,
            expected_nodes=state.expected_nodes,
            processes=remaining,
        ),
    )
    return stopped, stubborn


def down(*, state_dir: Path | None = None, purge: bool = False) -> list[str]:
    """Stop the processes this state folder records (and only those); return their names.

    Raises ``DevclusterError`` if one survives SIGKILL. ``purge`` also deletes the state
    folder (certificates, etcd data, logs).
    """
    layout = Layout(state_dir or default_state_dir())
    if not layout.state_dir.exists():
        return []
    with file_lock(layout.lock_file):
        state = load_state(layout)
        stopped: list[str] = []
        if state is not None:
            stopped = [r.addon.name for r in addons.running(layout) if r.process]
            stopped += [n for n in COMPONENTS if n in state.processes]
            stubborn = _stop_all(layout, state)
            if stubborn:
                raise DevclusterError(f"could not stop: {', '.join(stubborn)}")
        if purge:
            shutil.rmtree(layout.state_dir)
    return stopped


BARE_STOPPED = ("kwok", "kube-scheduler", "kube-controller-manager")
"""What :func:`stop_to_bare` stops: etcd and kube-apiserver are what Kueue's envtest runs."""


def stop_to_bare(*, state_dir: Path | None = None) -> list[str]:
    """Stop KWOK, kube-scheduler and kube-controller-manager of a running control plane and
    leave etcd and kube-apiserver serving: the control plane of Kueue's envtest harness.
    Returns the names stopped. Nothing then keeps nodes' heartbeats, collects garbage or
    finishes namespace deletion; ``up`` finds the plane unhealthy and starts it whole again.

    Raises ``DevclusterError`` when no control plane is recorded there, or one of the three
    survives SIGKILL.
    """
    layout = Layout(state_dir or default_state_dir())
    with file_lock(layout.lock_file):
        state = load_state(layout)
        if state is None:
            raise DevclusterError(f"no local control plane is recorded in {layout.state_dir}")
        stopped, stubborn = _stop_components(layout, state, BARE_STOPPED)
        if stubborn:
            raise DevclusterError(f"could not stop: {', '.join(stubborn)}")
    return stopped


def log_tails(state_dir: Path | None = None, *, lines: int = 25) -> str:
    """The last lines of every component's log, for error reports."""
    layout = Layout(state_dir or default_state_dir())
    parts = []
    for name in COMPONENTS:
        tail = processes.log_tail(layout.log(name), lines=lines)
        parts.append(f"---- {layout.log(name)} (last {lines} lines) ----\n{tail or '(empty)'}")
    return "\n".join(parts)


def _wait_healthy(
    *, name: str, record: ProcessRecord, layout: Layout, ports: Ports, timeout: float
) -> float:
    started = time.monotonic()
    endpoint = _endpoint(name, layout, ports)
    detail = ""
    while time.monotonic() - started < timeout:
        if not processes.is_running(record):
            raise DevclusterError(
                f"{name} exited during start-up; its log {layout.log(name)} ends with:\n"
                + processes.log_tail(layout.log(name), lines=40)
            )
        healthy, detail = endpoint.probe(components.health_path(name))
        if healthy:
            return time.monotonic() - started
        time.sleep(0.25)
    raise DevclusterError(
        f"{name} not healthy after {timeout:.0f}s ({detail}); its log {layout.log(name)} "
        "ends with:\n" + processes.log_tail(layout.log(name), lines=40)
    )


def _write_kubeconfigs(layout: Layout, pki: Pki, ports: Ports) -> None:
    server = components.base_url("kube-apiserver", ports)
    for user in _KUBECONFIG_USERS:
        write_kubeconfig(
            layout.kubeconfig(user),
            server=server,
            ca_cert=pki.ca.cert,
            client=pki.clients[user],
            user=user,
        )


def _start_all(
    *,
    layout: Layout,
    bin_dir: Path,
    topology_path: Path,
    topology: Topology,
    previous: ClusterState | None,
    progress: Progress,
    timeout: float,
) -> None:
    ports = components.choose_ports(previous.ports if previous else None)
    pki = ensure_pki(layout.pki_dir, service_ip=components.SERVICE_IP)
    _write_kubeconfigs(layout, pki, ports)
    shutil.copyfile(pins.repo_root() / "devcluster" / "kwok-stages.yaml", layout.kwok_config)
    shutil.copyfile(pins.repo_root() / "devcluster" / "audit-policy.yaml", layout.audit_policy)
    layout.etcd_data.mkdir(parents=True, exist_ok=True, mode=0o700)
    records: dict[str, ProcessRecord] = {}

    def save() -> None:
        save_state(
            layout,
            ClusterState(
                ports=ports,
                bin_dir=bin_dir,
                topology=topology_path,
                expected_nodes=topology.node_count,
                processes=dict(records),
            ),
        )

    progress(f"starting in {layout.state_dir} (API server port {ports.apiserver})")
    for name in COMPONENTS:
        argv = components.argv(
            name,
            bin_dir=bin_dir,
            layout=layout,
            ports=ports,
            pki=pki,
            profiling=os.environ.get(components.PROFILING_ENV) == "1",
        )
        records[name] = processes.start(name, argv, log_path=layout.log(name), cwd=layout.state_dir)
        save()
        took = _wait_healthy(
            name=name, record=records[name], layout=layout, ports=ports, timeout=timeout
        )
        progress(f"{name} healthy in {took:.1f}s (pid {records[name].pid})")
        if name == "kube-apiserver":
            try:
                _api(layout, ports).json(
                    "POST",
                    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                    body=_KWOK_BINDING,
                )
            except ApiError as exc:
                if exc.status != 409:
                    raise


def up(
    *,
    state_dir: Path | None = None,
    topology_path: Path | None = None,
    progress: Progress = _stderr_progress,
    timeout: float = 120.0,
    with_: tuple[str, ...] = (),
) -> ClusterStatus:
    """Start the cluster (building binaries first if needed) or reuse a healthy one; then
    start the addons named in ``with_`` (:data:`addons.ADDONS`) unless they run already."""
    wanted = addons.parse_names(with_)
    layout = Layout(state_dir or default_state_dir())
    topology_path = (topology_path or default_topology()).resolve()
    topology = load_topology(topology_path)
    with file_lock(
        layout.lock_file,
        on_wait=lambda: progress(f"waiting for another up/down on {layout.state_dir}"),
    ):
        result = _up_locked(
            layout=layout,
            topology_path=topology_path,
            topology=topology,
            progress=progress,
            timeout=timeout,
        )
        if not wanted:
            return result
        state = load_state(layout)
        assert state is not None
        for name in wanted:
            addons.ensure_started(
                layout, addons.ADDONS[name], bin_dir=state.bin_dir, progress=progress
            )
        return status(state_dir=layout.state_dir)


def _up_locked(
    *,
    layout: Layout,
    topology_path: Path,
    topology: Topology,
    progress: Progress,
    timeout: float,
) -> ClusterStatus:
    previous = load_state(layout)
    current = status(state_dir=layout.state_dir)
    if not current.healthy:
        if previous is not None:
            leftovers = _stop_all(layout, previous)
            if leftovers:
                raise DevclusterError(f"could not stop earlier processes: {', '.join(leftovers)}")
        cache = build.ensure_binaries(progress=progress)
        layout.state_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            _start_all(
                layout=layout,
                bin_dir=cache.bin_dir,
                topology_path=topology_path,
                topology=topology,
                previous=previous,
                progress=progress,
                timeout=timeout,
            )
        except BaseException:
            # Leave nothing half-started behind; the logs stay for diagnosis.
            state = load_state(layout)
            if state is not None:
                _stop_all(layout, state)
            raise
        progress(f"control plane up in {time.monotonic() - started:.1f}s")
    else:
        progress(f"reusing the healthy cluster in {layout.state_dir}")
    state = load_state(layout)
    assert state is not None
    if state.topology != topology_path or state.expected_nodes != topology.node_count:
        save_state(
            layout,
            ClusterState(
                ports=state.ports,
                bin_dir=state.bin_dir,
                topology=topology_path,
                expected_nodes=topology.node_count,
                processes=state.processes,
            ),
        )
    api = _api(layout, state.ports)
    synced = nodes.sync_nodes(api, topology)
    if synced.created or synced.updated or synced.deleted:
        progress(
            f"nodes: {synced.created} created, {synced.updated} updated, {synced.deleted} deleted"
        )
    count = nodes.wait_nodes_ready(api, expected=topology.node_count, timeout=timeout)
    if count.ready < topology.node_count:
        raise DevclusterError(
            f"only {count.ready}/{topology.node_count} KWOK nodes became Ready in {timeout:.0f}s\n"
            + log_tails(layout.state_dir)
        )
    progress(f"{count.ready} nodes ready; kubeconfig: {layout.admin_kubeconfig}")
    return status(state_dir=layout.state_dir)
