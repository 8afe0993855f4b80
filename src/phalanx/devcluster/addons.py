"""Optional controllers beside the local control plane: the real controllers of the kinds
Phalanx integrates (JobSet, ...). Each is an :class:`Addon`: its pinned Go module, how it is
started (:attr:`Addon.arguments`) and the webhook configurations it needs (:attr:`Addon.webhooks`).

Started only when asked (``phalanx devcluster up --with jobset``, or a test fixture calling
:func:`ensure`). Like KWOK, the controller is built from its pinned Go module
(``devcluster/jobset/go.mod``: ``sigs.k8s.io/jobset``) through the module proxy, once, into
its own cache folder, whose name carries the version and a hash of that go.mod/go.sum: adding
or bumping an addon never invalidates the Kubernetes binaries. The build also copies the
module's CRDs (``config/components/crd/bases``) from the Go module cache beside the binary.

JobSet: its manager serves its own admission webhooks (defaulting and validation of JobSets, and
the exclusive-placement pod webhooks) and in a cluster rotates their certificate itself
(``internalCertManagement``), which needs a Service and a Secret. Beside the cluster there is
neither, so its configuration turns internal cert management off and serves the webhooks on
loopback with the devcluster's serving certificate (issued for 127.0.0.1 by the cluster CA);
the Mutating/ValidatingWebhookConfigurations are registered with that URL and CA. Its pod
webhooks are limited to the JobSet's pods (an objectSelector on the
``jobset.sigs.k8s.io/jobset-name`` label) so that every other pod of the cluster never waits on
them. Metrics are off, leader election off; health and readiness probes on a loopback port.

Each addon's process, ports and log live under ``<state dir>/addons/<name>/``; ``down`` stops
them before the control plane.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster import build, components, pins, processes
from phalanx.devcluster.components import Layout
from phalanx.devcluster.http import Endpoint
from phalanx.devcluster.locks import file_lock
from phalanx.devcluster.pki import CertPair
from phalanx.devcluster.processes import ProcessRecord

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


class AddonError(RuntimeError):
    """An addon could not be built or started; the message says why."""


@dataclass(frozen=True)
class Launch:
    """What an addon's start-up knows when it builds the controller's arguments."""

    layout: Layout
    folder: Path
    """The addon's own folder under the state dir (for config files)."""
    cert_dir: Path
    """``tls.crt``/``tls.key``: the devcluster's serving certificate (for 127.0.0.1)."""
    health_port: int
    webhook_port: int


@dataclass(frozen=True)
class Addon:
    name: str
    module: str
    version: str
    package: str
    binary: str
    crd_dir: str
    """Folder of the module holding the CRDs to install."""
    arguments: Callable[[Launch], list[str]]
    """The controller's arguments after ``--kubeconfig`` (writes any config file it names
    into ``Launch.folder``)."""
    webhooks: Callable[[int, bytes], list[dict[str, Any]]] | None = None
    """The webhook configurations to register once it is ready, from its webhook port and
    the CA bundle (None: it serves none)."""
    health_path: str = "/readyz"
    crd_glob: str = "*.yaml"
    """Which files of :attr:`crd_dir` are the CRDs to install."""
    sources: tuple[str, ...] = ()
    """Files of :attr:`gomod_dir` beside go.mod/go.sum that the build compiles (a main of
    our own): they key the cache folder too, so that changing one rebuilds."""
    environment: Callable[[Launch], dict[str, str]] | None = None
    """Variables set for the controller's process on top of ours (None: ours as they are)."""
    requires: tuple[str, ...] = ()
    """Addons that must run beside it (started first when it is asked for)."""

    @property
    def gomod_dir(self) -> str:
        return f"devcluster/{self.name}"


_JOBSET_WEBHOOK_LABEL = "jobset.sigs.k8s.io/jobset-name"


def parse_names(values: Iterable[str]) -> tuple[str, ...]:
    """``--with jobset,foo --with bar`` -> the known addon names, each after the addons it
    requires (added when not named); unknown ones are refused."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in ADDONS]
    if unknown:
        raise AddonError(
            f"unknown addon(s) {', '.join(unknown)}: the devcluster can start {', '.join(ADDONS)}"
        )
    ordered: dict[str, None] = {}
    for name in names:
        ordered.update(dict.fromkeys(ADDONS[name].requires))
        ordered[name] = None
    return tuple(ordered)


# -- build --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddonCache:
    key: str
    folder: Path

    @property
    def binary_dir(self) -> Path:
        return self.folder / "bin"

    @property
    def crd_dir(self) -> Path:
        return self.folder / "crds"

    def complete(self, addon: Addon) -> bool:
        binary = self.binary_dir / addon.binary
        return binary.is_file() and any(self.crd_dir.glob("*.yaml"))


def addon_cache(addon: Addon, root: Path | None = None) -> AddonCache:
    return module_cache(
        addon.name, addon.version, gomod_dir=addon.gomod_dir, sources=addon.sources, root=root
    )


def module_cache(
    name: str,
    version: str,
    *,
    gomod_dir: str,
    sources: tuple[str, ...] = (),
    root: Path | None = None,
) -> AddonCache:
    """The cache folder of what one of our Go modules (``gomod_dir``) builds:
    ``<name>-<version>-<hash of its go.mod, go.sum and sources>``."""
    root = root or pins.repo_root()
    digest = hashlib.sha256()
    for rel in ("go.mod", "go.sum", *sources):
        path = root / gomod_dir / rel
        if not path.is_file():
            raise AddonError(f"{gomod_dir}/{rel} is missing from the checkout at {root}")
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    key = f"{name}-{version}-{digest.hexdigest()[:10]}"
    return AddonCache(key=key, folder=pins.cache_root() / key)


def ensure_built(
    addon: Addon, *, root: Path | None = None, progress: Progress = build._stderr_progress
) -> AddonCache:
    """Build the addon's controller and copy its CRDs into its cache folder, unless there."""
    root = root or pins.repo_root()
    cache = addon_cache(addon, root)
    if cache.complete(addon):
        return cache
    cache.folder.mkdir(parents=True, exist_ok=True)
    with file_lock(
        cache.folder / "build.lock",
        on_wait=lambda: progress(f"waiting for another build into {cache.folder}"),
    ):
        if cache.complete(addon):
            return cache
        go = build.find_go(progress=progress)
        module_dir = root / addon.gomod_dir
        binary = cache.binary_dir / addon.binary
        if not binary.is_file():
            cache.binary_dir.mkdir(parents=True, exist_ok=True)
            progress(
                f"building {addon.module}@{addon.version} into {cache.binary_dir}; "
                "a first build compiles client-go and controller-runtime: minutes"
            )
            build.build_one(
                go=go,
                root=root,
                name=addon.binary,
                out=binary,
                progress=progress,
                label="[addon]",
                package=addon.package,
                module_dir=module_dir,
            )
        _copy_crds(addon, go=go, module_dir=module_dir, into=cache.crd_dir)
    return cache


def _copy_crds(addon: Addon, *, go: Path, module_dir: Path, into: Path) -> None:
    copy_module_files(
        go=go,
        module=addon.module,
        version=addon.version,
        module_dir=module_dir,
        folder=addon.crd_dir,
        glob=addon.crd_glob,
        into=into,
    )


def copy_module_files(
    *, go: Path, module: str, version: str, module_dir: Path, folder: str, glob: str, into: Path
) -> None:
    """Copy ``folder/glob`` of ``module@version`` (from the Go module cache, downloaded through
    the module proxy if needed) into ``into``."""
    proc = subprocess.run(
        [str(go), "mod", "download", "-json", f"{module}@{version}"],
        cwd=module_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise AddonError(f"go mod download {module}@{version}: {proc.stderr.strip()}")
    source = Path(json.loads(proc.stdout)["Dir"]) / folder
    files = sorted(source.glob(glob))
    if not files:
        raise AddonError(f"no {glob} files in {source}")
    into.mkdir(parents=True, exist_ok=True)
    for file in files:
        target = into / file.name
        shutil.copyfile(file, target)
        target.chmod(0o644)  # the module cache is read-only


# -- run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddonRuntime:
    """Where one addon runs: its folder under the state dir, ports and process."""

    addon: Addon
    folder: Path
    health_port: int
    webhook_port: int
    process: ProcessRecord | None

    @property
    def state_file(self) -> Path:
        return self.folder / "state.json"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.addon.name}.log"

    def to_json(self) -> dict[str, Any]:
        return {
            "health_port": self.health_port,
            "webhook_port": self.webhook_port,
            "process": self.process.to_json() if self.process else None,
        }


def _folder(layout: Layout, addon: Addon) -> Path:
    return layout.state_dir / "addons" / addon.name


def load(layout: Layout, addon: Addon) -> AddonRuntime | None:
    folder = _folder(layout, addon)
    try:
        data = json.loads((folder / "state.json").read_text())
    except FileNotFoundError:
        return None
    process = data.get("process")
    return AddonRuntime(
        addon=addon,
        folder=folder,
        health_port=int(data["health_port"]),
        webhook_port=int(data["webhook_port"]),
        process=ProcessRecord.from_json(addon.name, process) if process else None,
    )


def _save(runtime: AddonRuntime) -> None:
    runtime.folder.mkdir(parents=True, exist_ok=True)
    tmp = runtime.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(runtime.to_json(), indent=2) + "\n")
    tmp.replace(runtime.state_file)


def healthy(runtime: AddonRuntime | None) -> tuple[bool, str]:
    if runtime is None or runtime.process is None or not processes.is_running(runtime.process):
        return False, "not running"
    return Endpoint(f"http://127.0.0.1:{runtime.health_port}").probe(runtime.addon.health_path)


def running(layout: Layout) -> list[AddonRuntime]:
    """The addons this state folder records (running or not)."""
    return [r for a in ADDONS.values() if (r := load(layout, a)) is not None]


def stop_all(layout: Layout) -> list[str]:
    """Stop every recorded addon process; return the names of those that would not die."""
    stubborn = []
    for runtime in running(layout):
        if runtime.process is None:
            continue
        if processes.stop(runtime.process):
            _save(
                AddonRuntime(
                    runtime.addon, runtime.folder, runtime.health_port, runtime.webhook_port, None
                )
            )
        else:
            stubborn.append(f"{runtime.addon.name} (pid {runtime.process.pid})")
    return stubborn


def _manager_config(
    api_version: str,
    launch: Launch,
    *,
    cert_management: str = "internalCertManagement",
    cert_dir: bool = True,
) -> dict[str, Any]:
    """A controller-runtime manager's Configuration (JobSet's, LWS's and the Trainer's share
    the shape): leader election and metrics off, probes on loopback. ``cert_management`` is
    the kind's name for its certificate rotation, turned off; ``cert_dir`` False for a kind
    whose webhook settings have no ``certDir`` (the Trainer: see
    :func:`_trainer_environment`)."""
    webhook: dict[str, Any] = {"host": "127.0.0.1", "port": launch.webhook_port}
    if cert_dir:
        webhook["certDir"] = str(launch.cert_dir)
    return {
        "apiVersion": api_version,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        # No Service or Secret beside the cluster: the webhooks are served on loopback with
        # the devcluster's serving certificate instead of a rotated one.
        cert_management: {"enable": False},
        "webhook": webhook,
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{launch.health_port}"},
    }


def _loopback_webhook(
    name: str,
    *,
    port: int,
    ca_bundle: bytes,
    path: str,
    rule: tuple[str, str, str],
    operations: list[str],
    object_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One webhook of an addon's configuration, called on its loopback port with the cluster
    CA; ``rule`` is (group, version, resource)."""
    group, version, resource = rule
    webhook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca_bundle).decode(),
        },
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 10,
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": [version],
                "operations": operations,
                "resources": [resource],
            }
        ],
    }
    if object_selector is not None:
        webhook["objectSelector"] = object_selector
    return webhook


def _configurations(
    addon: str,
    *,
    mutating: list[dict[str, Any]] | None = None,
    validating: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """An addon's Mutating/ValidatingWebhookConfigurations, ``phalanx-devcluster-<addon>-*``,
    holding its webhooks (a kind with none is left out)."""
    kinds = (("mutating", "Mutating", mutating), ("validating", "Validating", validating))
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": f"{kind}WebhookConfiguration",
            "metadata": {"name": f"phalanx-devcluster-{addon}-{suffix}"},
            "webhooks": hooks,
        }
        for suffix, kind, hooks in kinds
        if hooks
    ]


def _jobset_config(launch: Launch) -> dict[str, Any]:
    return _manager_config("config.jobset.x-k8s.io/v1alpha1", launch)


def _jobset_arguments(launch: Launch) -> list[str]:
    config = launch.folder / "config.yaml"
    config.write_text(yaml.safe_dump(_jobset_config(launch), sort_keys=False))
    return [
        f"--config={config}",
        "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{launch.health_port}",
        "--zap-devel=false",
        "--zap-log-level=info",
    ]


def jobset_webhooks(*, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """JobSet's webhook configurations (its config/components/webhook/manifests.yaml) with a
    loopback URL; the pod webhooks only for the JobSet's pods."""
    jobset_pods = {"matchExpressions": [{"key": _JOBSET_WEBHOOK_LABEL, "operator": "Exists"}]}

    def hook(
        name: str, path: str, group: str, version: str, resource: str, ops: list[str]
    ) -> dict[str, Any]:
        return _loopback_webhook(
            name,
            port=port,
            ca_bundle=ca_bundle,
            path=path,
            rule=(group, version, resource),
            operations=ops,
            object_selector=jobset_pods if resource == "pods" else None,
        )

    js = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
    return _configurations(
        "jobset",
        mutating=[
            hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", *js, ["CREATE"]),
            hook("mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods", ["CREATE"]),
        ],
        validating=[
            hook(
                "vjobset.kb.io",
                "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                *js,
                ["CREATE", "UPDATE"],
            ),
            hook("vpod.kb.io", "/validate--v1-pod", "", "v1", "pods", ["CREATE"]),
        ],
    )


def _kubectl(bin_dir: Path, layout: Layout, *args: str, input: str | None = None) -> str:
    proc = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={layout.admin_kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise AddonError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def ensure_started(
    layout: Layout,
    addon: Addon,
    *,
    bin_dir: Path,
    progress: Progress = build._stderr_progress,
    timeout: float = 120.0,
) -> AddonRuntime:
    """Start the addon beside the running control plane, or reuse it when healthy. Installs
    its CRDs (server-side apply) and webhook configurations first."""
    current = load(layout, addon)
    ok, _ = healthy(current)
    if ok and current is not None:
        return current
    if current is not None and current.process is not None:
        processes.stop(current.process)
    cache = ensure_built(addon, progress=progress)
    folder = _folder(layout, addon)
    folder.mkdir(parents=True, exist_ok=True)
    crds = sorted(cache.crd_dir.glob("*.yaml"))
    _kubectl(bin_dir, layout, "apply", "--server-side", "--force-conflicts", *_files(crds))
    names = [str(yaml.safe_load(p.read_text())["metadata"]["name"]) for p in crds]
    _kubectl(
        bin_dir,
        layout,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        *[f"crd/{n}" for n in names],
    )
    health_port, webhook_port = _free_ports(2)
    runtime = AddonRuntime(addon, folder, health_port, webhook_port, None)
    cert_dir = folder / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    serving = CertPair(layout.pki_dir / "serving.crt", layout.pki_dir / "serving.key")
    shutil.copyfile(serving.cert, cert_dir / "tls.crt")
    shutil.copyfile(serving.key, cert_dir / "tls.key")
    (cert_dir / "tls.key").chmod(0o600)
    launch = Launch(layout, folder, cert_dir, health_port, webhook_port)
    argv = [
        str(cache.binary_dir / addon.binary),
        f"--kubeconfig={layout.admin_kubeconfig}",
        *addon.arguments(launch),
    ]
    env = {**os.environ, **addon.environment(launch)} if addon.environment else None
    record = processes.start(addon.name, argv, log_path=runtime.log, cwd=folder, env=env)
    runtime = AddonRuntime(addon, folder, health_port, webhook_port, record)
    _save(runtime)
    started = time.monotonic()
    detail = ""
    while time.monotonic() - started < timeout:
        if not processes.is_running(record):
            raise AddonError(
                f"{addon.name} exited during start-up; its log {runtime.log} ends with:\n"
                + processes.log_tail(runtime.log, lines=40)
            )
        ok, detail = healthy(runtime)
        if ok:
            break
        time.sleep(0.25)
    else:
        raise AddonError(
            f"{addon.name} not ready after {timeout:.0f}s ({detail}); its log {runtime.log} "
            "ends with:\n" + processes.log_tail(runtime.log, lines=40)
        )
    if addon.webhooks is not None:
        hooks = addon.webhooks(webhook_port, (layout.pki_dir / "ca.crt").read_bytes())
        _kubectl(
            bin_dir,
            layout,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            input=yaml.safe_dump_all(hooks, sort_keys=False),
        )
    progress(
        f"{addon.name} controller ready in {time.monotonic() - started:.1f}s "
        f"(pid {record.pid}, webhooks on 127.0.0.1:{webhook_port}, log {runtime.log})"
    )
    return runtime


JOBSET = Addon(
    name="jobset",
    module="sigs.k8s.io/jobset",
    version="v0.10.1",
    package="sigs.k8s.io/jobset",
    binary="jobset-controller",
    crd_dir="config/components/crd/bases",
    arguments=_jobset_arguments,
    webhooks=lambda port, ca: jobset_webhooks(port=port, ca_bundle=ca),
)
ADDONS = {addon.name: addon for addon in (JOBSET,)}


def _files(paths: Iterable[Path]) -> list[str]:
    return [arg for p in paths for arg in ("-f", str(p))]


def _free_ports(count: int) -> list[int]:
    return components._ephemeral_ports(count)


# -- LeaderWorkerSet ----------------------------------------------------------------------------
# Its manager (sigs.k8s.io/lws/cmd) serves webhooks for LeaderWorkerSets (defaulting and
# validation) and for their pods (labels: group index, worker index, exclusive placement).
# As for JobSet: no internal cert rotation, loopback webhooks with the devcluster's serving
# certificate, and the pod webhooks only for LWS pods (the ``leaderworkerset.sigs.k8s.io/name``
# label its StatefulSets put on every pod they create).

_LWS_POD_LABEL = "leaderworkerset.sigs.k8s.io/name"


def _lws_config(launch: Launch) -> dict[str, Any]:
    return _manager_config("config.lws.x-k8s.io/v1alpha1", launch)


def _lws_arguments(launch: Launch) -> list[str]:
    config = launch.folder / "config.yaml"
    config.write_text(yaml.safe_dump(_lws_config(launch), sort_keys=False))
    return [
        f"--config={config}",
        "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{launch.health_port}",
        "--leader-elect=false",
        "--zap-devel=false",
        "--zap-log-level=info",
    ]


def lws_webhooks(*, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """LWS's webhook configurations (its config/webhook/manifests.yaml) with a loopback URL;
    the pod webhooks only for LWS pods."""
    lws_pods = {"matchExpressions": [{"key": _LWS_POD_LABEL, "operator": "Exists"}]}

    def hook(name: str, path: str, pods: bool, ops: list[str]) -> dict[str, Any]:
        return _loopback_webhook(
            name,
            port=port,
            ca_bundle=ca_bundle,
            path=path,
            rule=("", "v1", "pods")
            if pods
            else ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
            operations=ops,
            object_selector=lws_pods if pods else None,
        )

    lws_path = "leaderworkerset-x-k8s-io-v1-leaderworkerset"
    return _configurations(
        "lws",
        mutating=[
            hook("mleaderworkerset.kb.io", f"/mutate-{lws_path}", False, ["CREATE", "UPDATE"]),
            hook("mpod.kb.io", "/mutate--v1-pod", True, ["CREATE"]),
        ],
        validating=[
            hook("vleaderworkerset.kb.io", f"/validate-{lws_path}", False, ["CREATE", "UPDATE"]),
            hook("vpod.kb.io", "/validate--v1-pod", True, ["CREATE", "UPDATE"]),
        ],
    )


LWS = Addon(
    name="lws",
    module="sigs.k8s.io/lws",
    version="v0.7.0",
    package="sigs.k8s.io/lws/cmd",
    binary="lws-controller",
    crd_dir="config/crd/bases",
    arguments=_lws_arguments,
    webhooks=lambda port, ca: lws_webhooks(port=port, ca_bundle=ca),
)
ADDONS[LWS.name] = LWS


# -- Kubeflow training-operator (PyTorchJob) ------------------------------------------------------
#
# The module's own command (cmd/training-operator.v1) always rotates its webhook certificate
# into a Secret for the in-cluster Service name and serves on every interface, which nothing
# on loopback can reach. devcluster/pytorch/main.go runs the module's PyTorchJob reconciler and
# validating webhook unchanged, served on 127.0.0.1 with the devcluster's serving certificate.
# The training-operator serves no pod webhooks.


def _pytorch_arguments(launch: Launch) -> list[str]:
    return [
        f"--health-probe-bind-address=127.0.0.1:{launch.health_port}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={launch.webhook_port}",
        f"--cert-dir={launch.cert_dir}",
        "--zap-log-level=info",
    ]


def pytorch_webhooks(*, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The training-operator's PyTorchJob validating webhook (its
    manifests/base/webhook/manifests.yaml) with a loopback URL."""
    return _configurations(
        "pytorch",
        validating=[
            _loopback_webhook(
                "validator.pytorchjob.training-operator.kubeflow.org",
                port=port,
                ca_bundle=ca_bundle,
                path="/validate-kubeflow-org-v1-pytorchjob",
                rule=("kubeflow.org", "v1", "pytorchjobs"),
                operations=["CREATE", "UPDATE"],
            )
        ],
    )


PYTORCH = Addon(
    name="pytorch",
    module="github.com/kubeflow/training-operator",
    version="v1.9.3",
    package=".",
    binary="pytorch-controller",
    crd_dir="manifests/base/crds",
    crd_glob="kubeflow.org_pytorchjobs.yaml",
    sources=("main.go",),
    arguments=_pytorch_arguments,
    webhooks=lambda port, ca: pytorch_webhooks(port=port, ca_bundle=ca),
    health_path="/readyz",
)
ADDONS[PYTORCH.name] = PYTORCH


# -- KubeRay ------------------------------------------------------------------------------------
# KubeRay's operator (its module root is the main package) runs the RayCluster, RayJob and
# RayService controllers. It serves a webhook (RayCluster validation) only when the environment
# says ENABLE_WEBHOOKS=true, which the devcluster does not: it registers none. Leader election
# and metrics off, probes on a loopback port.


def _kuberay_arguments(launch: Launch) -> list[str]:
    return [
        "--metrics-addr=0",
        f"--health-probe-bind-address=127.0.0.1:{launch.health_port}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
        "--zap-log-level=info",
    ]


RAY = Addon(
    name="ray",
    module="github.com/ray-project/kuberay/ray-operator",
    version="v1.4.2",
    package="github.com/ray-project/kuberay/ray-operator",
    binary="kuberay-operator",
    crd_dir="config/crd/bases",
    arguments=_kuberay_arguments,
)
ADDONS[RAY.name] = RAY


# -- Kubeflow Trainer v2 (TrainJob) --------------------------------------------------------------
# Its controller manager (cmd/trainer-controller-manager) reconciles TrainJobs into JobSets (so
# JobSet's controller runs beside it) from a TrainingRuntime or ClusterTrainingRuntime, and
# serves webhooks: TrainJob defaulting, and validation of TrainJobs and both runtime kinds. Its
# Configuration turns cert management off (no Service or Secret beside the cluster) and serves
# the webhooks on loopback. It has no setting for the certificate folder: controller-runtime
# reads it from <temp dir>/k8s-webhook-server/serving-certs, so the process gets TMPDIR set to
# the addon's folder and the devcluster's serving certificate is copied there. No pod webhooks.


def _trainer_arguments(launch: Launch) -> list[str]:
    config = launch.folder / "config.yaml"
    settings = _manager_config(
        "config.trainer.kubeflow.org/v1alpha1",
        launch,
        cert_management="certManagement",
        cert_dir=False,
    )
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    return [f"--config={config}", "--zap-devel=false", "--zap-log-level=info"]


def _trainer_environment(launch: Launch) -> dict[str, str]:
    temp = launch.folder / "tmp"
    certs = temp / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copyfile(launch.cert_dir / name, certs / name)
    (certs / "tls.key").chmod(0o600)
    return {"TMPDIR": str(temp)}


def trainer_webhooks(*, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Trainer's webhook configurations (its manifests/base/webhook/manifests.yaml) with a
    loopback URL."""

    def hook(kind: str, plural: str, verb: str) -> dict[str, Any]:
        return _loopback_webhook(
            f"{'defaulter' if verb == 'mutate' else 'validator'}.{kind}.trainer.kubeflow.org",
            port=port,
            ca_bundle=ca_bundle,
            path=f"/{verb}-trainer-kubeflow-org-v1alpha1-{kind}",
            rule=("trainer.kubeflow.org", "v1alpha1", plural),
            operations=["CREATE", "UPDATE"],
        )

    return _configurations(
        "trainer",
        mutating=[hook("trainjob", "trainjobs", "mutate")],
        validating=[
            hook("clustertrainingruntime", "clustertrainingruntimes", "validate"),
            hook("trainingruntime", "trainingruntimes", "validate"),
            hook("trainjob", "trainjobs", "validate"),
        ],
    )


TRAINER = Addon(
    name="trainer",
    module="github.com/kubeflow/trainer/v2",
    version="v2.2.1",
    package="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
    binary="trainer-controller-manager",
    crd_dir="manifests/base/crds",
    crd_glob="trainer.kubeflow.org_*.yaml",
    arguments=_trainer_arguments,
    environment=_trainer_environment,
    requires=("jobset",),  # a TrainJob runs as a JobSet
    webhooks=lambda port, ca: trainer_webhooks(port=port, ca_bundle=ca),
)
ADDONS[TRAINER.name] = TRAINER
