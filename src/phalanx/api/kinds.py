"""The kinds Phalanx serves, with the REST facts their CRDs declare."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.api.admissioncheck import AdmissionCheck, ProvisioningRequestConfig
from phalanx.api.clusterqueue import ClusterQueue
from phalanx.api.cohort import Cohort
from phalanx.api.localqueue import LocalQueue
from phalanx.api.priorityclass import WorkloadPriorityClass
from phalanx.api.resourceflavor import ResourceFlavor
from phalanx.api.topology import Topology
from phalanx.api.workload import Workload

__all__ = ["KINDS", "KindInfo", "KueueObject", "PrinterColumn", "kind_info"]

KueueObject = (
    ClusterQueue
    | LocalQueue
    | Workload
    | ResourceFlavor
    | Cohort
    | Topology
    | WorkloadPriorityClass
    | AdmissionCheck
    | ProvisioningRequestConfig
)


@dataclass(frozen=True, kw_only=True)
class PrinterColumn:
    """An ``additionalPrinterColumns`` entry: what ``kubectl get`` shows."""

    name: str
    type: str
    json_path: str
    description: str
    priority: int = 0


@dataclass(frozen=True, kw_only=True)
class KindInfo:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    model: type[KueueObject]
    status_subresource: bool
    printer_columns: tuple[PrinterColumn, ...] = ()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.kueue.x-k8s.io"


_PENDING = PrinterColumn(
    name="Pending Workloads",
    type="integer",
    json_path=".status.pendingWorkloads",
    description="Number of pending workloads",
)

# Short names and printer columns follow Kueue v1beta2 (Phalanx adds co, topo and wpc,
# which Kueue leaves without short names).
KINDS: tuple[KindInfo, ...] = (
    KindInfo(
        kind="ClusterQueue",
        plural="clusterqueues",
        singular="clusterqueue",
        short_names=("cq",),
        namespaced=False,
        model=ClusterQueue,
        status_subresource=True,
        printer_columns=(
            PrinterColumn(
                name="Cohort",
                type="string",
                json_path=".spec.cohortName",
                description="Cohort that this ClusterQueue belongs to",
            ),
            PrinterColumn(
                name="Strategy",
                type="string",
                json_path=".spec.queueingStrategy",
                description="The queueing strategy used to prioritize workloads",
                priority=1,
            ),
            _PENDING,
            PrinterColumn(
                name="Admitted Workloads",
                type="integer",
                json_path=".status.admittedWorkloads",
                description="Number of admitted workloads that haven't finished yet",
                priority=1,
            ),
        ),
    ),
    KindInfo(
        kind="LocalQueue",
        plural="localqueues",
        singular="localqueue",
        short_names=("queue", "queues", "lq"),
        namespaced=True,
        model=LocalQueue,
        status_subresource=True,
        printer_columns=(
            PrinterColumn(
                name="ClusterQueue",
                type="string",
                json_path=".spec.clusterQueue",
                description="Backing ClusterQueue",
            ),
            _PENDING,
            PrinterColumn(
                name="Admitted Workloads",
                type="integer",
                json_path=".status.admittedWorkloads",
                description="Number of admitted workloads that haven't finished yet.",
            ),
        ),
    ),
    KindInfo(
        kind="Workload",
        plural="workloads",
        singular="workload",
        short_names=("kwl", "kueueworkload", "kueueworkloads"),
        namespaced=True,
        model=Workload,
        status_subresource=True,
        printer_columns=(
            PrinterColumn(
                name="Queue",
                type="string",
                json_path=".spec.queueName",
                description="Name of the queue this workload was submitted to",
            ),
            PrinterColumn(
                name="Reserved in",
                type="string",
                json_path=".status.admission.clusterQueue",
                description="Name of the ClusterQueue where the workload is reserving quota",
            ),
            PrinterColumn(
                name="Admitted",
                type="string",
                json_path=".status.conditions[?(@.type=='Admitted')].status",
                description="Admission status",
            ),
            PrinterColumn(
                name="Finished",
                type="string",
                json_path=".status.conditions[?(@.type=='Finished')].status",
                description="Workload finished",
            ),
            PrinterColumn(
                name="Age",
                type="date",
                json_path=".metadata.creationTimestamp",
                description="Time this workload was created",
            ),
        ),
    ),
    KindInfo(
        kind="ResourceFlavor",
        plural="resourceflavors",
        singular="resourceflavor",
        short_names=("flavor", "flavors", "rf"),
        namespaced=False,
        model=ResourceFlavor,
        status_subresource=False,
    ),
    KindInfo(
        kind="Cohort",
        plural="cohorts",
        singular="cohort",
        short_names=("co",),
        namespaced=False,
        model=Cohort,
        status_subresource=True,
    ),
    KindInfo(
        kind="Topology",
        plural="topologies",
        singular="topology",
        short_names=("topo",),
        namespaced=False,
        model=Topology,
        status_subresource=False,
    ),
    KindInfo(
        kind="WorkloadPriorityClass",
        plural="workloadpriorityclasses",
        singular="workloadpriorityclass",
        short_names=("wpc",),
        namespaced=False,
        model=WorkloadPriorityClass,
        status_subresource=False,
        printer_columns=(
            PrinterColumn(
                name="Value",
                type="integer",
                json_path=".value",
                description="Value of workloadPriorityClass's Priority",
            ),
        ),
    ),
    KindInfo(
        kind="AdmissionCheck",
        plural="admissionchecks",
        singular="admissioncheck",
        short_names=("ac",),
        namespaced=False,
        model=AdmissionCheck,
        status_subresource=True,
    ),
    KindInfo(
        kind="ProvisioningRequestConfig",
        plural="provisioningrequestconfigs",
        singular="provisioningrequestconfig",
        short_names=("prc",),
        namespaced=False,
        model=ProvisioningRequestConfig,
        status_subresource=False,
    ),
)


def kind_info(kind: str) -> KindInfo | None:
    """The served kind named ``kind`` (case-sensitive, as in a manifest), if any."""
    for info in KINDS:
        if info.kind == kind:
            return info
    return None
