"""One running Phalanx operator: its clients, informers, state and background tasks.

kopf's ``on.startup``/``on.cleanup`` call :meth:`PhalanxOperator.startup` and
:meth:`PhalanxOperator.cleanup`; everything here runs on kopf's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from phalanx.operator import kubeconfig
from phalanx.operator.config import OperatorConfig
from phalanx.operator.informer import Informer
from phalanx.operator.jobsync import JobController
from phalanx.operator.kube import JOBS, NODES, PODS, WORKLOADS, KubeApi, Resource
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
        # Components subscribe to the state before the informers deliver anything.
        self.writer = StatusWriter(
            self.api,
            self.state,
            self.metrics,
            pending_min_interval=self.config.pending_message_min_interval,
        )
        self.jobs = (
            JobController(self.api, self.state, self.writer, self.metrics, ready=self.synced_event)
            if self.config.manage_jobs
            else None
        )
        self.ungate = GateRemover(self.api, self.state, self.metrics)
        self.loop = SchedulingLoop(
            api=self.api,
            state=self.state,
            writer=self.writer,
            jobs=self.jobs,
            metrics=self.metrics,
            config=self.config,
            validator=self.validate_object,
            wait_synced=self.wait_synced,
        )
        self.queue_status = QueueStatus(
            self.api, self.state, self.metrics, interval=self.config.status_flush_seconds
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
        for component in self._components:
            component.start()
        logger.info(
            "event=operator_started server=%s namespaces=%s",
            self.auth.server,
            ",".join(self.config.namespaces) or "*",
        )

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
        if self.api is not None:
            await self.api.close()
        logger.info("event=operator_stopped")


def _log_crash(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        logger.error("event=task_crashed task=%s error=%r", task.get_name(), error)
