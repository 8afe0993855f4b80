"""The five processes of the devcluster: their command lines, ports and health endpoints.

Everything listens on 127.0.0.1 only. Flags are chosen for a cluster with no kubelet and no
network: the API server advertises loopback and does not reconcile the ``kubernetes`` Service
endpoints (a loopback endpoint is invalid); etcd skips fsync because the data is disposable
and a shared CI disk makes fsync latency the API server's bottleneck.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from phalanx.devcluster.pki import Pki

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.244.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

# KWOK renews a node's Lease every quarter of its duration, as the kubelet does. At the
# kubelet's 40 s that is a write every 10 s per node: 64 writes a second for the 640 nodes of
# Kueue's TAS benchmark, about a third of what its Workloads cause, where Kueue's envtest has
# no node heartbeat at all. KWOK's nodes cannot fail, so a renewal every 5 minutes is enough;
# the node lifecycle controller waits 15 minutes (three renewals) before it calls one lost.
NODE_LEASE_SECONDS = 1200
NODE_MONITOR_GRACE = "15m"

# Start order; stop is the reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ports:
        return cls(**{f.name: int(data[f.name]) for f in fields(cls)})

    def values(self) -> tuple[int, ...]:
        return tuple(asdict(self).values())


DEFAULT_PORTS = Ports(
    etcd_client=23790,
    etcd_peer=23800,
    apiserver=16443,
    controller_manager=20257,
    scheduler=20259,
    kwok=20247,
)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_ports(count: int) -> list[int]:
    # Hold all sockets open together so the kernel hands out distinct ports.
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def choose_ports(previous: Ports | None) -> Ports:
    """The ports of the last run if all are free, else the defaults if all are free, else
    free ephemeral ports (e.g. a second devcluster beside the default one)."""
    for candidate in (previous, DEFAULT_PORTS):
        if candidate is not None and all(port_free(p) for p in candidate.values()):
            return candidate
    return Ports(*_ephemeral_ports(len(fields(Ports))))


@dataclass(frozen=True)
class Layout:
    """The files of one devcluster under its state folder."""

    state_dir: Path

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "lock"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.state_dir / "etcd-data"

    @property
    def kwok_config(self) -> Path:
        return self.state_dir / "kwok-stages.yaml"

    @property
    def audit_policy(self) -> Path:
        return self.state_dir / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """Requests of phalanx-system's ServiceAccounts (devcluster/audit-policy.yaml)."""
        return self.logs_dir / "audit.log"

    def kubeconfig(self, user: str) -> Path:
        return self.state_dir / "kubeconfig" / f"{user}.yaml"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("admin")

    def log(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.state_dir / "pids" / f"{component}.pid"


# Set to 1 to serve kube-apiserver's /debug/pprof (to its admin users), for profiling its CPU.
PROFILING_ENV = "PHALANX_DEVCLUSTER_PROFILING"


def argv(
    component: str,
    *,
    bin_dir: Path,
    layout: Layout,
    ports: Ports,
    pki: Pki,
    profiling: bool = False,
) -> list[str]:
    """The command line of ``component``; ``profiling`` serves kube-apiserver's pprof."""
    exe = str(bin_dir / component)
    kcm_kubeconfig = str(layout.kubeconfig("controller-manager"))
    sched_kubeconfig = str(layout.kubeconfig("scheduler"))
    serving = [f"--tls-cert-file={pki.serving.cert}", f"--tls-private-key-file={pki.serving.key}"]
    if component == "etcd":
        client = f"http://127.0.0.1:{ports.etcd_client}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        return [
            exe,
            "--name=phalanx-dev",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=phalanx-dev={peer}",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
    if component == "kube-apiserver":
        return [
            exe,
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            *serving,
            f"--client-ca-file={pki.ca.cert}",
            "--authorization-mode=Node,RBAC",
            # Defaults stay on (NamespaceLifecycle, ServiceAccount, Priority, ResourceQuota,
            # admission webhooks, ...); NodeRestriction is added as a real cluster has it, and
            # OwnerReferencesPermissionEnforcement as OpenShift has it (an owner reference with
            # blockOwnerDeletion needs update on the owner's finalizers).
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",
            # Webhook and conversion Services resolve to an address of their EndpointSlices,
            # not to their ClusterIP: with no kube-proxy nothing routes a ClusterIP here, and
            # the in-cluster install (a Service in front of the operator) is tested so, with a
            # slice naming the host's address.
            "--enable-aggregator-routing=true",
            f"--audit-policy-file={layout.audit_policy}",
            f"--audit-log-path={layout.audit_log}",
            "--audit-log-maxsize=64",
            "--audit-log-maxbackup=1",
            # Request-header (front proxy) auth as a real cluster configures it; without it the
            # controller-manager and scheduler log a missing CA bundle on every start.
            f"--requestheader-client-ca-file={pki.ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.clients['front-proxy-client'].cert}",
            f"--proxy-client-key-file={pki.clients['front-proxy-client'].key}",
            "--allow-privileged=true",
            f"--profiling={'true' if profiling else 'false'}",
            f"--cert-dir={layout.state_dir / 'apiserver-certs'}",
        ]
    if component == "kube-controller-manager":
        return [
            exe,
            f"--kubeconfig={kcm_kubeconfig}",
            f"--authentication-kubeconfig={kcm_kubeconfig}",
            f"--authorization-kubeconfig={kcm_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            *serving,
            f"--client-ca-file={pki.ca.cert}",
            f"--root-ca-file={pki.ca.cert}",
            f"--service-account-private-key-file={pki.service_account_key}",
            "--use-service-account-credentials=true",
            "--controllers=*",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            "--leader-elect=false",
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            "--cluster-name=phalanx-dev",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
        ]
    if component == "kube-scheduler":
        return [
            exe,
            f"--kubeconfig={sched_kubeconfig}",
            f"--authentication-kubeconfig={sched_kubeconfig}",
            f"--authorization-kubeconfig={sched_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            *serving,
            f"--client-ca-file={pki.ca.cert}",
            "--leader-elect=false",
            "--profiling=false",
        ]
    if component == "kwok":
        return [
            exe,
            f"--kubeconfig={layout.kubeconfig('kwok')}",
            f"--config={layout.kwok_config}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--server-address=127.0.0.1:{ports.kwok}",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
        ]
    raise ValueError(f"unknown component {component!r}")


def health_path(component: str) -> str:
    return {
        "etcd": "/health",
        "kube-apiserver": "/readyz",
        "kube-controller-manager": "/healthz",
        "kube-scheduler": "/healthz",
        "kwok": "/healthz",
    }[component]


def base_url(component: str, ports: Ports) -> str:
    return {
        "etcd": f"http://127.0.0.1:{ports.etcd_client}",
        "kube-apiserver": f"https://127.0.0.1:{ports.apiserver}",
        "kube-controller-manager": f"https://127.0.0.1:{ports.controller_manager}",
        "kube-scheduler": f"https://127.0.0.1:{ports.scheduler}",
        "kwok": f"http://127.0.0.1:{ports.kwok}",
    }[component]
