"""The operator installed as a cluster runs it, on the local control plane.

``manifests/overlays/devcluster`` applied server-side; the operator process started with the
Deployment's own arguments (``manifests/controller/deployment.yaml``: ``--leader-elect``, the
lease settings, ``--webhook-service``, HTTPS metrics), in-cluster-shaped: no kubeconfig,
``KUBERNETES_SERVICE_HOST``/``_PORT`` and a ServiceAccount folder (``token`` from
``kubectl create token phalanx``, ``ca.crt``, ``namespace``) named by
``PHALANX_SERVICE_ACCOUNT_DIR``.

The API server reaches the webhooks through the Service ``phalanx-system/phalanx-webhook``, as
in a cluster. The devcluster has no pod network and no kube-proxy, so a ClusterIP routes
nowhere; its API server runs with ``--enable-aggregator-routing`` (as some managed clusters
do), which resolves a webhook Service to an address of its EndpointSlices. Each replica gets an
EndpointSlice of its own (``kubernetes.io/service-name: phalanx-webhook``) naming the host's
non-loopback address and its port: the API server refuses loopback addresses in
EndpointSlices, so the operator listens on that address.

Kueue's visibility API goes to the Service ``phalanx-visibility``, which selects the pod the
scheduling replica labels (``phalanx.operator.podlabel``). A replica started with
``pod=True`` gets a Pod object named as it is (the Deployment's pod labels; a nodeSelector no
node has, so it stays Pending, never runs and has no address) and ``POD_NAME``/``POD_NAMESPACE``
as the downward API gives them, so it labels that Pod. No controller turns those pods into
endpoints (they have no IP); :meth:`InClusterInstall.route_visibility` does the
EndpointSlice controller's part: it follows the Service's selector over the Pod objects and
names the host's address and the visibility port of each selected replica.

The operator's ``--config`` is the ConfigMap ``phalanx-config``'s file, as the Deployment
mounts it; ``frameworks`` replaces its ``integrations.frameworks`` (Kueue's names, for instance
``pod`` beside ``batch/job``), as an admin enabling an integration edits that ConfigMap. Only
the local file changes: the ConfigMap in the cluster stays as the overlay ships it.

The API server's audit log (``devcluster/audit-policy.yaml``: every request of a ServiceAccount
of ``phalanx-system``) says which call the operator made and what it was answered: a 403 in it
is tied to the verb, resource and name that needed a rule. Its events carry when the request
was received and answered, and the bound token's ``credential-id``: a replica started with a
token of its own (``start(name, own_token=True)``) is told apart from the others by it, though
all run as the one ServiceAccount.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from operator_fixtures import REPO, free_port

from phalanx.devcluster.components import Layout
from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator.kubeconfig import SERVICE_ACCOUNT_DIR_ENV

OVERLAY = REPO / "manifests" / "overlays" / "devcluster"
DEPLOYMENT = REPO / "manifests" / "controller" / "deployment.yaml"
DEFAULT = REPO / "manifests" / "default"
NAMESPACE = "phalanx-system"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:phalanx"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
CONFIGURATION = "phalanx.kueue.x-k8s.io"
WEBHOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
SLICE_MANAGER = "phalanx-tests"
VISIBILITY_SERVICE = "phalanx-visibility"
MODEL_POD_LABEL = "phalanx-tests/model-pod"
"""On the Pod objects that model replicas' pods (``InClusterInstall.start(pod=True)``)."""


def host_address() -> str:
    """The host's address a UDP socket would leave from (nothing is sent): an address the
    API server accepts in an EndpointSlice, unlike 127.0.0.0/8."""
    try:
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as s:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2: routing decides, no packet leaves
            address = str(s.getsockname()[0])
    except OSError:
        address = socket.gethostbyname(socket.gethostname())
    if address.startswith("127."):
        raise AssertionError(
            "this machine has no non-loopback IPv4 address; the API server refuses loopback "
            "addresses in EndpointSlices, so the webhooks cannot be reached through a Service"
        )
    return address


def deployment_args() -> list[str]:
    """The operator's arguments as the Deployment passes them."""
    docs = [d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def rendered_deployment_args(cluster: ClusterHandle) -> list[str]:
    """The operator's arguments in the Deployment as a cluster gets it:
    ``kubectl kustomize manifests/default`` rendered, its Deployment's container."""
    rendered = cluster.kubectl_ok("kustomize", str(DEFAULT))
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def manifest_lease_settings(args: list[str] | None = None) -> tuple[float, float, float]:
    """(lease duration, renew deadline, retry period) the Deployment runs with: its flags
    (``args``, else those of ``manifests/controller/deployment.yaml``), else the operator's
    defaults (those of LeaderElectionConfig)."""
    from phalanx.operator.leader import LeaderElectionConfig

    defaults = LeaderElectionConfig(namespace=NAMESPACE, identity="-")
    values = {
        "lease-duration": defaults.lease_duration,
        "renew-deadline": defaults.renew_deadline,
        "retry-period": defaults.retry_period,
    }
    for arg in deployment_args() if args is None else args:
        for key in values:
            if arg.startswith(f"--leader-elect-{key}="):
                values[key] = float(arg.split("=", 1)[1])
    return values["lease-duration"], values["renew-deadline"], values["retry-period"]


@dataclass
class AuditEvent:
    verb: str
    group: str
    resource: str
    subresource: str
    name: str
    namespace: str
    uri: str
    code: int
    message: str = ""
    credential: str = ""
    """The bound token's ``credential-id`` (``JTI=...``): which replica sent it."""
    received: float = 0.0
    """When the API server received the request (epoch seconds, microsecond precision)."""
    completed: float = 0.0
    """When it answered it."""

    @property
    def call(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        if self.group:
            what += f".{self.group}"
        return f"{self.verb} {what}" + (f" {self.name}" if self.name else "") + f" -> {self.code}"


class AuditLog:
    """The API server's audit log, read from an offset: the operator's calls and answers."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def events(self, since: int = 0) -> list[AuditEvent]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(since)
            lines = handle.read().splitlines()
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written
            if (event.get("user") or {}).get("username") != ACCOUNT:
                continue
            if event.get("stage") != "ResponseComplete":
                continue
            ref = event.get("objectRef") or {}
            extra = (event.get("user") or {}).get("extra") or {}
            out.append(
                AuditEvent(
                    verb=event.get("verb", ""),
                    group=ref.get("apiGroup", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    name=ref.get("name", ""),
                    namespace=ref.get("namespace", ""),
                    uri=event.get("requestURI", ""),
                    code=int((event.get("responseStatus") or {}).get("code") or 0),
                    message=str((event.get("responseStatus") or {}).get("message") or ""),
                    credential=str((extra.get(CREDENTIAL_ID) or [""])[0]),
                    received=_epoch(event.get("requestReceivedTimestamp")),
                    completed=_epoch(event.get("stageTimestamp")),
                )
            )
        return out


def _epoch(stamp: Any) -> float:
    """An audit timestamp (RFC 3339, microseconds, ``Z``) as epoch seconds; 0 if absent."""
    if not stamp:
        return 0.0
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def credential_id(token: str) -> str:
    """The ``credential-id`` the API server records for a bound ServiceAccount token: its JWT
    ID (the payload is read, not verified)."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return f"JTI={claims['jti']}"


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    health_port: int
    log_offset: int = 0
    credential: str = ""
    """Its token's ``credential-id`` when it got a token of its own, else empty."""
    visibility_port: int = 0
    """Where it serves the visibility API, on the install's host address."""

    def text(self) -> str:
        data = self.log.read_bytes() if self.log.exists() else b""
        return data[self.log_offset :].decode(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM (a leader releases the Lease), then the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None


@dataclass
class InClusterInstall:
    """The overlay applied; replicas started as the Deployment starts its pods."""

    cluster: ClusterHandle
    workdir: Path
    address: str = field(default_factory=host_address)
    audit: AuditLog = field(init=False)
    replicas: dict[str, Replica] = field(default_factory=dict)
    args: list[str] | None = None
    """The Deployment's arguments to start replicas with (``rendered_deployment_args``);
    None: those of ``manifests/controller/deployment.yaml``."""
    frameworks: tuple[str, ...] = ()
    """``integrations.frameworks`` in the ``--config`` file; empty: the ConfigMap's, as is."""

    def __post_init__(self) -> None:
        self.audit = AuditLog(Layout(self.cluster.state_dir).audit_log)
        self.sa_dir = self.workdir / "serviceaccount"
        self.certs = self.workdir / "webhook-certs"
        self.config = self.workdir / "controller_manager_config.yaml"

    # -- install ----------------------------------------------------------------------------

    def apply(self) -> None:
        # The configurations are kopf's to keep: an operator of an earlier module left them
        # with its loopback URL; the overlay's Service form replaces it.
        for kind in WEBHOOK_KINDS:
            self.cluster.kubectl_ok("delete", kind, CONFIGURATION, "--ignore-not-found")
        _point_conversion_at_the_service(self.cluster)
        self.remove_webhook_configurations()  # and the replicas' addresses of an earlier run
        self.cluster.kubectl_ok("apply", "--server-side", "--force-conflicts", "-k", str(OVERLAY))
        assert self.audit.path.exists(), (
            f"no audit log at {self.audit.path}: this devcluster was started before its API "
            "server got --audit-policy-file and --enable-aggregator-routing; restart it "
            "(phalanx devcluster down, then up)"
        )
        self.sa_dir.mkdir(parents=True, exist_ok=True)
        self.refresh_token()
        self.sa_dir.joinpath("ca.crt").write_bytes(self._ca())
        self.sa_dir.joinpath("namespace").write_text(NAMESPACE)
        configmap = json.loads(
            self.cluster.kubectl_ok(
                "get", "configmap", "phalanx-config", "-n", NAMESPACE, "-o", "json"
            )
        )
        text = configmap["data"]["controller_manager_config.yaml"]
        if self.frameworks:
            settings = yaml.safe_load(text)
            settings.setdefault("integrations", {})["frameworks"] = list(self.frameworks)
            text = yaml.safe_dump(settings, sort_keys=False)
        self.config.write_text(text)

    def refresh_token(self) -> str:
        token = self.cluster.kubectl_ok(
            "create", "token", "phalanx", "-n", NAMESPACE, "--duration=2h"
        ).strip()
        self.sa_dir.joinpath("token").write_text(token)
        return token

    def _ca(self) -> bytes:
        entry = yaml.safe_load(self.cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
        if entry.get("certificate-authority-data"):
            return base64.b64decode(entry["certificate-authority-data"])
        return (self.cluster.kubeconfig.parent / entry["certificate-authority"]).read_bytes()

    def remove_webhook_configurations(self) -> None:
        """Persistent (Service) webhooks stay after the operator exits and fail closed: later
        modules' queued Jobs would be refused."""
        for kind in WEBHOOK_KINDS:
            self.cluster.kubectl("delete", kind, CONFIGURATION, "--ignore-not-found")
        self.cluster.kubectl(
            "delete",
            "endpointslices",
            "-n",
            NAMESPACE,
            "-l",
            f"endpointslice.kubernetes.io/managed-by={SLICE_MANAGER}",
        )

    # -- replicas ---------------------------------------------------------------------------

    def _server(self) -> tuple[str, str]:
        server = yaml.safe_load(self.cluster.kubeconfig.read_text())["clusters"][0]["cluster"][
            "server"
        ]
        host, _, port = str(server).removeprefix("https://").rpartition(":")
        return host, port

    def argv(
        self,
        name: str,
        webhook_port: int,
        metrics_port: int,
        health_port: int,
        visibility_port: int | None = None,
    ) -> list[str]:
        """The Deployment's arguments, with what a pod gets from its spec made local: the
        ConfigMap's file, the pod's name and namespace, ports free on this machine, the host
        address to listen on (webhooks, visibility)."""
        out = [sys.executable, "-m", "phalanx.cli.main"]
        for arg in deployment_args() if self.args is None else self.args:
            key = arg.split("=", 1)[0]
            if key == "--config":
                arg = f"--config={self.config}"
            elif key == "--webhook-listen":
                arg = f"--webhook-listen={self.address}"
            elif key == "--webhook-port":
                arg = f"--webhook-port={webhook_port}"
            elif key == "--webhook-cert-dir":
                arg = f"--webhook-cert-dir={self.certs}"  # self-managed, for the Service names
            elif key == "--metrics-port":
                arg = f"--metrics-port={metrics_port}"
            elif key == "--health-probe-port":
                arg = f"--health-probe-port={health_port}"
            elif key == "--visibility-port":
                arg = f"--visibility-port={visibility_port or free_port(self.address)}"
            arg = arg.replace("$(POD_NAMESPACE)", NAMESPACE).replace("$(POD_NAME)", name)
            out.append(arg)
        return [
            *out,
            "--metrics-listen=127.0.0.1",
            "--health-probe-listen=127.0.0.1",
            f"--visibility-listen={self.address}",  # route_visibility() may name it
        ]

    def start(self, name: str, *, own_token: bool = False, pod: bool = False) -> Replica:
        """A replica named ``name`` (its pod name: the Lease identity). ``own_token``: it
        reads a token of its own (``kubectl create token``, as each pod gets its own bound
        token), so the audit log tells its calls apart by ``Replica.credential``; otherwise
        it shares the install's ServiceAccount folder. ``pod``: a Pod object named ``name``
        models its pod, and it gets ``POD_NAME``/``POD_NAMESPACE`` as the Deployment passes
        them (the operator then labels that Pod while it schedules)."""
        sa_dir, credential = self.sa_dir, ""
        if own_token:
            sa_dir = self.workdir / f"serviceaccount-{name}"
            sa_dir.mkdir(parents=True, exist_ok=True)
            token = self.cluster.kubectl_ok(
                "create", "token", "phalanx", "-n", NAMESPACE, "--duration=2h"
            ).strip()
            sa_dir.joinpath("token").write_text(token)
            sa_dir.joinpath("ca.crt").write_bytes(self.sa_dir.joinpath("ca.crt").read_bytes())
            sa_dir.joinpath("namespace").write_text(NAMESPACE)
            credential = credential_id(token)
        webhook_port, metrics_port, health_port = free_port(self.address), free_port(), free_port()
        visibility_port = free_port(self.address)  # both served on the host's address
        self._publish(name, webhook_port)
        host, port = self._server()
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(
            {
                "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port,
                SERVICE_ACCOUNT_DIR_ENV: str(sa_dir),
                "HOME": str(self.workdir),  # no ~/.kube/config to fall back on
            }
        )
        if pod:
            self.create_pod(name)
            env.update({"POD_NAME": name, "POD_NAMESPACE": NAMESPACE})
        log = self.workdir / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        with log.open("ab") as handle:
            process = subprocess.Popen(
                self.argv(name, webhook_port, metrics_port, health_port, visibility_port),
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        replica = Replica(
            name, process, log, metrics_port, health_port, offset, credential, visibility_port
        )
        self.replicas[name] = replica
        return replica

    def _publish(self, name: str, port: int) -> None:
        """This replica's address in the webhook Service: an EndpointSlice of its own."""
        endpoint_slice = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"phalanx-webhook-{name}",
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": "phalanx-webhook",
                    "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
        }
        self.cluster.kubectl_ok("apply", "-f", "-", input=json.dumps(endpoint_slice))

    def unpublish(self, name: str) -> None:
        self.cluster.kubectl("delete", "endpointslice", f"phalanx-webhook-{name}", "-n", NAMESPACE)

    def stop_all(self) -> None:
        for name, replica in list(self.replicas.items()):
            replica.stop()
            self.unpublish(name)
        self.replicas.clear()
        self.cluster.kubectl(
            "delete", "pods", "-n", NAMESPACE, "-l", f"{MODEL_POD_LABEL}=true", "--wait=false"
        )
        self.cluster.kubectl(
            "delete",
            "endpointslices",
            "-n",
            NAMESPACE,
            "-l",
            f"kubernetes.io/service-name={VISIBILITY_SERVICE}",
        )

    # -- pods and the visibility Service ------------------------------------------------------

    def create_pod(self, name: str) -> None:
        """A Pod object for replica ``name``: the Deployment's pod labels, never scheduled."""
        (deployment,) = [
            d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d and d["kind"] == "Deployment"
        ]
        labels = dict(deployment["spec"]["template"]["metadata"]["labels"])
        labels[MODEL_POD_LABEL] = "true"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "serviceAccountName": "phalanx",
                "automountServiceAccountToken": False,
                "nodeSelector": {MODEL_POD_LABEL: "no-such-node"},
                "containers": [{"name": "operator", "image": "phalanx:0.1.0"}],
            },
        }
        self.cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true")
        self.cluster.kubectl_ok("create", "-f", "-", input=json.dumps(pod))

    def pod_labels(self, name: str) -> dict[str, str]:
        pod = json_of(self.cluster, "pod", name, "-n", NAMESPACE)
        return dict(pod["metadata"].get("labels") or {})

    def route_visibility(self) -> list[str]:
        """The EndpointSlice controller's part for ``phalanx-visibility``: the replicas whose
        Pod the Service's selector selects, each named by an EndpointSlice (the host's address,
        its visibility port); the others' slices deleted. Returns the selected names."""
        service = json_of(self.cluster, "service", VISIBILITY_SERVICE, "-n", NAMESPACE)
        selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
        pods = json.loads(
            self.cluster.kubectl_ok("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json")
        )["items"]
        selected = sorted(
            p["metadata"]["name"] for p in pods if p["metadata"]["name"] in self.replicas
        )
        for name, replica in self.replicas.items():
            slice_name = f"{VISIBILITY_SERVICE}-{name}"
            if name not in selected:
                self.cluster.kubectl(
                    "delete", "endpointslice", slice_name, "-n", NAMESPACE, "--ignore-not-found"
                )
                continue
            endpoint_slice = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": slice_name,
                    "namespace": NAMESPACE,
                    "labels": {
                        "kubernetes.io/service-name": VISIBILITY_SERVICE,
                        "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
                    },
                },
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": replica.visibility_port, "protocol": "TCP"}],
                "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
            }
            self.cluster.kubectl_ok("apply", "-f", "-", input=json.dumps(endpoint_slice))
        return selected


def wait_ready(replica: Replica, *, timeout: float = 60.0, leader: bool = True) -> None:
    """Until the replica schedules (leader) or has listed (standby)."""
    line = "event=scheduler_ready" if leader else "event=operator_started"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not replica.alive():
            raise AssertionError(f"{replica.name} exited:\n{replica.tail()}")
        if line in replica.text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{replica.name} not ready after {timeout:.0f}s:\n{replica.tail()}")


def _point_conversion_at_the_service(cluster: ClusterHandle) -> None:
    """A converted CRD that a loopback operator last pointed at its URL gets the generated
    Service form back (the apply would otherwise merge a url and a service into one client
    config, which the API server refuses)."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        generated = yaml.safe_load(path.read_text())
        wanted = ((generated["spec"].get("conversion") or {}).get("webhook") or {}).get(
            "clientConfig"
        )
        name = generated["metadata"]["name"]
        live = cluster.kubectl("get", f"crd/{name}", "-o", "json")
        if not wanted or live.returncode != 0:
            continue
        current = json.loads(live.stdout)["spec"]["conversion"].get("webhook") or {}
        if "url" in (current.get("clientConfig") or {}):
            patch = [
                {"op": "replace", "path": "/spec/conversion/webhook/clientConfig", "value": wanted}
            ]
            cluster.kubectl_ok("patch", f"crd/{name}", "--type=json", "-p", json.dumps(patch))


@contextlib.contextmanager
def installed(
    cluster: ClusterHandle,
    workdir: Path,
    *,
    args: list[str] | None = None,
    frameworks: tuple[str, ...] = (),
) -> Iterator[InClusterInstall]:
    install = InClusterInstall(cluster, workdir, args=args, frameworks=frameworks)
    install.apply()
    try:
        yield install
    finally:
        install.stop_all()
        install.remove_webhook_configurations()


def json_of(cluster: ClusterHandle, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl_ok("get", *args, "-o", "json")))
