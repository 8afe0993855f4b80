"""One running Phalanx operator: its clients, informers, state and background tasks.

kopf's ``on.startup``/``on.cleanup`` call :meth:`PhalanxOperator.startup` and
:meth:`PhalanxOperator.cleanup`; everything here runs on kopf's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any

from phalanx.operator import kubeconfig
from phalanx.operator.config import OperatorConfig
from phalanx.operator.informer import Informer
from phalanx.operator.jobsync import JobController
from phalanx.operator.kube import JOBS, NODES, PODS, WORKLOADS, KubeApi, Resource
from phalanx.operator.leader import FencedApi, LeaderElector
from phalanx.operator.loop import SchedulingLoop
from phalanx.operator.metrics import Metrics
from phalanx.operator.queuestatus import QueueStatus
from phalanx.operator.state import ClusterState
from phalanx.operator.ungate import GateRemover
from phalanx.operator.validation import validate_object
from phalanx.operator.writer import StatusWriter

__all__ = ["PhalanxOperator"]

logger = logging.getLogger(__name__)

# Pods that finished hold no capacity; a field selector makes the server drop them (it sends
# DELETED when a pod leaves the selection), which halves pod traffic on a busy cluster.
_LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class PhalanxOperator:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.auth = kubeconfig.load(config.kubeconfig, context=config.context)
        self.state = ClusterState()
        self.metrics = Metrics()
        self.api: KubeApi | None = None
        self.informers: list[Informer] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._components: list[Any] = []
        self._started = False
        self.synced_event = asyncio.Event()
        self.elector: LeaderElector | None = None
        self._stopping = False

    @property
    def synced(self) -> bool:
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers)

    def validate_object(self, obj: dict[str, Any]) -> list[str]:
        return validate_object(obj)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(_log_crash)
        self._tasks.append(task)
        return task

    async def startup(self) -> None:
        if self._started:
            return
        self._started = True
        self.api = KubeApi(self.auth)
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, addr=self.config.metrics_addr)
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
        )
        self.jobs = (
            JobController(write_api, self.state, self.writer, self.metrics, ready=self.synced_event)
            if self.config.manage_jobs
            else None
        )
        self.ungate = GateRemover(write_api, self.state, self.metrics)
        self.loop = SchedulingLoop(
            api=write_api,
            state=self.state,
            writer=self.writer,
            jobs=self.jobs,
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
        self._components = [
            c for c in (self.writer, self.jobs, self.ungate, self.queue_status, self.loop) if c
        ]
        self._start_informer(WORKLOADS, "Workload")
        self._start_informer(JOBS, "Job", label_selector="kueue.x-k8s.io/queue-name")
        self._start_informer(PODS, "Pod", field_selector=_LIVE_PODS)
        self._start_informer(NODES, "Node")
        if self.elector is None:
            self._start_scheduling()
        else:
            self.elector.start()
        logger.info(
            "event=operator_started server=%s namespaces=%s",
            self.auth.server,
            ",".join(self.config.namespaces) or "*",
        )

    def _start_scheduling(self) -> None:
        """Start the components that decide and write (at once, or on becoming leader).

        A standby's informers have been filling the state all along and nothing drained it,
        so the loop's first sync sees every object."""
        for component in self._components:
            component.start()

    def _lost_leadership(self) -> None:
        """The tenure is over and the fence already refuses every write (it reads the clock
        at send time). Exit, so that the supervisor restarts this replica as a fresh
        candidate whose state is rebuilt from the API, as controller-runtime does."""
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
    ) -> None:
        assert self.api is not None
        namespaces: tuple[str | None, ...] = (
            self.config.namespaces if resource.namespaced and self.config.namespaces else (None,)
        )
        for namespace in namespaces:
            informer = Informer(
                self.api,
                resource,
                self.state.handler(kind),
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                on_synced=self.state.mark_changed,
            )
            self.informers.append(informer)
            self._tasks.append(informer.start())

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self.synced_event.set()

    async def cleanup(self) -> None:
        self._stopping = True
        for component in reversed(self._components):
            stop = getattr(component, "stop", None)
            if stop is not None:
                with contextlib.suppress(Exception):
                    await stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.elector is not None:
            await self.elector.stop()  # releases the Lease: the standby takes over at once
        if self.api is not None:
            await self.api.close()
        logger.info("event=operator_stopped")


def _log_crash(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        logger.error("event=task_crashed task=%s error=%r", task.get_name(), error)
