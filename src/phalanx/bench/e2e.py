"""``phalanx bench e2e``: replay a Kueue scheduler-performance scenario through a real API
server with the operator running, in real time.

Steps (each a function below):

1. install the CRDs if given, remove a previous run's leftovers, start a fresh operator
   (unless one already runs against the cluster);
2. for a TAS scenario create its nodes (KWOK) and Topology; create the scenario's
   ResourceFlavor, ClusterQueues, Namespaces and LocalQueues, and wait until the operator
   reports every ClusterQueue Active;
3. watch the run's Workloads (label selector) feeding a :class:`WorkloadTracker` (finishes
   each Workload ``runtimeMs`` after Admitted, as Kueue's runner) and an
   :class:`InvariantChecker` (and, for TAS, an :class:`AssignmentChecker`);
4. create the Workloads at their creation intervals, concurrent POSTs through a bounded
   pool, until every one is Finished, sampling the operator's resident memory meanwhile;
5. read the operator's API-write counter and CPU time, check invariants and leaks, delete
   everything the run created.

Time to admission counts from each Workload's scheduled creation (``t0`` + its ``at_ms``),
not from when the bench got it created: a creation backlog counts against the system. The
from-creation figure and the creation lag are reported beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import logging
import os
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from phalanx.bench import identity
from phalanx.bench.core_replay import Scenario, ideal_ms
from phalanx.bench.invariants import InvariantChecker, ListingInformer
from phalanx.bench.objects import (
    PlannedWorkload,
    plan,
    workload_object,
)
from phalanx.bench.proc import (
    OperatorProcess,
    RssSampler,
    cpu_seconds,
    scrape,
    start_operator,
)
from phalanx.bench.result import E2EResult, e2e_problems, store_cpu, write_counts
from phalanx.bench.setup import SELECTOR, ScenarioObjects
from phalanx.bench.tas import AssignmentChecker, Demand, TopologySpec, plan_nodes
from phalanx.bench.tracker import Track, WorkloadTracker, percentile
from phalanx.operator import kubeconfig
from phalanx.operator.kube import (
    CLUSTER_QUEUES,
    WORKLOADS,
    ApiError,
    KubeApi,
)
from phalanx.store.db import STORE_ENV

__all__ = ["E2EOptions", "E2EResult", "e2e_problems", "operator_store", "run_e2e"]

logger = logging.getLogger(__name__)

FIELD_MANAGER = "phalanx-bench-finished"
TIMELINE_FILE = "workloads.csv"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True)
class E2EOptions:
    kubeconfig: Path
    workdir: Path
    start_operator: bool = True
    operator_metrics_url: str | None = None
    operator_pid: int | None = None
    operator_args: tuple[str, ...] = ()
    crds: tuple[dict[str, Any], ...] = ()
    concurrency: int = 48
    timeout_s: float | None = None
    """Give up waiting for every Workload to finish after this long (default 10 x ideal,
    at least 10 minutes)."""
    control_plane_pids: Mapping[str, int] = field(default_factory=dict)
    cleanup: bool = True
    operator_service_account: bool = False
    """Start the operator with a ServiceAccount token of its own, as an installed operator
    runs (:mod:`phalanx.bench.identity`), rather than with ``kubeconfig``'s credentials."""
    before_run: Callable[[], Sequence[str]] | None = None
    """Called (in a thread) once the scenario's nodes and queues are in place and the
    operator runs, before the measured run; returns the names of the control-plane
    components it stopped, which the result reports (``bench e2e --bare``)."""


def _v1beta1_served(crds: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether any of the CRDs a run installs serves v1beta1; None when it installs none."""
    if not crds:
        return None
    return any(
        v.get("name") == "v1beta1" and v.get("served")
        for crd in crds
        for v in crd.get("spec", {}).get("versions", ())
    )


def operator_store(workdir: Path, environ: Mapping[str, str]) -> str:
    """The history store of the operator a run starts. The run's Workloads are not the
    user's: a fresh SQLite file in the run's folder, not the default store (whose history
    would also slow the writer), unless ``$PHALANX_STORE`` names one (or ``off``)."""
    return environ.get(STORE_ENV) or f"sqlite:///{workdir / 'store.db'}"


def run_e2e(
    scenario: Scenario, options: E2EOptions, *, topology: TopologySpec | None = None
) -> E2EResult:
    """``topology``: a TAS scenario's, whose nodes the run creates (and deletes)."""
    return asyncio.run(_Run(scenario, options, topology).run())


class _Run:
    def __init__(
        self, scenario: Scenario, options: E2EOptions, topology: TopologySpec | None = None
    ) -> None:
        self.scenario = scenario
        self.options = options
        self.topology = topology
        self.queues, self.workloads = plan(scenario)
        self.nodes = plan_nodes(topology) if topology is not None else []
        self.tas = AssignmentChecker(
            self.nodes,
            {
                w.key: Demand(pods=w.pod_count, cpu=w.request, request=w.topology)
                for w in self.workloads
                if w.topology is not None
            },
        )
        self.api: KubeApi | None = None
        self.operator: OperatorProcess | None = None
        self.create_errors = 0
        self.finish_writes = 0
        self.checker = InvariantChecker()
        self.stopped_components: tuple[str, ...] = ()

    @property
    def kube(self) -> KubeApi:
        assert self.api is not None
        return self.api

    async def run(self) -> E2EResult:
        auth = kubeconfig.load(self.options.kubeconfig)
        self.api = KubeApi(auth, connection_limit=2 * self.options.concurrency + 8)
        self.objects = ScenarioObjects(
            self.api,
            self.scenario,
            self.queues,
            concurrency=self.options.concurrency,
            topology=self.topology,
            nodes=self.nodes,
        )
        informers: list[ListingInformer] = []
        try:
            started = time.monotonic()
            if self.options.crds:
                await self.objects.install_crds(self.options.crds)
            await self.objects.remove_leftovers()
            if self.options.start_operator:
                operator_kubeconfig = self.options.kubeconfig
                if self.options.operator_service_account:
                    operator_kubeconfig = await identity.operator_kubeconfig(
                        self.kube, self.options.kubeconfig
                    )
                self.operator = await asyncio.to_thread(self._start_operator, operator_kubeconfig)
            await self.objects.create_topology()
            await self.objects.create_queues()
            await self.objects.wait_active()
            if self.options.before_run is not None:
                self.stopped_components = tuple(await asyncio.to_thread(self.options.before_run))
            setup_s = time.monotonic() - started
            tracker = WorkloadTracker(self.workloads, finish=self._finish)

            def on_workload(event_type: str, obj: dict[str, Any]) -> None:
                tracker.on_event(event_type, obj)
                self.checker.on_workload(event_type, obj)
                self.tas.on_workload(event_type, obj)

            def on_workload_list(objects: list[dict[str, Any]], rv: str | None) -> None:
                # A relist (the start, or after a watch gap) is judged whole by the checker:
                # fed item by item, it mixes listed and stale Workloads (false overshoots).
                for obj in objects:
                    tracker.on_event("ADDED", obj)
                self.checker.on_workload_list(objects, resource_version=rv)
                self.tas.on_workload_list(objects)

            informers = [
                ListingInformer(
                    self.kube,
                    CLUSTER_QUEUES,
                    self.checker.on_cluster_queue,
                    lambda objects, _rv: self.checker.on_cluster_queue_list(objects),
                    label_selector=SELECTOR,
                ),
                ListingInformer(
                    self.kube,
                    WORKLOADS,
                    on_workload,
                    on_workload_list,
                    label_selector=SELECTOR,
                ),
            ]
            for informer in informers:
                informer.start()
            await asyncio.gather(*(i.synced.wait() for i in informers))
            return await self._measure(tracker, setup_s)
        finally:
            for informer in informers:
                await informer.stop()
            if self.operator is not None:
                await asyncio.to_thread(self.operator.stop)
            if self.options.cleanup:
                await self.objects.delete_everything()
            await self.kube.close()

    # -- 1. preparation -------------------------------------------------------------------------

    def _start_operator(self, kubeconfig: Path) -> OperatorProcess:
        store = operator_store(self.options.workdir, os.environ)
        op = start_operator(
            kubeconfig=kubeconfig,
            workdir=self.options.workdir,
            extra=self.options.operator_args,
            env={STORE_ENV: store},
        )
        op.wait_ready(timeout=120)
        time.sleep(1.0)  # let kopf finish writing the webhook configurations
        return op

    # -- 2. the run -----------------------------------------------------------------------------

    def _metrics_url(self) -> str | None:
        if self.operator is not None:
            return self.operator.metrics_url
        return self.options.operator_metrics_url

    def _operator_pid(self) -> int | None:
        return self.operator.pid if self.operator is not None else self.options.operator_pid

    async def _scrape(self) -> str | None:
        url = self._metrics_url()
        if url is None:
            return None
        try:
            return await asyncio.to_thread(scrape, url)
        except OSError as error:
            logger.warning("event=metrics_scrape_failed url=%s error=%r", url, error)
            return None

    def _cpu(self) -> tuple[float | None, dict[str, float]]:
        pid = self._operator_pid()
        operator = cpu_seconds(pid) if pid else None
        plane = {
            name: value
            for name, p in self.options.control_plane_pids.items()
            if (value := cpu_seconds(p)) is not None
        }
        return operator, plane

    async def _measure(self, tracker: WorkloadTracker, setup_s: float) -> E2EResult:
        before_text = await self._scrape()
        cpu_before, plane_before = self._cpu()
        bench_before = _own_cpu()
        pid = self._operator_pid()
        rss = RssSampler.for_pid(pid, interval=0.5) if pid else None
        if rss is not None:
            rss.start()
        t0 = time.monotonic()
        timeout = self.options.timeout_s or max(600.0, 10 * ideal_ms(self.scenario) / 1000)
        dispatcher = asyncio.get_running_loop().create_task(self._dispatch(tracker, t0))
        try:
            try:
                await asyncio.wait_for(tracker.all_finished.wait(), timeout=timeout)
            except TimeoutError:
                logger.warning(
                    "event=bench_timeout finished=%d of=%d", tracker.finished, len(tracker.tracks)
                )
            dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
            await tracker.drain()
        finally:
            if rss is not None:
                await asyncio.to_thread(rss.stop)
        if rss is not None and rss.longest_gap_s > 1.0:
            logger.warning("event=rss_sample_gap longest_s=%.2f", rss.longest_gap_s)
        end = tracker.last_finished_at or time.monotonic()
        self._write_timeline(tracker, t0)
        after_text = await self._scrape()
        cpu_after, plane_after = self._cpu()
        bench_cpu = _own_cpu() - bench_before
        problems = await self._final_invariants()
        return self._result(
            tracker,
            t0=t0,
            end=end,
            before=before_text,
            after=after_text,
            operator_cpu=None
            if cpu_before is None or cpu_after is None
            else cpu_after - cpu_before,
            plane={k: plane_after[k] - plane_before[k] for k in plane_after if k in plane_before},
            bench_cpu=bench_cpu,
            problems=problems,
            setup_s=setup_s,
            rss=rss,
        )

    async def _dispatch(self, tracker: WorkloadTracker, t0: float) -> None:
        semaphore = asyncio.Semaphore(self.options.concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def post(workload: PlannedWorkload) -> None:
            try:
                await self.objects.create(
                    WORKLOADS, workload_object(workload), namespace=workload.namespace
                )
                tracker.created(workload.key, time.monotonic())
            except Exception as error:
                self.create_errors += 1
                logger.warning(
                    "event=bench_create_failed workload=%s error=%r", workload.key, error
                )
            finally:
                semaphore.release()

        for workload in self.workloads:
            delay = workload.scheduled_at(t0) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await semaphore.acquire()
            task = asyncio.get_running_loop().create_task(post(workload))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _finish(self, track: Track, generation: int) -> None:
        """Kueue's runner: ``Finished=True`` (reason ByTest) by a status apply of its own."""
        p = track.planned
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": p.name, "namespace": p.namespace},
            "status": {
                "conditions": [
                    {
                        "type": "Finished",
                        "status": "True",
                        "reason": "ByTest",
                        "message": "By test runner",
                        "lastTransitionTime": now,
                    }
                ]
            },
        }
        path = WORKLOADS.path(namespace=p.namespace, name=p.name) + "/status"
        for attempt in range(8):
            if track.generation != generation or track.finished_at is not None:
                return
            try:
                await self.kube.request(
                    "PATCH",
                    path,
                    params={"fieldManager": FIELD_MANAGER, "force": "true"},
                    body=body,
                    content_type=APPLY_PATCH,
                )
                self.finish_writes += 1
                track.finish_acked_at = time.monotonic()
                return
            except (ApiError, aiohttp.ClientError, TimeoutError) as error:
                if isinstance(error, ApiError) and error.status == 404:
                    return
                logger.info("event=bench_finish_retry workload=%s error=%r", p.key, error)
                await asyncio.sleep(0.2 * (attempt + 1))

    def _write_timeline(self, tracker: WorkloadTracker, t0: float) -> None:
        """``<workdir>/workloads.csv``: each Workload's times (:meth:`WorkloadTracker.timeline`)."""
        path = self.options.workdir / TIMELINE_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as handle:
                out = csv.writer(handle)
                out.writerow(WorkloadTracker.TIMELINE_COLUMNS)
                out.writerows(tracker.timeline(start=t0))
        except OSError as error:
            logger.warning("event=bench_timeline_unwritten path=%s error=%r", path, error)

    async def _final_invariants(self) -> tuple[str, ...]:
        """Violations seen during the run, plus leaks once queue status has caught up.

        The operator writes queue status in passes over every queue (1,000 ClusterQueues and
        as many LocalQueues in large-scale), so this waits while the list of problems keeps
        shrinking, and gives up after 30 s without progress."""
        names = [q.name for q in self.queues]
        problems = self.checker.final_problems(queues=names)
        best, last_progress = len(problems), time.monotonic()
        while problems and time.monotonic() - last_progress < 30:
            await asyncio.sleep(1.0)
            problems = self.checker.final_problems(queues=names)
            if len(problems) < best:
                best, last_progress = len(problems), time.monotonic()
        _, placement_problems = self.tas.snapshot()
        return tuple(problems + placement_problems)

    # -- 3. results and cleanup -----------------------------------------------------------------

    def _result(
        self,
        tracker: WorkloadTracker,
        *,
        t0: float,
        end: float,
        before: str | None,
        after: str | None,
        operator_cpu: float | None,
        plane: dict[str, float],
        bench_cpu: float,
        problems: tuple[str, ...],
        setup_s: float,
        rss: RssSampler | None,
    ) -> E2EResult:
        timing = tracker.timing(start=t0)
        nominal: dict[str, int] = {}
        for q in self.queues:
            nominal[q.cq_class] = nominal.get(q.cq_class, 0) + q.nominal
        admissions = sum(t.admissions for t in tracker.tracks.values())
        writes, by_verb, cycles = write_counts(before, after)
        releases = tracker.release_latencies_ms()
        return E2EResult(
            scenario=self.scenario.name,
            workloads=len(self.workloads),
            finished=tracker.finished,
            admissions=admissions,
            evictions=sum(t.evictions for t in tracker.tracks.values()),
            real_wall_ms=int(1000 * (end - t0)),
            ideal_ms=ideal_ms(self.scenario),
            classes=timing.classes,
            cq_classes=tracker.usage_pct(nominal_by_class=nominal, start=t0, end=end),
            p50_time_to_admission_ms=timing.p50_ms,
            p99_time_to_admission_ms=timing.p99_ms,
            avg_admission_from_create_ms=timing.avg_from_create_ms,
            p50_admission_from_create_ms=timing.p50_from_create_ms,
            p99_admission_from_create_ms=timing.p99_from_create_ms,
            api_writes=writes,
            api_writes_per_admission=None
            if writes is None or not admissions
            else writes / admissions,
            api_writes_by_verb=by_verb,
            operator_cpu_s=operator_cpu,
            store_cpu_s=store_cpu(before, after),
            cycles=cycles,
            bench_cpu_s=bench_cpu,
            control_plane_cpu_s=plane,
            creation_lag_p50_ms=timing.creation_lag_p50_ms,
            creation_lag_p99_ms=timing.creation_lag_p99_ms,
            creation_lag_max_ms=timing.creation_lag_max_ms,
            operator_rss_peak_mib=None if rss is None else rss.peak_mib,
            operator_rss_end_mib=None if rss is None else rss.end_mib,
            operator_rss_samples=0 if rss is None else rss.samples,
            operator_rss_max_gap_s=0.0 if rss is None else rss.longest_gap_s,
            create_errors=self.create_errors,
            finish_writes=self.finish_writes,
            invariant_problems=problems,
            setup_s=setup_s,
            stopped_components=self.stopped_components,
            v1beta1_served=_v1beta1_served(self.options.crds),
            operator_log=str(self.operator.log) if self.operator is not None else None,
            release_latency_p50_ms=int(percentile(releases, 50)),
            release_latency_p99_ms=int(percentile(releases, 99)),
            releases_measured=len(releases),
            tas_nodes=len(self.nodes),
            tas_assignments_checked=self.tas.snapshot()[0],
            timeline=str(self.options.workdir / TIMELINE_FILE),
            timeline_origin_unix_ms=round(1000 * (time.time() - time.monotonic() + t0)),
        )


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
