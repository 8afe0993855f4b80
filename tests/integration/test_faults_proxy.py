"""A burst of Jobs with preemption in a nested cohort, while the operator's API traffic goes
through a fault-injecting proxy and the operator is SIGKILLed and restarted again and again.

The operator talks to the API server only through :mod:`faultproxy`, which answers some of
its writes with a reset, a 504 or a non-JSON 500 after they landed, resets others before they
land, stalls a few past the client's timeout, and cuts a few watches. The invariant watch
connects to the API server directly, so it sees what really happened.

The quota tree: a root Cohort with quota of its own, a child Cohort under it holding both
ClusterQueues; ``-a`` lends at most ``lending_limit`` of its nominal quota, ``-b`` borrows at
most ``borrowing_limit``. Jobs carry three WorkloadPriorityClasses and the queues preempt
(withinClusterQueue LowerPriority, reclaimWithinCohort Any, borrowWithinCohort
LowerPriority), so preemptions happen throughout.

The promise held to: no admission ever takes a ClusterQueue or any Cohort of the tree past
what the tree allows (nominal quotas, borrowing and lending limits, the root's own quota), no
Workload is reserved again without an eviction in between, every Job completes with exactly
one Workload, which finishes, and no usage is left anywhere.

Seeded (``PHALANX_FAULTS_SEED``, default 7): the fault draws, the kill moments and the Jobs.
``PHALANX_FAULTS_PROXY_JOBS`` (default 1000) sizes the burst.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from faultproxy import FaultKind, FaultPolicy, FaultProxy, running_proxy
from faults_support import GPU, QUEUE_LABEL, JobBurst, api_factory

from phalanx.bench.invariants import InvariantChecker, InvariantWatch, WorkloadHistory
from phalanx.bench.proc import OperatorProcess, start_operator
from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator import kubeconfig
from phalanx.quotas.quantity import QuantityError, parse_quantity

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SEED = int(os.environ.get("PHALANX_FAULTS_SEED", "7"))
JOBS = int(os.environ.get("PHALANX_FAULTS_PROXY_JOBS", "1000"))
MIN_KILLS = 20
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
WEBHOOK_CONFIGURATION = "phalanx.kueue.x-k8s.io"  # the operator's default (kopf-managed)

FlavorResource = tuple[str, str]
Usage = dict[FlavorResource, int]

STALL_BUDGET = 3  # per stall kind: each holds a write 35 s, so keep them few


def fault_policy() -> FaultPolicy:
    return FaultPolicy(
        seed=SEED,
        status_rates={
            FaultKind.RESET_BEFORE: 0.02,
            FaultKind.DROP_AFTER: 0.02,
            FaultKind.GATEWAY_TIMEOUT: 0.02,
            FaultKind.SERVER_ERROR: 0.02,
            FaultKind.STALL_BEFORE: 0.004,
            FaultKind.STALL_AFTER: 0.004,
        },
        # Workload creation and the Job patches (suspend/start/restore), less often.
        write_rates={
            FaultKind.RESET_BEFORE: 0.01,
            FaultKind.DROP_AFTER: 0.01,
            FaultKind.GATEWAY_TIMEOUT: 0.01,
            FaultKind.SERVER_ERROR: 0.01,
        },
        budgets={
            FaultKind.STALL_BEFORE: STALL_BUDGET,
            FaultKind.STALL_AFTER: STALL_BUDGET,
            FaultKind.WATCH_CUT: 8,
        },
        stall_seconds=35.0,  # the operator's KubeApi gives a request 30 s
        watch_cut_rate=0.1,
        watch_cut_after=(5.0, 60.0),
    )


# -- the invariant, for a tree of cohorts ---------------------------------------------------------


@dataclass
class _Limits:
    nominal: Usage = field(default_factory=dict)
    borrowing: dict[FlavorResource, int] = field(default_factory=dict)
    lending: dict[FlavorResource, int] = field(default_factory=dict)


def _quantity(value: Any, resource: str) -> int:
    try:
        return parse_quantity(str(value), resource=resource)
    except QuantityError:
        return 0


def _limits(spec: Mapping[str, Any]) -> _Limits:
    out = _Limits()
    for group in spec.get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for res in flavor.get("resources") or ():
                key = (str(flavor.get("name")), str(res.get("name")))
                out.nominal[key] = _quantity(res.get("nominalQuota", 0), key[1])
                if res.get("borrowingLimit") is not None:
                    out.borrowing[key] = _quantity(res["borrowingLimit"], key[1])
                if res.get("lendingLimit") is not None:
                    out.lending[key] = _quantity(res["lendingLimit"], key[1])
    return out


@dataclass
class QuotaTree:
    """ClusterQueues and Cohorts with their limits and parents, and Kueue's arithmetic over
    them (``resource_node.go``, as ``phalanx.quotas.node`` documents it), per flavor-resource:

    - ``subtree(n) = nominal(n) + sum over children c of (subtree(c) - local(c))``
    - ``local(n) = subtree(n) - lendingLimit(n)`` when ``n`` has one (and a parent), else 0
    - ``used(queue)``: its reserved Workloads; ``used(cohort) = sum of max(0, used(c) -
      local(c))`` over its children

    Usage is within the tree's bounds when ``used(root) <= subtree(root)`` and ``used(n) <=
    subtree(n) + borrowingLimit(n)`` for every node with a borrowing limit: what Kueue's
    ``available`` never going negative amounts to."""

    queues: dict[str, _Limits] = field(default_factory=dict)
    cohorts: dict[str, _Limits] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    """Of a ClusterQueue (its cohortName) or a Cohort (its parentName)."""

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> QuotaTree:
        tree = cls()
        for obj in objects:
            name = str(obj["metadata"]["name"])
            spec = obj.get("spec") or {}
            if obj["kind"] == "ClusterQueue":
                tree.queues[name] = _limits(spec)
                if spec.get("cohortName"):
                    tree.parent[name] = str(spec["cohortName"])
            elif obj["kind"] == "Cohort":
                tree.cohorts[name] = _limits(spec)
                if spec.get("parentName"):
                    tree.parent[name] = str(spec["parentName"])
        for cohort in list(tree.parent.values()):
            tree.cohorts.setdefault(cohort, _Limits())  # named by a child only: no quota
        return tree

    def root(self, node: str) -> str:
        seen = {node}
        while node in self.parent and self.parent[node] not in seen:
            node = self.parent[node]
            seen.add(node)
        return node

    def nested(self, cohort: str) -> bool:
        """Part of a tree deeper than one cohort (where a flat cohort bound is wrong)."""
        return cohort in self.parent or any(
            p == cohort and child in self.cohorts for child, p in self.parent.items()
        )

    def evaluate(
        self, queue: str, key: FlavorResource, reserved: Mapping[str, Usage]
    ) -> tuple[list[str], dict[str, int]]:
        """Over the tree holding ``queue``: the bounds broken, and ``used`` per node."""
        root = self.root(queue)
        children: dict[str, list[str]] = {}
        for child, parent in self.parent.items():
            children.setdefault(parent, []).append(child)
        problems: list[str] = []
        used_by: dict[str, int] = {}

        def visit(node: str, depth: int) -> tuple[int, int, int]:
            is_cohort = node in self.cohorts
            limits = (self.cohorts if is_cohort else self.queues).get(node, _Limits())
            subtree = limits.nominal.get(key, 0)
            if is_cohort:
                used = 0
                for child in sorted(children.get(node, ())) if depth < 32 else ():
                    c_subtree, c_local, c_used = visit(child, depth + 1)
                    subtree += c_subtree - c_local
                    used += max(0, c_used - c_local)
            else:
                used = reserved.get(node, {}).get(key, 0)
            used_by[node] = used
            lend = limits.lending.get(key)
            local = max(0, subtree - lend) if lend is not None and node != root else 0
            limit = limits.borrowing.get(key)
            if limit is not None and node != root and used > subtree + limit:
                problems.append(
                    f"{'Cohort' if is_cohort else 'ClusterQueue'} {node} {key[0]}/{key[1]}"
                    f" uses {used} > {subtree + limit} (subtree quota {subtree}"
                    f" + borrowingLimit {limit})"
                )
            return subtree, local, used

        subtree, _, used = visit(root, 0)
        if used > subtree:
            problems.append(
                f"cohort tree {root} {key[0]}/{key[1]} uses {used} > {subtree}"
                " (the tree's quota, lending limits applied)"
            )
        return problems, used_by


class TreeInvariantChecker(InvariantChecker):
    """The suite's :class:`InvariantChecker`, its cohort bound taken over the whole tree.

    The base bounds a cohort by its members' nominal quotas plus the cohort's own: right for
    a flat cohort, too strict for a child cohort, whose parent's quota legitimately flows
    down (and blind to lending limits). So every time the base judges limits (usage grew),
    :class:`QuotaTree` judges the tree holding that queue on the same reserved usage, and
    the base's flat verdicts on a nested cohort are kept aside (``superseded``, reported)
    instead of counted: the tree bound is the right one there, and implies the flat one
    wherever that one is right. Everything else (per-queue nominal + borrowingLimit, double
    admissions, duplicates, leaks, relists) is the base's, unchanged."""

    def __init__(self, tree: QuotaTree) -> None:
        super().__init__()
        self.tree = tree
        self.tree_checks = 0
        self.tree_peak: dict[str, Usage] = {}
        """Highest ``used`` seen per tree node (queues and cohorts)."""
        self.superseded: list[str] = []

    # The base's signature differs between versions (one Workload, or the Workloads a relist
    # grew): take whichever, and judge the tree after the base has judged the queues. Called
    # under the base's lock, on the watch's event-loop thread.
    def _check_limits(self, *args: Any, **kwargs: Any) -> None:
        super()._check_limits(*args, **kwargs)
        first = args[0] if args else kwargs.get("grown", kwargs.get("history"))
        grown = list(first) if isinstance(first, list | tuple) else [first]
        judged: set[tuple[str, FlavorResource]] = set()
        for history in grown:
            if not isinstance(history, WorkloadHistory) or history.held is None:
                continue
            queue = history.cluster_queue
            if queue not in self.tree.queues:
                continue
            root = self.tree.root(queue)
            for key in history.held:
                if (root, key) in judged:
                    continue
                judged.add((root, key))
                self.tree_checks += 1
                problems, used_by = self.tree.evaluate(queue, key, self.reserved)
                for node, used in used_by.items():
                    peak = self.tree_peak.setdefault(node, {})
                    peak[key] = max(peak.get(key, 0), used)
                for problem in problems:
                    super()._violate("overshoot", history.key, f"admitted in {queue}: {problem}")

    def _violate(self, kind: str, subject: str, detail: str) -> None:
        flat = re.match(r"cohort (\S+) ", detail)
        if kind == "overshoot" and flat and self.tree.nested(flat.group(1)):
            self.superseded.append(f"{subject}: {detail}")
            return
        super()._violate(kind, subject, detail)


@contextlib.contextmanager
def tree_invariant_watch(cluster: ClusterHandle, tree: QuotaTree) -> Iterator[InvariantWatch]:
    """``faults_support.invariant_watch`` with the tree-aware checker; straight to the API
    server (the cluster's own kubeconfig), never through the proxy."""
    watch = InvariantWatch(api_factory(cluster), checker=TreeInvariantChecker(tree))
    watch.start_thread()
    try:
        yield watch
    finally:
        watch.stop_thread()


# -- the burst ------------------------------------------------------------------------------------


@dataclass
class NestedCohortBurst(JobBurst):
    """:class:`JobBurst`'s Jobs, with priorities, over two preempting ClusterQueues in a child
    Cohort of a root Cohort. ``-a`` (the lender) has a lendingLimit, ``-b`` a
    borrowingLimit; the first half of the Jobs go mostly to ``-b`` (it borrows), the second
    half mostly to ``-a`` (it reclaims)."""

    seed: int = 7
    lender_gpus: int = 16
    lending_limit: int = 6
    borrower_gpus: int = 16
    borrowing_limit: int = 12
    root_gpus: int = 4
    priorities: tuple[tuple[str, int, float], ...] = (
        ("low", 100, 0.7),
        ("mid", 500, 0.2),
        ("high", 1000, 0.1),
    )

    @property
    def flavor(self) -> str:
        return f"{self.prefix}-gpu"

    @property
    def root_cohort(self) -> str:
        return f"{self.prefix}-root"

    @property
    def child_cohort(self) -> str:
        return f"{self.prefix}-child"

    def priority_class(self, level: str) -> str:
        return f"{self.prefix}-{level}"

    def _resource_group(self, cpu: str, gpu: dict[str, str]) -> list[dict[str, Any]]:
        return [
            {
                "coveredResources": ["cpu", GPU],
                "flavors": [
                    {
                        "name": self.flavor,
                        "resources": [{"name": "cpu", "nominalQuota": cpu}, {"name": GPU, **gpu}],
                    }
                ],
            }
        ]

    def objects(self) -> list[dict[str, Any]]:
        kueue = "kueue.x-k8s.io/v1beta2"
        preemption = {
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "LowerPriority"},
        }
        lender, borrower = self.queues
        objects: list[dict[str, Any]] = [
            {"apiVersion": kueue, "kind": "ResourceFlavor", "metadata": {"name": self.flavor}},
            *(
                {
                    "apiVersion": kueue,
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": self.priority_class(level)},
                    "value": value,
                }
                for level, value, _ in self.priorities
            ),
            {
                "apiVersion": kueue,
                "kind": "Cohort",
                "metadata": {"name": self.root_cohort},
                "spec": {
                    "resourceGroups": self._resource_group(
                        "0", {"nominalQuota": str(self.root_gpus)}
                    )
                },
            },
            {
                "apiVersion": kueue,
                "kind": "Cohort",
                "metadata": {"name": self.child_cohort},
                "spec": {"parentName": self.root_cohort},
            },
            self._cluster_queue(
                lender,
                {"nominalQuota": str(self.lender_gpus), "lendingLimit": str(self.lending_limit)},
                preemption,
            ),
            self._cluster_queue(
                borrower,
                {
                    "nominalQuota": str(self.borrower_gpus),
                    "borrowingLimit": str(self.borrowing_limit),
                },
                preemption,
            ),
        ]
        for cq in self.queues:
            objects.append(
                {
                    "apiVersion": kueue,
                    "kind": "LocalQueue",
                    "metadata": {"name": cq, "namespace": self.namespace},
                    "spec": {"clusterQueue": cq},
                }
            )
        return objects

    def _cluster_queue(
        self, name: str, gpu: dict[str, str], preemption: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "cohortName": self.child_cohort,
                "namespaceSelector": {},
                "preemption": preemption,
                "resourceGroups": self._resource_group("1000", gpu),
            },
        }

    def setup(self) -> None:
        self.teardown()
        self.cluster.kubectl_ok("create", "namespace", self.namespace)
        self.cluster.kubectl_ok("apply", "-f", "-", input=yaml.safe_dump_all(self.objects()))

    def job(self, index: int) -> dict[str, Any]:
        job = super().job(index)
        rng = random.Random(f"{self.seed}-{index}")
        first_half = index < self.jobs // 2
        to_borrower = rng.random() < (0.7 if first_half else 0.3)
        draw, edge, level = rng.random(), 0.0, self.priorities[0][0]
        for name, _, share in self.priorities:
            edge += share
            if draw < edge:
                level = name
                break
        job["metadata"]["labels"] = {
            QUEUE_LABEL: self.queues[1 if to_borrower else 0],
            PRIORITY_LABEL: self.priority_class(level),
        }
        return job

    def teardown(self) -> None:
        """Delete everything :meth:`setup` made. Runs with no operator up (before the first
        start, after the last stop): the webhook configuration a stopped operator left points
        at its dead port and fails closed, refusing every change to the queues, so it goes
        first (the next operator registers its own)."""
        c = self.cluster
        c.kubectl(
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            WEBHOOK_CONFIGURATION,
            "--ignore-not-found",
        )
        c.kubectl(
            "delete", "namespace", self.namespace, "--ignore-not-found", "--wait=true", timeout=300
        )
        for cq in self.queues:
            c.kubectl("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false")
            # The resource-in-use finalizer is the operator's to remove; none may be running.
            c.kubectl(
                "patch",
                "clusterqueue",
                cq,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
            )
        c.kubectl(
            "delete",
            "cohort",
            self.child_cohort,
            self.root_cohort,
            "--ignore-not-found",
            "--wait=false",
        )
        c.kubectl(
            "delete",
            "workloadpriorityclass",
            *(self.priority_class(level) for level, _, _ in self.priorities),
            "--ignore-not-found",
            "--wait=false",
        )
        c.kubectl("delete", "resourceflavor", self.flavor, "--ignore-not-found", "--wait=false")
        c.kubectl(
            "patch",
            "resourceflavor",
            self.flavor,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
        )


def _job_of(workload_key: str) -> str:
    """``ns/job-<job name>-<5 hex>`` -> ``<job name>`` (the Job integration's naming)."""
    name = workload_key.split("/", 1)[1].removeprefix("job-")
    return name.rsplit("-", 1)[0]


def _by_job(watch: InvariantWatch, namespace: str) -> dict[str, list[WorkloadHistory]]:
    out: dict[str, list[WorkloadHistory]] = {}
    for h in watch.checker.history_by_key().values():
        if h.key.startswith(f"{namespace}/"):
            out.setdefault(_job_of(h.key), []).append(h)
    return out


def _finished(watch: InvariantWatch, namespace: str) -> int:
    return sum(1 for hs in _by_job(watch, namespace).values() if all(h.finished for h in hs))


# -- evidence -------------------------------------------------------------------------------------


_EVICTING = re.compile(r"event=evicting workload=(\S+) reason=(\S+) preemption=(\S+)")


def preemptions_in_log(text: str) -> Counter[str]:
    """``event=evicting ... reason=Preempted`` lines per preemption reason (a restart may log
    an eviction its predecessor started once more: count Workloads too, see the caller)."""
    return Counter(m.group(3) for m in _EVICTING.finditer(text) if m.group(2) == "Preempted")


def preempted_workloads(text: str) -> set[str]:
    return {m.group(1) for m in _EVICTING.finditer(text) if m.group(2) == "Preempted"}


def evidence(
    subjects: list[str], watch: InvariantWatch, proxy: FaultProxy, log_text: str
) -> list[str]:
    """For each Workload (or Job: its Workloads) named in a problem: its history as the
    checker saw it, the faults the proxy injected on its requests (the Job's too), and the
    operator's log lines about it."""
    history = watch.checker.history_by_key()
    lines: list[str] = []
    for key in subjects[:10]:
        namespace, _, name = key.rpartition("/")
        found = [history[key]] if key in history else _by_job(watch, namespace).get(name, [])
        names = {name} | {h.key.rpartition("/")[2] for h in found}
        lines.append(f"== {key}")
        for h in found:
            lines.append(
                f"   checker {h.key}: admissions={h.admissions} evictions={h.evictions}"
                f" finished={h.finished} queue={h.cluster_queue} admitted_at={h.admitted_at}"
            )
        for r in proxy.records():
            if r.path.rstrip("/").split("/")[-1] in names or any(f"/{n}/" in r.path for n in names):
                at = time.strftime("%H:%M:%S", time.localtime(r.at))
                lines.append(
                    f"   fault {at}.{int(r.at % 1 * 1000):03d} {r.kind} {r.method} {r.path}"
                    f" upstream={r.upstream_status}"
                )
        mentions = re.compile("|".join(rf"(?<![\w]){re.escape(n)}(?![\w])" for n in names))
        lines.extend(f"   log {line}" for line in log_text.splitlines() if mentions.search(line))
    return lines


# -- the test -------------------------------------------------------------------------------------


@pytest.mark.scale
def test_a_burst_through_a_faulty_api_path_with_kills_keeps_the_promise(
    fault_cluster: ClusterHandle, tmp_path: Path
) -> None:
    wall_started = time.monotonic()
    rng = random.Random(SEED)
    burst = NestedCohortBurst(fault_cluster, "faults-proxy", jobs=JOBS, run_seconds="1", seed=SEED)
    burst.setup()
    ns = burst.namespace
    kills: list[dict[str, Any]] = []
    op: OperatorProcess | None = None
    log = tmp_path / "operator.log"
    policy = fault_policy()

    def stop_operator() -> None:
        if op is not None:
            op.stop()

    try:
        auth = kubeconfig.load(fault_cluster.kubeconfig)
        with (
            running_proxy(auth, policy) as proxy,
            tree_invariant_watch(fault_cluster, QuotaTree.from_objects(burst.objects())) as watch,
            contextlib.ExitStack() as stack,
        ):
            proxy_kubeconfig = proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig")
            stack.callback(stop_operator)  # before the proxy goes: its cleanup goes through it
            op = start_operator(kubeconfig=proxy_kubeconfig, workdir=tmp_path)
            op.wait_ready(timeout=120)
            # Ready comes a moment before its webhooks are registered (teardown removed the
            # last ones): no Job may slip in unsuspended, this test is not about that.
            _wait_webhooks(fault_cluster, op)
            started = time.monotonic()
            creation_errors: list[str] = []

            def create() -> None:
                creation_errors.extend(burst.create(batch=25, deadline=900))

            creator = threading.Thread(target=create, daemon=True)
            creator.start()
            # Kill, come back 0-3 s later, live 4-12 s (sometimes killed before ready), until
            # MIN_KILLS kills and at least 90 s of them; every kill while Jobs are unfinished.
            time.sleep(rng.uniform(3, 6))
            while len(kills) < MIN_KILLS or time.monotonic() - started < 90:
                finished = _finished(watch, ns)
                if finished >= JOBS:
                    break
                assert op.alive(), f"the operator died by itself:\n{op.log_tail()}"
                op.kill()
                down = rng.uniform(0, 3)
                kills.append(
                    {
                        "at_s": round(time.monotonic() - started, 1),
                        "down_s": round(down, 1),
                        "finished_before": finished,
                    }
                )
                time.sleep(down)
                op = start_operator(kubeconfig=proxy_kubeconfig, workdir=tmp_path)
                time.sleep(rng.uniform(4, 12))
            kills_done = time.monotonic() - started
            creator.join(timeout=900)
            assert not creator.is_alive(), "Job creation did not finish"
            op.wait_ready(timeout=120)
            took = _wait_finished(watch, ns, timeout=900, stall=180)
            faults = proxy.counts()
            log_text = op.log_text()
            report = _verify(burst, watch)
            problems = report["problems"]
            if problems:
                subjects = sorted({p.split(" ")[1].rstrip(":") for p in problems})
                detail = evidence(subjects, watch, proxy, log_text)
                (tmp_path / "evidence.txt").write_text("\n".join(problems + detail) + "\n")
                trace_lines = getattr(watch.checker, "trace_lines", None)
                if trace_lines is not None:
                    (tmp_path / "checker-trace.txt").write_text("\n".join(trace_lines()) + "\n")
            preemptions = preemptions_in_log(log_text)
            preempted = preempted_workloads(log_text)
            evictions = sum(h.evictions for h in _histories(watch, ns))
            readmitted = sum(1 for h in _histories(watch, ns) if h.admissions > 1)
            wall = time.monotonic() - wall_started
            checker = watch.checker
            assert isinstance(checker, TreeInvariantChecker)
            sys.stderr.write(
                f"\n[faults-proxy] seed {SEED}: {JOBS} Jobs, {len(kills)} kills in"
                f" {kills_done:.0f}s {kills}\n"
                f"[faults-proxy] faults {faults}; by class {proxy.counts_by_class()};"
                f" requests {proxy.seen()}; upstream errors {proxy.upstream_errors}\n"
                f"[faults-proxy] preemptions in the log {dict(preemptions)} over"
                f" {len(preempted)} Workloads; evictions seen {evictions}; Workloads admitted"
                f" more than once {readmitted}; tree checks {checker.tree_checks}"
                f" (flat cohort verdicts set aside: {len(checker.superseded)});"
                f" peak per node {checker.tree_peak}\n"
                f"[faults-proxy] waited {took:.0f}s after the kills for the rest; creation retries"
                f" {len(creation_errors)}; wall {wall:.0f}s; log {log}\n"
            )
            assert not problems, (
                f"{len(problems)} problems {dict(Counter(p.split(' ')[0] for p in problems))}"
                f" (evidence in {tmp_path / 'evidence.txt'}):\n  " + "\n  ".join(problems[:40])
            )
            assert len(kills) >= MIN_KILLS, kills
            assert all(k["finished_before"] < JOBS for k in kills)
            for kind in FaultKind:
                least = 1 if kind in (FaultKind.STALL_BEFORE, FaultKind.STALL_AFTER) else 3
                if kind is FaultKind.WATCH_CUT:
                    least = 1
                assert faults[kind.value] >= least, f"{kind} injected {faults[kind.value]}x"
            assert sum(preemptions.values()) >= 20, preemptions
            assert evictions >= 20 and readmitted >= 20, (evictions, readmitted)
            peak = checker.tree_peak
            flavor_gpu = (burst.flavor, GPU)
            # The tree was used as a tree: the borrower borrowed, and the child cohort drew
            # on the root's own quota at some point.
            assert peak.get(burst.queues[1], {}).get(flavor_gpu, 0) > burst.borrower_gpus, peak
            assert (
                peak.get(burst.child_cohort, {}).get(flavor_gpu, 0)
                > burst.lending_limit + burst.borrower_gpus
            ), peak
    finally:
        stop_operator()
        sys.stderr.write(f"\n[faults-proxy] operator log: {log}\n")
        burst.teardown()


def _wait_webhooks(cluster: ClusterHandle, op: OperatorProcess, *, timeout: float = 60.0) -> None:
    """Until both webhook configurations point at ``op``'s webhook port."""
    port = next(a.split("=", 1)[1] for a in op.argv if a.startswith("--webhook-port="))
    deadline = time.monotonic() + timeout
    while True:
        urls = [
            cluster.kubectl(
                "get",
                kind,
                WEBHOOK_CONFIGURATION,
                "-o",
                "jsonpath={.webhooks[*].clientConfig.url}",
            ).stdout
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
        ]
        if all(f":{port}/" in url for url in urls):
            return
        assert time.monotonic() < deadline, f"webhooks not registered for :{port}: {urls}"
        time.sleep(0.2)


def _histories(watch: InvariantWatch, namespace: str) -> list[WorkloadHistory]:
    return [h for hs in _by_job(watch, namespace).values() for h in hs]


def _wait_finished(watch: InvariantWatch, namespace: str, *, timeout: float, stall: float) -> float:
    """Until every Job's Workload is Finished (as the invariant watch sees it), ``timeout``
    passes, or nothing finishes for ``stall`` seconds; the seconds waited."""
    started = last_change = time.monotonic()
    done = -1
    while time.monotonic() - started < timeout:
        now_done = _finished(watch, namespace)
        if now_done >= JOBS:
            break
        if now_done != done:
            done, last_change = now_done, time.monotonic()
        elif time.monotonic() - last_change > stall:
            break
        time.sleep(2.0)
    return time.monotonic() - started


def _verify(
    burst: NestedCohortBurst, watch: InvariantWatch, *, settle: float = 30.0
) -> dict[str, Any]:
    """Every check, evaluated together: Jobs complete, one Workload each, Finished, each
    re-admission after an eviction, the checker's violations and leaks."""
    problems: list[str] = []
    jobs = burst.job_list()
    by_name = {j["metadata"]["name"]: j for j in jobs}
    if len(jobs) != burst.jobs:
        problems.append(f"lost {burst.namespace}/Jobs: {len(jobs)} exist, {burst.jobs} created")
    by_job = _by_job(watch, burst.namespace)
    for name in burst.names:
        key = f"{burst.namespace}/{name}"
        histories = by_job.get(name, [])
        if not _complete(by_name.get(name) or {}):
            problems.append(
                f"incomplete {key}: the Job is not Complete ({_job_state(by_name.get(name))})"
            )
        if len(histories) != 1:
            problems.append(f"workloads {key}: {len(histories)} Workloads")
        for h in histories:
            if not h.finished:
                problems.append(f"unfinished {h.key}: not Finished")
            if h.admissions < 1:
                problems.append(f"never_admitted {h.key}")
            if h.admissions > h.evictions + 1:
                problems.append(
                    f"readmitted {h.key}: {h.admissions} admissions, {h.evictions} evictions"
                )
    deadline = time.monotonic() + settle
    final = watch.checker.final_problems(queues=burst.queues)
    while final and time.monotonic() < deadline:
        time.sleep(1.0)  # queue status is written in batches
        final = watch.checker.final_problems(queues=burst.queues)
    problems.extend(final)
    return {"problems": problems}


def _job_state(job: dict[str, Any] | None) -> str:
    if job is None:
        return "gone"
    status = job.get("status") or {}
    conditions = ",".join(
        f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or ()
    )
    return (
        f"suspend={(job.get('spec') or {}).get('suspend')} startTime={status.get('startTime')}"
        f" active={status.get('active', 0)} succeeded={status.get('succeeded', 0)}"
        f" conditions={conditions or '-'}"
    )


def _complete(job: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or ()
    )


# -- the tree bound itself (no cluster needed) ----------------------------------------------------


def _tree_burst() -> NestedCohortBurst:
    return NestedCohortBurst(cast(ClusterHandle, None), "t", jobs=10)


@pytest.mark.parametrize(
    ("used_a", "used_b", "broken"),
    [
        (16, 10, []),
        (10, 26, []),  # b: 16 own + 6 lent by a + 4 of the root
        (16, 20, []),  # 36 > 32 nominal: the root's 4 flow down (a flat bound says overshoot)
        (36, 0, []),  # a: 16 own + 16 of b + 4 of the root
        (10, 27, ["cohort tree t-root"]),  # within b's borrowingLimit, past a's lendingLimit
        (0, 29, ["ClusterQueue t-b", "cohort tree t-root"]),
        (37, 0, ["cohort tree t-root"]),
    ],
)
def test_the_tree_bound_applies_lending_and_borrowing_limits_and_the_roots_quota(
    used_a: int, used_b: int, broken: list[str]
) -> None:
    burst = _tree_burst()
    tree = QuotaTree.from_objects(burst.objects())
    key = (burst.flavor, GPU)
    reserved = {"t-a": {key: used_a}, "t-b": {key: used_b}}
    problems, used_by = tree.evaluate("t-b", key, reserved)
    assert [p for p in broken if not any(q.startswith(p) for q in problems)] == [], problems
    assert len(problems) == len(broken), problems
    assert used_by["t-child"] == max(0, used_a - 10) + used_b
    assert tree.nested("t-child") and tree.nested("t-root")


def test_the_tree_checker_judges_admissions_and_sets_the_flat_cohort_bound_aside() -> None:
    burst = _tree_burst()
    objects = burst.objects()
    checker = TreeInvariantChecker(QuotaTree.from_objects(objects))
    for obj in objects:
        if obj["kind"] == "ClusterQueue":
            checker.on_cluster_queue("ADDED", obj)
        elif obj["kind"] == "Cohort":
            checker.on_cohort("ADDED", obj)

    def reserve(name: str, queue: str, gpus: int) -> None:
        checker.on_workload(
            "ADDED",
            {
                "metadata": {"uid": name, "namespace": "t", "name": name},
                "status": {
                    "conditions": [{"type": "QuotaReserved", "status": "True"}],
                    "admission": {
                        "clusterQueue": queue,
                        "podSetAssignments": [
                            {
                                "name": "main",
                                "flavors": {GPU: burst.flavor},
                                "resourceUsage": {GPU: str(gpus)},
                                "count": 1,
                            }
                        ],
                    },
                },
            },
        )

    reserve("a1", "t-a", 16)
    reserve("b1", "t-b", 20)  # 36: the root's quota in use, within every bound of the tree
    assert checker.snapshot() == []
    # The base's flat bound (32, the members' nominal quotas) said overshoot: set aside.
    assert any("cohort t-child" in s for s in checker.superseded), checker.superseded
    assert checker.tree_checks == 2
    assert checker.tree_peak["t-child"][(burst.flavor, GPU)] == 26
    reserve("b2", "t-b", 1)  # 37 > 36
    violations = checker.snapshot()
    assert [v.subject for v in violations] == ["t/b2"], violations
    assert "cohort tree t-root" in violations[0].detail
