"""A rolling update of the two replicas of the manifests, while Jobs flow.

The install's acceptance item: rolling the two replicas of ``manifests/default`` (SIGTERM, as
the kubelet stops a pod of the old ReplicaSet) never leaves two schedulers writing (Lease
fencing) and never leaves Jobs unadmitted for longer than the lease duration.

``manifests/overlays/devcluster`` is applied and replicas are started in-cluster-shaped
(``incluster_support``): the ServiceAccount's credentials, the arguments of the Deployment as
``kubectl kustomize manifests/default`` renders it (``--leader-elect`` and its lease settings,
none hard-coded here), webhooks behind the Service. Each replica reads a token of its own, as
each pod gets its own bound token, so the API server's audit log attributes every call to one
replica by the token's ``credential-id``, though all run as the one ServiceAccount.

The roll, with a Job created every ``PERIOD`` s throughout (1 GPU, runs 1 s on the KWOK
nodes, so quota keeps freeing): ``old-a`` leads and ``old-b`` stands by; ``old-a`` is taken
out of the Service and sent SIGTERM, ``new-c`` is started and becomes Ready (``/readyz``,
the Deployment's readiness probe: the next old pod goes only then, ``maxUnavailable: 0``);
then ``old-b``, now leading, the same way, replaced by ``new-d``. Both replicas of the old
ReplicaSet are gone, the Lease passed ``old-a`` -> ``old-b`` -> ``new-c``.

What is asserted, and which broken operator each catches:

1. Fencing, from the audit log: every scheduling write (any write but the Lease itself and
   what every replica keeps: webhook configurations, converting CRDs, token and access
   reviews) comes from a replica while it holds the Lease: received after its acquiring
   Lease write was answered, and before its releasing one was (a replica that did not
   release: within a renew deadline of its last renew); no two tenures overlap, and no two
   replicas' write intervals (first received to last answered) do. Catches a replica that
   keeps its loop (or a writer, a status batch) running after it released or lost the
   Lease, a standby that writes, a fence that checks the wrong clock. Checked against an
   operator patched to release first and stop its components 3 s later: it fails here.
2. Hand-over: the Lease goes ``old-a``, empty, ``old-b``, empty, ``new-c`` (each leader
   released it on SIGTERM; ``new-d`` never led), the successor acquires within the renew
   deadline of the SIGTERM, and each replica exits 0. A leader that does not release on
   SIGTERM is replaced only when its record expires, at least ``lease duration - retry
   period`` after its last renew: above the renew deadline, so this fails for it (while the
   admission gap below could pass, as it allows the whole lease duration; checked against
   an operator patched not to release: hand-overs 14.5 s, and its gap also failed, 29 s,
   as a Job created in the first outage waited through the second).
3. Availability: every Job created is admitted; the largest gap between a Job's
   ``creationTimestamp`` and its Workload's ``QuotaReserved`` ``lastTransitionTime`` is at
   most the lease duration plus ``MARGIN`` (both timestamps are whole seconds, so the
   difference reads up to 1 s more than the real one; and the successor's first scheduling
   cycle and its status write, 2 s on a loaded 2-core machine). The measured gap, the
   scheduling pause at each hand-over (the last Workload write of the old leader to the
   first of the new one, from the audit log, microseconds) and the gap before the roll are
   printed. A pause longer than the lease duration fails too.
4. Exactly once and nothing lost: each Job has one Workload, reserved once (``QuotaReserved``
   became True once; the invariant checker counts no second admission), every Job completes
   and its Workload finishes; the ClusterQueue's reported usage (``flavorsReservation`` and
   ``flavorsUsage``) never exceeds its nominal quota in any version watched, and the
   checker's own sum of reservations never does; nothing is left reserved at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from faults_support import api_factory
from incluster_support import (
    NAMESPACE,
    AuditEvent,
    InClusterInstall,
    Replica,
    installed,
    manifest_lease_settings,
    rendered_deployment_args,
    wait_ready,
)
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    apply,
    cluster_queue,
    delete_cluster_objects,
    flavor,
    gpu_job,
    is_true,
    local_queue,
    node_pool,
    wait_for,
)

from phalanx.bench.invariants import InvariantChecker, InvariantWatch
from phalanx.devcluster.handle import ClusterHandle
from phalanx.quotas.quantity import parse_quantity

pytestmark = pytest.mark.integration

NS = "phx-rolling"
POOL = "phx-roll"
CQ = "phx-roll-cq"
LQ = "lq"
GPUS = 8  # nominal quota; 2 nodes of 8 GPUs give the pods room beyond it
PERIOD = 0.5  # a Job every PERIOD seconds
BEFORE_ROLL = 6.0  # seconds of Jobs before the first SIGTERM
AFTER_ROLL = 4.0  # and after the last replacement is Ready
MARGIN = 3.0  # whole-second timestamps (1 s) + the successor's first cycle and write (2 s)
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# Written by every replica, leading or not: kopf keeps the webhook configurations, the
# conversion keeper the converting CRDs, the metrics server reviews scrapers' tokens.
EVERY_REPLICA = {
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("authentication.k8s.io", "tokenreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    # At start, whether it may watch the kinds it only tells about (stores nothing).
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
}
LEASES = ("coordination.k8s.io", "leases")


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _lease_name(args: list[str]) -> str:
    from phalanx.operator.leader import LeaderElectionConfig

    for arg in args:
        if arg.startswith("--leader-elect-lease-name="):
            return arg.split("=", 1)[1]
    return LeaderElectionConfig(namespace=NAMESPACE, identity="-").lease_name


# -- what the test watches ---------------------------------------------------------------------


class RolloutChecker(InvariantChecker):
    """The invariant checker, also keeping what this test reads: each of its Workloads'
    ``QuotaReserved=True`` transitions and owning Job, and the ClusterQueue's reported usage
    in every version watched."""

    def __init__(self) -> None:
        super().__init__(clock=time.monotonic)
        self._mutex = threading.Lock()
        self.reserved: dict[str, list[str]] = {}  # Workload uid -> lastTransitionTimes
        self.job_of: dict[str, str] = {}  # Workload uid -> Job name
        self.name_of: dict[str, str] = {}
        self.cq_versions = 0
        self.cq_peak: dict[str, int] = {}
        self.cq_over: list[str] = []

    def _note(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") != NS:
            return
        uid = str(meta.get("uid"))
        with self._mutex:
            self.name_of[uid] = str(meta.get("name"))
            for owner in meta.get("ownerReferences") or ():
                if owner.get("kind") == "Job":
                    self.job_of[uid] = str(owner.get("name"))
            for c in (obj.get("status") or {}).get("conditions") or ():
                if c.get("type") == "QuotaReserved" and c.get("status") == "True":
                    seen = self.reserved.setdefault(uid, [])
                    if c.get("lastTransitionTime") not in seen:
                        seen.append(str(c.get("lastTransitionTime")))

    def _note_queue(self, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != CQ:
            return
        nominal: dict[tuple[str, str], int] = {}
        for group in (obj.get("spec") or {}).get("resourceGroups") or ():
            for fl in group.get("flavors") or ():
                for res in fl.get("resources") or ():
                    key = (str(fl["name"]), str(res["name"]))
                    nominal[key] = parse_quantity(str(res["nominalQuota"]), resource=key[1])
        status = obj.get("status") or {}
        with self._mutex:
            self.cq_versions += 1
            for kind in ("flavorsReservation", "flavorsUsage"):
                for fl in status.get(kind) or ():
                    for res in fl.get("resources") or ():
                        key = (str(fl.get("name")), str(res.get("name")))
                        amount = parse_quantity(str(res.get("total", "0")), resource=key[1])
                        label = f"{kind} {key[1]}"
                        self.cq_peak[label] = max(self.cq_peak.get(label, 0), amount)
                        if key in nominal and amount > nominal[key]:
                            self.cq_over.append(
                                f"{label} = {amount} > nominal {nominal[key]} (resourceVersion "
                                f"{(obj.get('metadata') or {}).get('resourceVersion')})"
                            )

    def on_workload(self, event_type: str, obj: dict[str, Any]) -> None:
        self._note(obj)
        super().on_workload(event_type, obj)

    def on_workload_list(self, objects: Any, *, resource_version: str | None = None) -> None:
        for obj in objects:
            self._note(obj)
        super().on_workload_list(objects, resource_version=resource_version)

    def on_cluster_queue(self, event_type: str, obj: dict[str, Any]) -> None:
        self._note_queue(obj)
        super().on_cluster_queue(event_type, obj)

    def on_cluster_queue_list(self, objects: Any) -> None:
        for obj in objects:
            self._note_queue(obj)
        super().on_cluster_queue_list(objects)


class LeaseWatch:
    """``kubectl get lease --watch``: every holder the Lease had, with when it was seen."""

    def __init__(self, cluster: ClusterHandle, name: str) -> None:
        self.holders: list[tuple[float, str]] = []
        self._process = subprocess.Popen(
            [
                str(cluster.kubectl_path),
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                "leases",
                "-n",
                NAMESPACE,
                f"--field-selector=metadata.name={name}",
                "--watch",
                "-o",
                "jsonpath={.spec.holderIdentity}{'\\n'}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, name="lease-watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.holders.append((time.time(), line.rstrip("\n")))

    def sequence(self) -> list[str]:
        """The holders in order, repeats (renewals) folded."""
        out: list[str] = []
        for _, holder in list(self.holders):
            if not out or out[-1] != holder:
                out.append(holder)
        return out

    def current(self) -> str | None:
        return self.holders[-1][1] if self.holders else None

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
        self._process.wait(timeout=10)


@dataclass
class JobStream:
    """A Job every ``PERIOD`` s until stopped; a create refused (no webhook endpoint for a
    moment while a replica leaves the Service) is retried."""

    cluster: ClusterHandle
    created: dict[str, float] = field(default_factory=dict)  # name -> when (this clock)
    refused: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            index = 0
            while not self.stop.is_set():
                began = time.monotonic()
                name = f"roll-{index:03d}"
                job = gpu_job(name, queue=LQ, pods=1, gpus=1, run_seconds="1")
                while True:
                    proc = self.cluster.kubectl(
                        "create", "-n", NS, "-f", "-", input=json.dumps(job), timeout=60
                    )
                    if proc.returncode == 0 or "AlreadyExists" in proc.stderr:
                        break
                    self.refused.append(f"{name}: {proc.stderr.strip()[-200:]}")
                    if time.monotonic() - began > 60:
                        raise AssertionError(f"Job {name} not created in 60s: {self.refused[-3:]}")
                    time.sleep(0.2)
                self.created[name] = time.time()
                index += 1
                self.stop.wait(max(0.0, PERIOD - (time.monotonic() - began)))
        except BaseException as error:  # reported by the test
            self.error = error


def _ready(replica: Replica) -> bool:
    """The Deployment's readiness probe: ``/readyz`` answers 200 once the informers listed."""
    try:
        url = f"http://127.0.0.1:{replica.health_port}/readyz"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_pod_ready(replica: Replica, timeout: float = 90.0) -> None:
    wait_for(
        f"{replica.name} Ready (/readyz)",
        lambda: (replica.alive() or _exited(replica)) and _ready(replica),
        timeout=timeout,
        interval=0.2,
        log=replica.tail,
    )


def _settle(what: str, probe: Any, timeout: float = 120.0) -> None:
    try:
        wait_for(what, probe, timeout=timeout, interval=1.0)
    except AssertionError as error:
        sys.stderr.write(f"[rolling] {error}\n")


def _workloads(cluster: ClusterHandle) -> list[dict[str, Any]]:
    out = cluster.kubectl_ok("get", "workloads.kueue.x-k8s.io", "-n", NS, "-o", "json")
    return list(json.loads(out)["items"])


def _exited(replica: Replica) -> bool:
    raise AssertionError(f"{replica.name} exited:\n{replica.tail()}")


# -- fencing, from the audit log ---------------------------------------------------------------


@dataclass
class Tenure:
    """One replica's Lease tenure and scheduling writes, as the API server saw them."""

    name: str
    renew_deadline: float
    lease_writes: list[AuditEvent] = field(default_factory=list)  # answered 2xx
    writes: list[AuditEvent] = field(default_factory=list)  # scheduling writes, any answer
    running: bool = False
    released: bool = False
    """The Lease watch saw it hand the Lease back (an empty holder after it)."""

    @property
    def acquired(self) -> float | None:
        """When its first Lease write (its acquire) was answered: it leads from then."""
        return self.lease_writes[0].completed if self.lease_writes else None

    @property
    def end(self) -> float:
        """Until when it may write: still running, for ever; released, until its release (its
        last Lease write) was answered; else a renew deadline after its last renew reached
        the API server (the operator's own rule counts from sending it, earlier)."""
        if self.running or not self.lease_writes:
            return float("inf")
        if self.released:
            return self.lease_writes[-1].completed
        return self.lease_writes[-1].received + self.renew_deadline


def scheduling_write(event: AuditEvent) -> bool:
    return (
        event.verb in WRITE_VERBS
        and (event.group, event.resource) != LEASES
        and (event.group, event.resource) not in EVERY_REPLICA
    )


def tenures(
    events: list[AuditEvent], replicas: dict[str, str], lease: str, renew_deadline: float
) -> tuple[dict[str, Tenure], list[str]]:
    """Each replica's (by credential id) Lease writes and scheduling writes; and the writes of
    credentials of no replica."""
    by_credential = {
        credential: Tenure(name, renew_deadline) for name, credential in replicas.items()
    }
    stray = []
    for event in events:
        tenure = by_credential.get(event.credential)
        if (event.group, event.resource) == LEASES and event.name == lease:
            if event.verb in WRITE_VERBS and 200 <= event.code < 300 and tenure is not None:
                tenure.lease_writes.append(event)
        elif scheduling_write(event):
            if tenure is None:
                stray.append(f"{event.call} by credential {event.credential or '(none)'}")
            else:
                tenure.writes.append(event)
    return {t.name: t for t in by_credential.values()}, stray


def fencing_problems(found: dict[str, Tenure]) -> list[str]:
    """Every scheduling write inside its replica's tenure; no two tenures, and no two
    replicas' write intervals, overlapping."""
    problems = []
    for t in found.values():
        if t.writes and t.acquired is None:
            problems.append(
                f"{t.name} wrote without ever holding the Lease: {t.writes[0].call}"
                f" ({len(t.writes)} writes)"
            )
            continue
        if t.acquired is None:
            continue
        end = t.end
        early = [w for w in t.writes if w.received < t.acquired]
        late = [w for w in t.writes if w.received > end]
        for what, bad, at in (("before", early, t.acquired), ("after", late, end)):
            if bad:
                problems.append(
                    f"{t.name}: {len(bad)} writes received {what} its tenure "
                    f"({'from' if what == 'before' else 'until'} {at:.6f}), e.g. "
                    f"{bad[0].call} at {bad[0].received:.6f}"
                )
    held = sorted((t for t in found.values() if t.acquired is not None), key=lambda t: t.acquired)
    for before, after in itertools.pairwise(held):
        if before.end > (after.acquired or 0):
            problems.append(
                f"tenures overlap: {before.name} held the Lease until {before.end:.6f}, "
                f"{after.name} acquired it at {after.acquired:.6f}"
            )
    spans = sorted(
        (min(w.received for w in t.writes), max(w.completed for w in t.writes), t.name)
        for t in found.values()
        if t.writes
    )
    for (_, end, name), (start, _, other) in itertools.pairwise(spans):
        if end > start:
            problems.append(
                f"write intervals overlap: {name} wrote until {end:.6f}, {other} from {start:.6f}"
            )
    return problems


# -- the test ----------------------------------------------------------------------------------


@pytest.fixture
def rollout_install(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path: Path
) -> Iterator[InClusterInstall]:
    args = rendered_deployment_args(cluster)
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=180)
    with (
        node_pool(cluster, POOL, racks=1, hosts=2),
        installed(cluster, tmp_path, args=args) as install,
    ):
        try:
            yield install
        finally:
            install.stop_all()
            # Persistent webhooks with no replica behind them refuse later writes.
            install.remove_webhook_configurations()
            cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{CQ}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )
            cluster.kubectl(
                "delete", "lease", _lease_name(args), "-n", NAMESPACE, "--ignore-not-found"
            )
            sys.stderr.write(f"\n[rolling] replica logs in {tmp_path}\n")


def test_rolling_both_replicas_keeps_one_writer_and_admits_within_the_lease(
    cluster: ClusterHandle,
    rollout_install: InClusterInstall,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with contextlib.ExitStack() as watches:
        _roll_and_check(cluster, rollout_install, capsys, watches)


def _roll_and_check(
    cluster: ClusterHandle,
    install: InClusterInstall,
    capsys: pytest.CaptureFixture[str],
    watches: contextlib.ExitStack,
) -> None:
    started = time.monotonic()
    assert install.args is not None
    lease_duration, renew_deadline, retry_period = manifest_lease_settings(install.args)
    assert "--leader-elect" in install.args, install.args
    lease = _lease_name(install.args)
    # A fresh install: no Lease yet.
    cluster.kubectl("delete", "lease", lease, "-n", NAMESPACE, "--ignore-not-found")
    since = install.audit.mark()

    a = install.start("phalanx-old-a", own_token=True)
    wait_ready(a, timeout=90)  # leads: the first replica of a fresh install
    _wait_pod_ready(a)
    b = install.start("phalanx-old-b", own_token=True)
    _wait_pod_ready(b)
    watch_lease = LeaseWatch(cluster, lease)
    watches.callback(watch_lease.close)
    wait_for("the Lease names old-a", lambda: watch_lease.current() == a.name, timeout=30)

    cluster.kubectl_ok("create", "namespace", NS)
    apply(
        cluster,
        flavor(POOL, pool=POOL),
        cluster_queue(CQ, flavor_name=POOL, gpus=GPUS),
    )
    apply(cluster, local_queue(LQ, cluster_queue_name=CQ), namespace=NS)
    wait_for(
        "the LocalQueue is Active",
        lambda: is_true(
            json.loads(cluster.kubectl_ok("get", "localqueue", LQ, "-n", NS, "-o", "json")),
            "Active",
        ),
        timeout=30,
    )

    checker = RolloutChecker()
    watch = InvariantWatch(api_factory(cluster), checker=checker)
    watch.start_thread()
    watches.callback(watch.stop_thread)
    stream = JobStream(cluster)
    creator = threading.Thread(target=stream.run, name="job-stream", daemon=True)
    sigterm: dict[str, float] = {}
    exits: dict[str, tuple[int | None, float]] = {}
    roll_started = 0.0
    try:
        creator.start()
        time.sleep(BEFORE_ROLL)
        roll_started = time.time()
        for old, successor, new in (
            (a, b.name, "phalanx-new-c"),
            (b, "phalanx-new-c", "phalanx-new-d"),
        ):
            # The kubelet stops a pod the endpoints controller has taken out of the Service.
            install.unpublish(old.name)
            sigterm[old.name] = time.time()
            code = old.stop(timeout=60)
            exits[old.name] = (code, time.time() - sigterm[old.name])
            replacement = install.start(new, own_token=True)
            _wait_pod_ready(replacement)
            # The next roll stops the leader; this roll's is then the standby left. (Only a
            # Lease that is neither released nor renewed makes this wait: a lease duration.)
            wait_for(
                f"the Lease names {successor} (holders so far: {watch_lease.sequence()})",
                lambda successor=successor: watch_lease.current() == successor,
                timeout=lease_duration + 15,
                interval=0.1,
            )
        time.sleep(AFTER_ROLL)
    finally:
        stream.stop.set()
        creator.join(timeout=90)
    assert stream.error is None, f"the Job stream failed: {stream.error!r}"
    names = sorted(stream.created)

    def jobs() -> list[dict[str, Any]]:
        return list(json.loads(cluster.kubectl_ok("get", "jobs", "-n", NS, "-o", "json"))["items"])

    def complete(job: dict[str, Any]) -> bool:
        return any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in (job.get("status") or {}).get("conditions") or ()
        )

    # Said Job by Job below if these time out.
    _settle(f"all {len(names)} Jobs complete", lambda: sum(map(complete, jobs())) >= len(names))
    _settle(
        "every Workload Finished",
        lambda: all(is_true(w, "Finished") for w in _workloads(cluster)),
        timeout=30,
    )
    _settle("the ClusterQueue's status empty", lambda: not checker.final_problems(queues=[CQ]))
    watch.stop_thread()
    watch_lease.close()
    events = install.audit.events(since)
    job_list = {j["metadata"]["name"]: j for j in jobs()}
    workloads = _workloads(cluster)

    failures: list[str] = []
    report: list[str] = []
    running = {r.name for r in install.replicas.values() if r.alive()}
    credentials = {r.name: r.credential for r in install.replicas.values()}

    # 1. Fencing.
    found, stray = tenures(events, credentials, lease, renew_deadline)
    holders = watch_lease.sequence()
    for name, t in found.items():
        t.running = name in running
        t.released = any(
            holders[i] == name and holders[i + 1] == "" for i in range(len(holders) - 1)
        )
    if stray:
        failures.append(f"writes by no replica's credential: {stray[:5]}")
    failures += fencing_problems(found)
    writers = [n for n, t in found.items() if t.writes]
    for name, t in found.items():
        kinds = sorted(
            {
                f"{w.verb} {w.resource}" + (f"/{w.subresource}" if w.subresource else "")
                for w in t.writes
            }
        )
        report.append(f"{name}: {len(t.lease_writes)} Lease writes, {len(t.writes)} writes {kinds}")
    if not any(
        w.resource == "workloads" and w.subresource == "status"
        for t in found.values()
        for w in t.writes
    ):
        failures.append("the audit log shows no Workload status write: nothing to judge")

    # 2. Hand-over.
    expected = [a.name, "", b.name, "", "phalanx-new-c"]
    if holders != expected:
        failures.append(f"Lease holders {holders}, expected {expected}")
    for name, (code, took) in exits.items():
        report.append(f"{name}: exit {code} {took:.1f}s after SIGTERM")
        if code != 0:
            failures.append(f"{name} exited {code} on SIGTERM:\n{install.replicas[name].tail()}")
    pauses: list[float] = []
    for old, new in ((a.name, b.name), (b.name, "phalanx-new-c")):
        acquired = found[new].acquired
        if acquired is None or not found[old].lease_writes:
            failures.append(f"no hand-over {old} -> {new} in the audit log")
            continue
        handover = acquired - sigterm[old]
        report.append(
            f"hand-over {old} -> {new}: acquired {handover:.2f}s after SIGTERM, "
            f"{acquired - found[old].lease_writes[-1].completed:.3f}s after {old}'s last Lease "
            f"write ({'its release' if found[old].released else 'not a release'})"
        )
        if handover > renew_deadline:
            failures.append(
                f"{new} acquired the Lease {handover:.1f}s after {old}'s SIGTERM, more than the "
                f"renew deadline {renew_deadline:.0f}s: was it released?"
            )
        old_writes = [w for w in found[old].writes if w.resource == "workloads"]
        new_writes = [w for w in found[new].writes if w.resource == "workloads"]
        if old_writes and new_writes:
            pause = min(w.received for w in new_writes) - max(w.completed for w in old_writes)
            pauses.append(pause)
            if pause > lease_duration:
                failures.append(
                    f"no Workload written for {pause:.1f}s from {old}'s last write to {new}'s "
                    f"first, more than the lease duration {lease_duration:.0f}s"
                )

    # 3. Availability and 4. exactly once.
    by_job: dict[str, list[dict[str, Any]]] = {}
    for w in workloads:
        for owner in w["metadata"].get("ownerReferences") or ():
            if owner.get("kind") == "Job":
                by_job.setdefault(owner["name"], []).append(w)
    uid_of_job = {job: uid for uid, job in checker.job_of.items()}
    gaps: dict[str, float] = {}
    unadmitted, twice, lost = [], [], []
    for name in names:
        job = job_list.get(name)
        uid = uid_of_job.get(name)
        reservations = checker.reserved.get(uid or "", [])
        if job is None or not reservations:
            unadmitted.append(name)
            continue
        gaps[name] = _stamp(reservations[0]) - _stamp(job["metadata"]["creationTimestamp"])
        if len(reservations) != 1 or len(by_job.get(name, [])) != 1:
            twice.append(f"{name}: reserved at {reservations}, {len(by_job.get(name, []))} WLs")
        if not complete(job) or not all(is_true(w, "Finished") for w in by_job.get(name, [])):
            lost.append(name)
    history = checker.history_by_key()
    admissions = {key: h.admissions for key, h in history.items() if key.startswith(f"{NS}/")}
    twice += [f"{k}: {n} admissions" for k, n in admissions.items() if n != 1]
    if unadmitted:
        failures.append(f"{len(unadmitted)}/{len(names)} Jobs never admitted: {unadmitted[:10]}")
    if twice:
        failures.append(f"admitted other than once: {twice[:10]}")
    if lost:
        failures.append(f"{len(lost)} admitted Jobs not completed/finished: {lost[:10]}")
    if checker.cq_over:
        failures.append(f"ClusterQueue status above its quota: {checker.cq_over[:5]}")
    problems = checker.final_problems(queues=[CQ])
    if problems:
        failures.append("invariant checker: " + "; ".join(problems[:10]))
    if not checker.cq_versions:
        failures.append("no ClusterQueue status watched")

    bound = lease_duration + MARGIN
    rolling = {n: g for n, g in gaps.items() if stream.created[n] >= roll_started}
    steady = {n: g for n, g in gaps.items() if stream.created[n] < roll_started}
    worst = max(rolling, key=lambda n: rolling[n]) if rolling else None
    if worst is not None and rolling[worst] > bound:
        failures.append(
            f"Job {worst} waited {rolling[worst]:.0f}s for admission during the roll, more than "
            f"the lease duration {lease_duration:.0f}s + {MARGIN:.0f}s"
        )
    if not rolling:
        failures.append("no Job was created during the roll")
    summary = (
        f"[rolling] lease {lease_duration:.0f}s (renew deadline {renew_deadline:.0f}s, retry "
        f"{retry_period:.0f}s); {len(names)} Jobs; max creation->QuotaReserved gap during the "
        f"roll {rolling.get(worst, 0) if worst else 0:.0f}s ({worst}), before it "
        f"{max(steady.values(), default=0):.0f}s (bound {bound:.0f}s); Workload write pauses at "
        f"the hand-overs {', '.join(f'{p:.2f}s' for p in pauses)}; ClusterQueue peak "
        f"{checker.cq_peak} of {GPUS} GPUs over {checker.cq_versions} versions; "
        f"{len(stream.refused)} creates refused and retried; writers {writers}; "
        f"{time.monotonic() - started:.0f}s\n  " + "\n  ".join(report)
    )
    with capsys.disabled():
        sys.stdout.write("\n" + summary + "\n")
    assert not failures, summary + "\n" + "\n".join(failures)
