"""Shared machinery of the fault suite (tests/integration/test_faults_*.py).

The suite runs on its **own** devcluster (state folder ``$PHALANX_FAULTS_STATE_DIR``, default
``~/.cache/phalanx/cluster-faults``; ports are picked free beside the shared one): it kills
operators, restarts the API server and installs cluster-wide webhooks, none of which may
disturb the cluster other tests use.

- ``fault_cluster``: that cluster, with the CRDs installed; stopped at the end of the session
  under the same rules as ``cluster`` (``PHALANX_TEST_DOWN``, ``CI``, fresh state folder).
- :func:`restart_apiserver`: stop kube-apiserver (SIGTERM, as a node reboot or an upgrade
  would) and start it again with the same flags, through the devcluster's own process records
  (the devcluster has no per-component restart; this is the smallest one that keeps
  ``status``/``down`` right: the new pid is recorded in state.json).
- :class:`JobBurst`: a namespace, two ClusterQueues in a cohort and a few hundred GPU Jobs
  that KWOK runs for ``run-seconds``; :meth:`JobBurst.verify` holds the run to the
  invariants.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.api.crds import generate_crds
from phalanx.bench.invariants import InvariantWatch
from phalanx.devcluster import cluster as devcluster
from phalanx.devcluster import components, processes
from phalanx.devcluster.components import Layout
from phalanx.devcluster.handle import ClusterHandle
from phalanx.devcluster.locks import file_lock
from phalanx.devcluster.pins import cache_root
from phalanx.devcluster.pki import ensure_pki
from phalanx.devcluster.state import ClusterState, load_state, save_state
from phalanx.operator import kubeconfig
from phalanx.operator.kube import KubeApi

GPU = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def faults_state_dir() -> Path:
    """``$PHALANX_FAULTS_STATE_DIR``; else beside ``$PHALANX_TEST_STATE_DIR`` (a CI checkout
    with its own cluster gets its own fault cluster too); else the cache's cluster-faults."""
    env = os.environ.get("PHALANX_FAULTS_STATE_DIR")
    if env:
        return Path(env)
    test_dir = os.environ.get("PHALANX_TEST_STATE_DIR")
    if test_dir:
        return Path(test_dir.rstrip("/") + "-faults")
    return cache_root() / "cluster-faults"


@pytest.fixture(scope="session")
def fault_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterHandle]:
    state_dir = faults_state_dir()
    # One fault session per cluster at a time: two would kill each other's operators and
    # restart the API server under each other's feet. Held until the session ends.
    stack = contextlib.ExitStack()
    stack.enter_context(
        file_lock(
            state_dir.parent / f".{state_dir.name}.faults-lock",
            on_wait=lambda: sys.stderr.write(
                f"\n[faults] waiting for another fault session on {state_dir}\n"
            ),
        )
    )
    request.addfinalizer(stack.close)
    fresh = not (state_dir / "state.json").exists()
    down = os.environ.get("PHALANX_TEST_DOWN", "").strip().lower()
    tear_down = down in ("1", "true", "yes") or (
        down == "" and (bool(os.environ.get("CI")) or fresh)
    )
    try:
        status = devcluster.up(state_dir=state_dir)
    except Exception as exc:
        pytest.fail(
            f"the fault devcluster could not start: {exc}\n" + devcluster.log_tails(state_dir),
            pytrace=False,
        )
    handle = ClusterHandle.from_status(status)
    handle.apply_crds(generate_crds().values())
    yield handle
    if tear_down:
        sys.stderr.write(f"\n[devcluster] stopping the fault cluster in {state_dir}\n")
        devcluster.down(state_dir=state_dir)


def api_factory(cluster: ClusterHandle) -> Callable[[], KubeApi]:
    auth = kubeconfig.load(cluster.kubeconfig)
    return lambda: KubeApi(auth)


# -- the API server, stopped and started ----------------------------------------------------------


def restart_apiserver(state_dir: Path, *, down_seconds: float, timeout: float = 120.0) -> float:
    """Stop kube-apiserver, keep it down ``down_seconds``, start it with the same flags; return
    the seconds until it was healthy again after the start."""
    layout = Layout(state_dir)
    state = load_state(layout)
    assert state is not None, f"no devcluster in {state_dir}"
    record = state.processes["kube-apiserver"]
    assert processes.stop(record), "kube-apiserver would not stop"
    time.sleep(down_seconds)
    pki = ensure_pki(layout.pki_dir, service_ip=components.SERVICE_IP)
    argv = components.argv(
        "kube-apiserver", bin_dir=state.bin_dir, layout=layout, ports=state.ports, pki=pki
    )
    started = time.monotonic()
    new = processes.start(
        "kube-apiserver", argv, log_path=layout.log("kube-apiserver"), cwd=state_dir
    )
    save_state(
        layout,
        ClusterState(
            ports=state.ports,
            bin_dir=state.bin_dir,
            topology=state.topology,
            expected_nodes=state.expected_nodes,
            processes={**state.processes, "kube-apiserver": new},
        ),
    )
    while time.monotonic() - started < timeout:
        status = devcluster.status(state_dir=state_dir)
        component = {c.name: c for c in status.components}["kube-apiserver"]
        if component.healthy:
            return time.monotonic() - started
        if not component.running:
            raise AssertionError(
                "kube-apiserver exited after the restart:\n"
                + processes.log_tail(layout.log("kube-apiserver"), lines=40)
            )
        time.sleep(0.25)
    raise AssertionError(f"kube-apiserver not healthy {timeout:.0f}s after the restart")


# -- a Service in front of operator replicas ------------------------------------------------------


class ServiceProxy:
    """What a Service does for the webhook in a cluster: one stable address in front of every
    replica. Each connection goes to the first backend that accepts it (TCP pass-through,
    so TLS stays end to end: the replicas must share one webhook certificate folder)."""

    def __init__(self) -> None:
        self.backends: list[int] = []
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self.port = int(self._server.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="service-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for port in list(self.backends):
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                continue
            upstream.settimeout(None)
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
            _pipe(client, upstream)
            return
        client.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


# -- a burst of Jobs ------------------------------------------------------------------------------


@dataclass
class JobBurst:
    """``jobs`` GPU Jobs over two ClusterQueues of one cohort (``<prefix>-a``/``-b``)."""

    cluster: ClusterHandle
    prefix: str
    jobs: int = 300
    nominal_gpus: int = 12
    borrowing_gpus: int = 4
    run_seconds: str = "2"
    names: list[str] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.prefix

    @property
    def queues(self) -> list[str]:
        return [f"{self.prefix}-a", f"{self.prefix}-b"]

    def setup(self) -> None:
        self.teardown()
        c = self.cluster
        c.kubectl_ok("create", "namespace", self.namespace)
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": f"{self.prefix}-gpu"},
                "spec": {},
            }
        ]
        for cq in self.queues:
            objects.append(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ClusterQueue",
                    "metadata": {"name": cq},
                    "spec": {
                        "cohortName": self.prefix,
                        "namespaceSelector": {},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu", GPU],
                                "flavors": [
                                    {
                                        "name": f"{self.prefix}-gpu",
                                        "resources": [
                                            {"name": "cpu", "nominalQuota": "1000"},
                                            {
                                                "name": GPU,
                                                "nominalQuota": str(self.nominal_gpus),
                                                "borrowingLimit": str(self.borrowing_gpus),
                                            },
                                        ],
                                    }
                                ],
                            }
                        ],
                    },
                }
            )
            objects.append(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": cq, "namespace": self.namespace},
                    "spec": {"clusterQueue": cq},
                }
            )
        c.kubectl_ok("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def job(self, index: int) -> dict[str, Any]:
        # A third are 2-pod gangs; sizes 1-2 GPUs per pod; alternate queues.
        pods = 2 if index % 3 == 0 else 1
        gpus = 1 + index % 2
        name = f"job-{index:03d}"
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {QUEUE_LABEL: self.queues[index % 2]},
            },
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": {"phalanx.dev/run-seconds": self.run_seconds}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "train",
                                "image": "example.invalid/train:1",
                                "resources": {
                                    "requests": {"cpu": "1", GPU: str(gpus)},
                                    "limits": {GPU: str(gpus)},
                                },
                            }
                        ],
                    },
                },
            },
        }

    def create(self, *, batch: int = 25, pause: float = 0.0, deadline: float = 300.0) -> list[str]:
        """Create the Jobs in batches; a batch refused (webhook down during a fault) is
        retried until it lands. Returns the errors seen on the way."""
        errors: list[str] = []
        stop = time.monotonic() + deadline
        for start in range(0, self.jobs, batch):
            docs = [self.job(i) for i in range(start, min(self.jobs, start + batch))]
            while True:
                proc = self.cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(docs))
                if proc.returncode == 0:
                    break
                errors.append(proc.stderr.strip()[-300:])
                if "AlreadyExists" in proc.stderr:
                    # Part of the batch landed before the failure: create the rest one by one.
                    docs = [d for d in docs if not self._exists(d["metadata"]["name"])]
                    if not docs:
                        break
                if time.monotonic() > stop:
                    raise AssertionError(f"could not create Jobs: {errors[-3:]}")
                time.sleep(1.0)
            self.names.extend(d["metadata"]["name"] for d in docs)
            if pause:
                time.sleep(pause)
        self.names = sorted({f"job-{i:03d}" for i in range(self.jobs)})
        return errors

    def _exists(self, name: str) -> bool:
        return self.cluster.kubectl("get", "job", name, "-n", self.namespace).returncode == 0

    def job_list(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl_ok("get", "jobs", "-n", self.namespace, "-o", "json")
        return list(json.loads(out)["items"])

    def completed(self) -> int:
        return sum(1 for j in self.job_list() if _job_complete(j))

    def wait_complete(self, *, timeout: float, stall: float = 120.0) -> float:
        """Until every Job is complete, ``timeout`` passes, or nothing completes for ``stall``
        seconds; returns the seconds waited (``verify`` then says what is missing)."""
        started = last_change = time.monotonic()
        done = -1
        while time.monotonic() - started < timeout:
            now_done = self.completed()
            if now_done >= self.jobs:
                break
            if now_done != done:
                done, last_change = now_done, time.monotonic()
            elif time.monotonic() - last_change > stall:
                break
            time.sleep(3.0)
        return time.monotonic() - started

    def verify(
        self, watch: InvariantWatch, *, settle: float = 30.0, trace: Path | None = None
    ) -> dict[str, Any]:
        """Every Job complete and admitted exactly once, no violation, no leak. On a failure
        the checker's trace (every Workload version it applied, with its resourceVersion, and
        every relist) is written to ``trace``, to hold a violation against what the API said."""
        jobs = self.job_list()
        incomplete = [j["metadata"]["name"] for j in jobs if not _job_complete(j)]
        history = watch.checker.history_by_key()
        by_job: dict[str, list[Any]] = {}
        for h in history.values():
            if h.key.startswith(f"{self.namespace}/"):
                by_job.setdefault(_job_of(h.key), []).append(h)
        not_once = {
            name: [h.admissions for h in by_job.get(name, [])]
            for name in self.names
            if [h.admissions for h in by_job.get(name, [])] != [1]
        }
        unfinished = sorted(
            name for name in self.names if not all(h.finished for h in by_job.get(name, []))
        )
        deadline = time.monotonic() + settle
        problems = watch.checker.final_problems(queues=self.queues)
        while problems and time.monotonic() < deadline:
            time.sleep(1.0)  # queue status is written in batches
            problems = watch.checker.final_problems(queues=self.queues)
        report = {
            "jobs": len(jobs),
            "incomplete": incomplete,
            "not_admitted_exactly_once": not_once,
            "workloads_not_finished": unfinished,
            "invariant_problems": problems,
            "peak_usage": watch.checker.max_usage,
        }
        stuck = {
            j["metadata"]["name"]: {
                "suspend": (j.get("spec") or {}).get("suspend"),
                "workloads": [
                    {"admissions": h.admissions, "finished": h.finished}
                    for h in by_job.get(j["metadata"]["name"], [])
                ],
                "status": {
                    k: v
                    for k, v in (j.get("status") or {}).items()
                    if k in ("active", "succeeded", "failed")
                },
            }
            for j in jobs
            if j["metadata"]["name"] in incomplete
        }
        # Every check is evaluated and reported together, so one run says all that broke.
        failures = []
        if incomplete:
            failures.append(
                f"{len(incomplete)}/{self.jobs} Jobs not complete: {dict(list(stuck.items())[:20])}"
            )
        if len(jobs) != self.jobs:
            failures.append(f"{len(jobs)} Jobs exist, expected {self.jobs}")
        if not_once:
            failures.append(f"Jobs not admitted exactly once (admissions per Workload): {not_once}")
        if unfinished:
            failures.append(f"{len(unfinished)} Workloads not Finished: {unfinished[:20]}")
        if problems:
            failures.append(
                "invariant violations:\n  "
                + "\n  ".join(problems[:40])
                + "\nWorkloads not Finished, as the API shows them now:\n  "
                + "\n  ".join(self._unsettled_workloads()[:20])
                + "\nClusterQueue status, as the API shows it now:\n  "
                + "\n  ".join(self._queue_status())
            )
        summary = (
            f"{self.jobs - len(incomplete)}/{self.jobs} Jobs complete,"
            f" {len(self.names) - len(not_once)} admitted exactly once,"
            f" {len(problems)} invariant problems"
        )
        if failures and trace is not None:
            trace.write_text("\n".join(watch.checker.trace_lines()) + "\n")
            failures.append(f"the checker's trace: {trace}")
        assert not failures, summary + "\n" + "\n".join(failures)
        return report

    def _unsettled_workloads(self) -> list[str]:
        out = self.cluster.kubectl_ok("get", "workloads", "-n", self.namespace, "-o", "json")
        lines = []
        for wl in json.loads(out)["items"]:
            conds = {
                c["type"]: c["status"] for c in (wl.get("status") or {}).get("conditions") or ()
            }
            if conds.get("Finished") != "True":
                lines.append(f"{wl['metadata']['name']}: {conds}")
        return lines or ["(none)"]

    def _queue_status(self) -> list[str]:
        lines = []
        for cq in self.queues:
            out = self.cluster.kubectl_ok("get", "clusterqueue", cq, "-o", "json")
            status = json.loads(out).get("status") or {}
            usage = [
                (r["name"], r.get("total"))
                for f in status.get("flavorsReservation") or ()
                for r in f.get("resources") or ()
            ]
            lines.append(
                f"{cq}: reserving={status.get('reservingWorkloads')}"
                f" admitted={status.get('admittedWorkloads')} reservation={usage}"
            )
        return lines

    def teardown(self) -> None:
        c = self.cluster
        c.kubectl(
            "delete", "namespace", self.namespace, "--ignore-not-found", "--wait=true", timeout=300
        )
        # Only a running operator removes the resource-in-use finalizer; none runs now.
        unfinalize = '{"metadata":{"finalizers":null}}'
        for cq in self.queues:
            c.kubectl("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false")
            c.kubectl("patch", "clusterqueue", cq, "--type=merge", "-p", unfinalize)
            c.kubectl("wait", "--for=delete", f"clusterqueue/{cq}", "--timeout=60s")
        flavor = f"{self.prefix}-gpu"
        c.kubectl("delete", "resourceflavor", flavor, "--ignore-not-found", "--wait=false")
        c.kubectl("patch", "resourceflavor", flavor, "--type=merge", "-p", unfinalize)


def wait_admissions(watch: InvariantWatch, count: int, *, timeout: float = 180.0) -> int:
    """Until the checker has seen ``count`` Workloads admitted (or ``timeout``); returns how
    many it has seen. A fault timed by progress, not by the clock, lands mid-burst however
    loaded the machine is."""
    deadline = time.monotonic() + timeout
    while True:
        seen = sum(1 for h in watch.checker.history_by_key().values() if h.admissions)
        if seen >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def _job_complete(job: dict[str, Any]) -> bool:
    for c in (job.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Complete" and c.get("status") == "True":
            return True
    return False


def _job_of(workload_key: str) -> str:
    """``ns/job-<name>-<5 hex>`` -> ``<name>`` (the Job integration's naming)."""
    name = workload_key.split("/", 1)[1]
    if name.startswith("job-"):
        name = name[len("job-") :]
    return name.rsplit("-", 1)[0]


@contextlib.contextmanager
def invariant_watch(cluster: ClusterHandle) -> Iterator[InvariantWatch]:
    watch = InvariantWatch(api_factory(cluster))
    watch.start_thread()
    try:
        yield watch
    finally:
        watch.stop_thread()
