"""One running Phalanx operator: its clients, informers, state and background tasks.

kopf's ``on.startup``/``on.cleanup`` call :meth:`PhalanxOperator.startup` and
:meth:`PhalanxOperator.cleanup`; everything here runs on kopf's event loop.

Keep scheduling or die loudly: every long-running task (informers, leader election, the
scheduling loop, the status writer, the Job controller, the gate remover, the queue status
flusher) is watched. One that crashes, or returns while the operator runs, is logged with its
traceback and stops the operator through kopf's stop flag; :func:`phalanx.operator.app.run`
then returns exit code 1, so the supervisor restarts a fresh replica. A loop that is alive
but stuck is caught by the liveness probe (:class:`Heartbeat`).

Test hooks (only with ``PHALANX_TEST_HOOKS=1`` in the environment, for the integration tests
of liveness and of the crash exit): ``SIGUSR1`` makes the next scheduling cycle hang,
``SIGUSR2`` makes it raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from phalanx.operator import kubeconfig, lws
from phalanx.operator.access import AccessProbe
from phalanx.operator.certs import ensure_webhook_certs
from phalanx.operator.config import OperatorConfig
from phalanx.operator.configfile import FRAMEWORKS
from phalanx.operator.conversion import ConversionWebhook
from phalanx.operator.history import HistoryRecorder
from phalanx.operator.informer import Informer
from phalanx.operator.jobsync import JobController
from phalanx.operator.keyed import KeyedQueue
from phalanx.operator.kinds import OWNED_KINDS
from phalanx.operator.kindsync import KindController
from phalanx.operator.kube import (
    JOBS,
    NODES,
    PODS,
    WORKLOADS,
    ApiError,
    KubeApi,
    Resource,
)
from phalanx.operator.leader import FencedApi, LeaderElector
from phalanx.operator.loop import SchedulingLoop
from phalanx.operator.lwssync import LEADER_WORKER_SETS, LeaderWorkerSetController
from phalanx.operator.metrics import Metrics
from phalanx.operator.podlabel import ServingLabel
from phalanx.operator.podsync import FRAMEWORK as FRAMEWORK_POD
from phalanx.operator.podsync import PodGroupController
from phalanx.operator.provisioning import ProvisioningController
from phalanx.operator.queuestatus import QueueStatus
from phalanx.operator.ratelimit import TokenBucket
from phalanx.operator.serving import Endpoints, metrics_cert_folder
from phalanx.operator.state import ClusterState
from phalanx.operator.ungate import GateRemover
from phalanx.operator.unsupported import LEADER_WORKER_SET, UNSUPPORTED, UnsupportedKinds
from phalanx.operator.validation import validate_object
from phalanx.operator.visibility import GROUP as VISIBILITY_GROUP
from phalanx.operator.visibility import VERSION as VISIBILITY_VERSION
from phalanx.operator.visibility import NotServing, PendingReasons, VisibilityServer
from phalanx.operator.writer import StatusWriter

__all__ = [
    "ADMIN_KINDS",
    "TEST_HOOKS_ENV",
    "Heartbeat",
    "OptionalInformer",
    "PhalanxOperator",
    "SchedulerStalled",
    "component_tasks",
]

logger = logging.getLogger(__name__)

# Pods that finished hold no capacity; a field selector makes the server drop them (it sends
# DELETED when a pod leaves the selection), which halves pod traffic on a busy cluster.
_LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"

ADMIN_KINDS: tuple[tuple[Resource, str], ...] = (
    (Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", namespaced=False), "ResourceFlavor"),
    (Resource("kueue.x-k8s.io", "v1beta2", "topologies", namespaced=False), "Topology"),
    (Resource("kueue.x-k8s.io", "v1beta2", "cohorts", namespaced=False), "Cohort"),
    (Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", namespaced=False), "ClusterQueue"),
    (Resource("kueue.x-k8s.io", "v1beta2", "localqueues"), "LocalQueue"),
    (
        Resource("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", namespaced=False),
        "WorkloadPriorityClass",
    ),
    (Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", namespaced=False), "AdmissionCheck"),
    (
        Resource("kueue.x-k8s.io", "v1beta2", "provisioningrequestconfigs", namespaced=False),
        "ProvisioningRequestConfig",
    ),
    (Resource("autoscaling.x-k8s.io", "v1", "provisioningrequests"), "ProvisioningRequest"),
    (Resource("", "v1", "namespaces", namespaced=False), "Namespace"),
    (Resource("scheduling.k8s.io", "v1", "priorityclasses", namespaced=False), "PriorityClass"),
)
"""The low-volume kinds the scheduler reads, each fed by an :class:`OptionalInformer`: unlike
kopf's watch, a relist after a lost watch reports the objects deleted meanwhile."""

TEST_HOOKS_ENV = "PHALANX_TEST_HOOKS"
"""Set to ``1`` to install the test hooks (see the module docstring)."""

SERVING_LABEL_CLEANUP_SECONDS = 5.0
"""How long a stopping replica tries to take the visibility label off its Pod."""


class OptionalInformer(Informer):
    """An informer for a kind whose API may be absent (a CRD not installed, or removed).

    A 404 on the list counts as an empty list: the objects known so far are reported
    ``DELETED`` and ``synced`` is set, so that a missing kind never holds up the first
    scheduling cycle. The error is still raised to the run loop, which backs off and lists
    again: once the CRD is installed, its objects arrive.
    """

    async def _relist(self) -> None:
        try:
            await super()._relist()
        except ApiError as error:
            if error.status != 404:
                raise
            self._absent()
            raise

    async def _watch(self) -> None:
        try:
            await super()._watch()
        except ApiError as error:
            if error.status == 404:
                # The resource went away under a running watch: only a list can tell what
                # is left, and the run loop lists when it has no resourceVersion.
                self.resource_version = None
            raise

    def _absent(self) -> None:
        if not self.synced.is_set() or self._known:
            logger.warning("event=resource_absent resource=%s action=treat_as_empty", self.name)
        for key, uid in list(self._known.items()):
            namespace, _, name = key.rpartition("/")
            metadata: dict[str, Any] = {"name": name, "uid": uid}
            if namespace:
                metadata["namespace"] = namespace
            self._deliver("DELETED", {"metadata": metadata})
        self._known = {}
        if not self.synced.is_set():
            self.synced.set()
            if self.on_synced is not None:
                self.on_synced()


class Heartbeat:
    """When this replica's scheduling loop last completed a cycle, for the liveness probe.

    Disarmed (always alive) while the replica does not schedule: a standby without the Lease,
    or a leader whose loop still waits for the informers' first sync (a slow list is not a
    stuck loop, and a restart would not make it faster).
    """

    def __init__(self, *, stall_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.stall_seconds = stall_seconds
        self._clock = clock
        self._last: float | None = None

    @property
    def armed(self) -> bool:
        return self._last is not None

    def arm(self) -> None:
        self._last = self._clock()

    def disarm(self) -> None:
        self._last = None

    def beat(self) -> None:
        if self._last is not None:
            self._last = self._clock()

    def since_last(self) -> float | None:
        """Seconds since the last cycle (or since arming); None while disarmed."""
        return None if self._last is None else self._clock() - self._last

    def stalled_for(self) -> float | None:
        """Seconds without a cycle if that is longer than allowed, else None."""
        since = self.since_last()
        return since if since is not None and since > self.stall_seconds else None


Sidecar = Callable[[KubeApi], Awaitable[Callable[[], Awaitable[None]]]]
"""A server started with the operator on its API client (the dashboard): called once the
client exists, it returns the coroutine function that stops it."""


class PhalanxOperator:
    def __init__(
        self,
        config: OperatorConfig,
        *,
        test_hooks: bool = False,
        hard_exit_after: float | None = None,
        sidecars: Sequence[Sidecar] = (),
    ) -> None:
        self.config = config
        self.sidecars = list(sidecars)
        self._sidecar_stops: list[Callable[[], Awaitable[None]]] = []
        self.auth = kubeconfig.load(config.kubeconfig, context=config.context)
        self.state = ClusterState()
        self.metrics = Metrics()
        self.api: KubeApi | None = None
        self.endpoints: Endpoints | None = None
        self.visibility: VisibilityServer | None = None
        self.serving_label: ServingLabel | None = None
        """This replica's Pod's visibility label (in a pod serving the visibility API)."""
        self.informers: list[Informer] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._components: list[Any] = []
        self._started = False
        self.synced_event = asyncio.Event()
        self.elector: LeaderElector | None = None
        self._stopping = False
        self.heartbeat = Heartbeat(stall_seconds=config.liveness_stall_seconds)
        self.stop_flag = asyncio.Event()
        """Set on a fatal error: kopf stops the operator (cleanup handlers included)."""
        self.fatal: str | None = None
        """Why the operator stopped itself; ``run()`` turns it into exit code 1."""
        self._hard_exit_after = hard_exit_after
        self._test_hooks = test_hooks
        self._hooks: _SchedulerHooks | None = None
        self.conversion: ConversionWebhook | None = None
        """The CRDs' conversion webhook (kueue.x-k8s.io v1beta1), with the admission webhooks."""
        if config.webhook.enabled:
            # Only a process on its own loopback address points the CRDs back when it exits;
            # a Service or a fixed --webhook-url may be served by other replicas.
            own_address = config.webhook.service is None and config.webhook.url is None
            self.conversion = ConversionWebhook(restore_on_exit=own_address)

    @property
    def synced(self) -> bool:
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers)

    def validate_object(self, obj: dict[str, Any]) -> list[str]:
        return validate_object(obj)

    # -- keep scheduling or die loudly -------------------------------------------------------------

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str, forever: bool = True
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.append(task)
        return self.watch_task(task, forever=forever)

    def watch_task(self, task: asyncio.Task[Any], *, forever: bool = True) -> asyncio.Task[Any]:
        """Stop the operator if ``task`` raises; with ``forever``, also if it returns while the
        operator runs (a long-running task that ends has stopped doing its job)."""
        task.add_done_callback(lambda done: self._task_done(done, forever=forever))
        return task

    def _task_done(self, task: asyncio.Task[Any], *, forever: bool) -> None:
        if task.cancelled():
            return  # cleanup() or a component's stop(): the expected way to end
        error = task.exception()
        name = task.get_name()
        if error is None:
            if forever and not self._stopping:
                logger.error("event=task_exited task=%s action=exit", name)
                self.fail(f"task {name} exited")
            return
        logger.error("event=task_crashed task=%s error=%r action=exit", name, error, exc_info=error)
        self.fail(f"task {name} crashed: {error!r}")

    def fail(self, reason: str) -> None:
        """Stop the operator with exit code 1 (the first reason is kept)."""
        if self.fatal is not None:
            return
        self.fatal = reason
        logger.critical("event=operator_fatal reason=%r action=stop exit_code=1", reason)
        self.stop_flag.set()
        if self._hard_exit_after is not None:
            _start_exit_watchdog(self._hard_exit_after)

    def liveness(self) -> dict[str, Any]:
        """The liveness probe's answer; raises :class:`SchedulerStalled` when this replica
        should schedule and its loop completed no cycle for too long."""
        loop: SchedulingLoop | None = getattr(self, "loop", None)
        cycles = loop.cycles if loop is not None else 0
        stalled = self.heartbeat.stalled_for()
        if stalled is not None:
            logger.error(
                "event=liveness_failed reason=scheduler_stalled seconds_since_cycle=%.1f cycles=%d",
                stalled,
                cycles,
            )
            raise SchedulerStalled(
                f"no scheduling cycle completed for {stalled:.1f}s"
                f" (limit {self.heartbeat.stall_seconds:g}s)"
            )
        since = self.heartbeat.since_last()
        return {
            "scheduling": self.heartbeat.armed,
            "cycles": cycles,
            "seconds_since_cycle": None if since is None else round(since, 1),
        }

    # -- lifecycle ---------------------------------------------------------------------------------

    async def startup(self) -> None:
        if self._started:
            return
        self._started = True
        self.api = KubeApi(self.auth)
        # Unfenced client: a standby must answer scrapes too (reviews are API writes).
        self.endpoints = Endpoints(
            self.config,
            registry=self.metrics.registry,
            api=self.api,
            liveness=lambda: {"informers_synced": self.synced, "scheduler": self.liveness()},
            ready=lambda: self.synced,
        )
        for name, upkeep in await self.endpoints.start():
            self.spawn(upkeep, name=name)
        for sidecar in self.sidecars:
            self._sidecar_stops.append(await sidecar(self.api))
        # -- leader election: scheduling components write through a fence that refuses any
        # write once this replica's tenure is over (checked when each request is sent).
        write_api: KubeApi = self.api
        if self.config.leader_election is not None:
            self.elector = LeaderElector(
                self.api,
                self.config.leader_election,
                on_started_leading=self._start_scheduling,
                on_stopped_leading=self._lost_leadership,
            )
            write_api = FencedApi(self.api, allowed=self.elector.still_leading)
        # Components subscribe to the state before the informers deliver anything.
        self.writer = StatusWriter(
            write_api,
            self.state,
            self.metrics,
            pending_min_interval=self.config.pending_message_min_interval,
            pending_numbers_interval=self.config.pending_numbers_min_interval,
            routine_events=TokenBucket(
                rate=self.config.routine_events_qps, burst=self.config.routine_events_burst
            ),
            pending_rate=TokenBucket(
                rate=self.config.pending_explanations_qps,
                burst=self.config.pending_explanations_burst,
            ),
        )
        self.jobs = (
            JobController(
                write_api,
                self.state,
                self.writer,
                self.metrics,
                ready=self.synced_event,
                frameworks=self.config.frameworks,
            )
            if self.config.manage_jobs
            else None
        )
        self.pod_groups = (
            PodGroupController(
                write_api,
                self.state,
                self.writer,
                self.metrics,
                ready=self.synced_event,
                enabled=FRAMEWORK_POD in self.config.frameworks,
                parents=[f for f in (lws.FRAMEWORK,) if f in self.config.frameworks],
            )
            if self.config.manage_jobs
            else None
        )
        self.leader_worker_sets = (
            LeaderWorkerSetController(
                write_api, self.state, self.writer, self.metrics, ready=self.synced_event
            )
            if self.config.manage_jobs and lws.FRAMEWORK in self.config.frameworks
            else None
        )
        self.kinds = (
            [
                KindController(
                    spec,
                    write_api,
                    self.state,
                    self.writer,
                    self.metrics,
                    ready=self.synced_event,
                    enabled=spec.rules.framework in self.config.frameworks,
                )
                for spec in OWNED_KINDS
            ]
            if self.config.manage_jobs
            else []
        )
        self.ungate = GateRemover(write_api, self.state, self.metrics)
        self.unsupported = UnsupportedKinds(self.writer, supported=FRAMEWORKS)
        self.provisioning = ProvisioningController(write_api, self.state, self.writer)
        self.loop = SchedulingLoop(
            api=write_api,
            state=self.state,
            writer=self.writer,
            jobs=self.jobs,
            pod_groups=self.pod_groups,
            kinds=self.kinds,
            metrics=self.metrics,
            config=self.config,
            validator=self.validate_object,
            wait_synced=self.wait_synced,
        )
        self.queue_status = QueueStatus(
            write_api, self.state, self.metrics, interval=self.config.status_flush_seconds
        )
        loop = self.loop
        self.loop.on_cycle.append(
            lambda _result: self.queue_status.snapshot(loop.scheduler, loop.bridge.invalid_admin)
        )
        self.pending_reasons = PendingReasons(self.metrics.pending_by_reason)
        self.loop.on_cycle.append(lambda _result: self.pending_reasons.after_cycle(loop.scheduler))
        self.loop.on_cycle.append(lambda _result: self.heartbeat.beat())
        if self.config.visibility_port:
            await self._serve_visibility()
            # The Service phalanx-visibility selects the pod that carries the label: cleared
            # at once (a restarted container may hold its last run's), set once scheduling.
            self.serving_label = ServingLabel.from_env(self.api)
            if self.serving_label is not None:
                self.serving_label.want(False)
                self.spawn(self.serving_label.run(), name="phalanx-serving-label")
        # The usage history store: only the leader's components start, so only it writes.
        self.history = (
            HistoryRecorder(
                self.state,
                self.metrics.registry,
                url=self.config.store_url,
                ready=self.synced_event,
                namespaces=self.config.namespaces,
            )
            if self.config.store_url
            else None
        )
        if self.history is not None:
            self.queue_status.store_health = self.history.health
        self._components = [
            c
            for c in (
                self.writer,
                self.jobs,
                self.pod_groups,
                self.leader_worker_sets,
                *self.kinds,
                self.ungate,
                self.queue_status,
                self.loop,
                self.provisioning,
                self.history,
                self.unsupported,
            )
            if c
        ]
        if self._test_hooks:
            self._hooks = _SchedulerHooks(self.loop)
        for resource, kind in ADMIN_KINDS:
            self._start_informer(resource, kind, optional=True)
        self._start_informer(WORKLOADS, "Workload")
        self._start_informer(JOBS, "Job", label_selector="kueue.x-k8s.io/queue-name")
        probe = AccessProbe(self.api.request, namespaces=self.config.namespaces)
        watched: set[str] = set()
        for spec in OWNED_KINDS:
            if spec.rules.framework not in self.config.frameworks:
                # Kueue sets up only the enabled integrations' controllers. The manifests
                # grant a kind's rules with its component (manifests/components/<kind>), so
                # the queued objects of a disabled kind are watched, to be told they are
                # left alone (an IntegrationNotEnabled Event), only where this operator may
                # list them: asked first, so that no list is ever refused.
                if self.config.manage_jobs and await probe.may_watch(spec.resource):
                    self._start_informer(
                        spec.resource,
                        spec.state_kind,
                        label_selector="kueue.x-k8s.io/queue-name",
                        optional=True,
                    )
                continue
            self._start_informer(
                spec.resource,
                spec.state_kind,
                label_selector="kueue.x-k8s.io/queue-name",
                optional=True,
            )
            if spec.child is not None and spec.child.state_kind not in watched:
                watched.add(spec.child.state_kind)  # JobSet's and TrainJob's: one informer
                self._start_informer(
                    spec.child.resource,
                    spec.child.state_kind,
                    label_selector=spec.child.owner_label,
                )
            if spec.source is not None:
                # Every object of the source's kind: the ones the kind's controller makes
                # carry no label of their own (a TrainJob's JobSet has its runtime's labels).
                self._start_informer(spec.source.resource, spec.source.state_kind, optional=True)
        left_alone = list(UNSUPPORTED) if self.config.manage_jobs else []
        if self.config.manage_jobs and lws.FRAMEWORK not in self.config.frameworks:
            left_alone.append(LEADER_WORKER_SET)
        for unsupported in left_alone:
            served = await probe.served(unsupported.group, unsupported.plural)
            if served is not None and await probe.may_watch(served):
                self._start_informer(
                    served,
                    unsupported.kind,
                    label_selector="kueue.x-k8s.io/queue-name",
                    optional=True,
                    handler=self.unsupported.handler(unsupported),
                )
        if lws.FRAMEWORK in self.config.frameworks:
            # Not suspended like the kinds above: admitted per group through its pods.
            self._start_informer(
                LEADER_WORKER_SETS,
                lws.KIND,
                label_selector="kueue.x-k8s.io/queue-name",
                optional=True,
            )
        self._start_informer(PODS, "Pod", field_selector=_LIVE_PODS)
        self._start_informer(NODES, "Node")
        if self.conversion is not None:
            # Every replica: the CRDs must name a server as long as any serves.
            self.spawn(self.conversion.keep_crds(self.api), name="phalanx-conversion-crds")
        if self.elector is None:
            self._start_scheduling()
        else:
            # Not in _tasks: cleanup() stops it last, through elector.stop(), which hands
            # the Lease back once the components are stopped.
            self.watch_task(self.elector.start())
        logger.info(
            "event=operator_started server=%s namespaces=%s",
            self.auth.server,
            ",".join(self.config.namespaces) or "*",
        )

    async def _serve_visibility(self) -> None:
        """Kueue's visibility API, answered from this replica's live queues between cycles;
        503 until its scheduling loop has synced (a standby never does)."""
        assert self.api is not None
        loop = self.loop

        async def read(fn: Any) -> Any:
            if not loop.ready.is_set():
                raise NotServing(
                    "this replica does not schedule (standby, or not synced yet); retry"
                )
            while not loop.idle.is_set():
                await loop.idle.wait()
            return fn(loop.scheduler, self.state.objects["Workload"])

        folder = metrics_cert_folder(self.config)
        if not (folder / "tls.crt").exists() or not (folder / "tls.key").exists():
            ensure_webhook_certs(folder, hosts=["localhost", "127.0.0.1"])
        self.visibility = VisibilityServer(
            api=self.api,
            reader=read,
            listen=self.config.visibility_addr,
            port=int(self.config.visibility_port or 0),
            cert_folder=folder,
            objects=lambda kind: self.state.objects.get(kind, {}),
        )
        await self.visibility.start()
        self.spawn(self.visibility.keep_front_proxy(), name="phalanx-visibility-front-proxy")
        self.spawn(
            self.visibility.cert.watch(interval=self.config.cert_check_seconds),
            name="phalanx-visibility-cert-reload",
        )
        logger.info(
            "event=visibility_serving address=https://%s:%d/apis/%s/%s",
            self.config.visibility_addr,
            self.config.visibility_port,
            VISIBILITY_GROUP,
            VISIBILITY_VERSION,
        )

    def _start_scheduling(self) -> None:
        """Start the components that decide and write (at once, or on becoming leader).

        A standby's informers have been filling the state all along and nothing drained it,
        so the loop's first sync sees every object."""
        for component in self._components:
            component.start()
            tasks = component_tasks(component)
            if not tasks:
                # A component whose task this cannot see would die silently: say so.
                logger.warning("event=task_unwatched component=%s", type(component).__name__)
            for task in tasks:
                self.watch_task(task)
        # The heartbeat starts with the loop's first sync done: until then the loop waits
        # for the informers' lists, which is not a stall.
        self.spawn(self._arm_heartbeat(), name="phalanx-heartbeat-arm", forever=False)

    async def _arm_heartbeat(self) -> None:
        await self.loop.ready.wait()
        self.heartbeat.arm()
        if self.serving_label is not None and not self._stopping:
            self.serving_label.want(True)  # it can answer the visibility API now

    def _lost_leadership(self) -> None:
        """The tenure is over and the fence already refuses every write (it reads the clock
        at send time). Exit, so that the supervisor restarts this replica as a fresh
        candidate whose state is rebuilt from the API, as controller-runtime does."""
        self.heartbeat.disarm()
        if self._stopping:
            return  # a clean shutdown: cleanup() stops everything in order
        logger.error("event=leadership_lost action=exit")
        os.kill(os.getpid(), signal.SIGTERM)

    def _start_informer(
        self,
        resource: Resource,
        kind: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        optional: bool = False,
        handler: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """Watch ``resource`` into the state as ``kind`` (or into ``handler``)."""
        assert self.api is not None
        namespaces: tuple[str | None, ...] = (
            self.config.namespaces if resource.namespaced and self.config.namespaces else (None,)
        )
        factory: type[Informer] = OptionalInformer if optional else Informer
        for namespace in namespaces:
            informer = factory(
                self.api,
                resource,
                handler or self.state.handler(kind),
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                on_synced=self.state.mark_changed,
            )
            self.informers.append(informer)
            self._tasks.append(self.watch_task(informer.start()))

    async def wait_synced(self) -> None:
        """Every informer, admin kinds included, has delivered its first list."""
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self.synced_event.set()

    async def cleanup(self) -> None:
        self._stopping = True
        self.heartbeat.disarm()
        if self._hooks is not None:
            self._hooks.close()  # a hung test cycle holds an executor thread asyncio.run joins
        for component in reversed(self._components):
            stop = getattr(component, "stop", None)
            if stop is not None:
                with contextlib.suppress(Exception):
                    await stop()
        if self.serving_label is not None:
            # Before the Lease is handed over, so that the Service stops routing here before
            # the successor labels its own Pod; after the components (the loop) stopped, as
            # the Pod's change reaches this replica's Pod informer. Bounded: a shutdown must
            # not hang on an unreachable API server.
            self.serving_label.want(False)
            if not await self.serving_label.settle(SERVING_LABEL_CLEANUP_SECONDS):
                logger.warning(
                    "event=serving_label_left pod=%s reason=not_removed_at_exit",
                    self.serving_label.pod,
                )
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.elector is not None:
            # Releases the Lease: the standby takes over at once. A crashed elector task
            # re-raises here; it was logged when it crashed, and the client must still close.
            with contextlib.suppress(Exception):
                await self.elector.stop()
        if self.endpoints is not None:
            with contextlib.suppress(Exception):
                await self.endpoints.stop()
        for stop in self._sidecar_stops:
            with contextlib.suppress(Exception):
                await stop()
        if self.visibility is not None:
            with contextlib.suppress(Exception):
                await self.visibility.stop()
        if self.api is not None:
            await self.api.close()
        logger.info("event=operator_stopped fatal=%r", self.fatal)


class SchedulerStalled(Exception):
    """The liveness probe's failure: the scheduling loop stopped completing cycles."""


def component_tasks(component: Any) -> list[asyncio.Task[Any]]:
    """The long-running tasks a started component runs (``_task``, the ``_tasks`` list, or the
    workers of its ``work`` queue).

    The components keep their tasks in these attributes; a set (the scheduling loop's
    short-lived write tasks, each logged when it fails) is not a long-running task."""
    tasks: list[asyncio.Task[Any]] = []
    single = getattr(component, "_task", None)
    if isinstance(single, asyncio.Task):
        tasks.append(single)
    many = getattr(component, "_tasks", None)
    if isinstance(many, list):
        tasks.extend(t for t in many if isinstance(t, asyncio.Task))
    work = getattr(component, "work", None)
    if isinstance(work, KeyedQueue):
        tasks.extend(work.tasks)
    return tasks


def _start_exit_watchdog(seconds: float) -> None:
    """The clean stop after a fatal error runs on the event loop; if that loop is wedged (a
    blocked executor thread, a hung cleanup), exit anyway: a thread, not a loop callback."""

    def hard_exit() -> None:
        logger.critical("event=exit_forced after_seconds=%.0f exit_code=1", seconds)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()


class _SchedulerHooks:
    """Test hooks, installed only with ``PHALANX_TEST_HOOKS=1``: ``SIGUSR1`` makes the next
    scheduling cycle hang (a stuck scheduler: the task lives, no cycle completes), ``SIGUSR2``
    makes it raise (a crashed scheduling task). Both act inside the real cycle, in the worker
    thread the loop runs it in."""

    def __init__(self, loop: SchedulingLoop) -> None:
        self.mode: str | None = None
        self._release = threading.Event()
        inner = loop.scheduler.run_cycle

        def run_cycle(now: int) -> Any:
            if self.mode == "stall":
                self._release.wait()
            elif self.mode == "crash":
                raise RuntimeError("test hook: simulated scheduler crash")
            return inner(now)

        loop.scheduler.run_cycle = run_cycle  # type: ignore[method-assign]
        event_loop = asyncio.get_running_loop()
        event_loop.add_signal_handler(signal.SIGUSR1, self._set, "stall")
        event_loop.add_signal_handler(signal.SIGUSR2, self._set, "crash")
        logger.warning("event=test_hooks_enabled env=%s signals=SIGUSR1,SIGUSR2", TEST_HOOKS_ENV)

    def _set(self, mode: str) -> None:
        logger.warning("event=test_hook mode=%s", mode)
        self.mode = mode

    def close(self) -> None:
        self.mode = None
        self._release.set()
        event_loop = asyncio.get_running_loop()
        event_loop.remove_signal_handler(signal.SIGUSR1)
        event_loop.remove_signal_handler(signal.SIGUSR2)
