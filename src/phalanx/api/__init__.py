"""phalanx.api: the Kueue v1beta2 API that Phalanx serves.

Pydantic models of the Kueue kinds Phalanx serves (spec and status, Kueue's field names on the
wire and snake_case in Python), their validation with field paths, the cross-field rules shared by
``phalanx validate`` and the CRDs' CEL, and the CRD generator. Converting the models into the
core's frozen dataclasses is the next layer's job; the models stay plain data here.

Entry points::

    load_manifests(text) -> list[KueueObject]      # raises ManifestError
    check_manifests(text) -> list[Document]         # never raises; errors per object
    parse_object(mapping) -> KueueObject            # raises InvalidObjectError
    to_manifest(obj, with_defaults=False) -> dict
    generate_crds() -> dict[file name, YAML text]
"""

from phalanx.api.clusterqueue import ClusterQueue, ClusterQueueSpec, ClusterQueueStatus
from phalanx.api.cohort import Cohort, CohortSpec
from phalanx.api.crds import generate_crds, write_crds
from phalanx.api.fields import API_VERSION, GROUP, VERSION
from phalanx.api.kinds import KINDS, KindInfo, KueueObject, kind_info
from phalanx.api.loader import (
    Document,
    InvalidObjectError,
    ManifestError,
    check_manifests,
    check_object,
    load_manifests,
    parse_object,
    to_manifest,
    validate_object,
)
from phalanx.api.localqueue import LocalQueue, LocalQueueSpec
from phalanx.api.priorityclass import WorkloadPriorityClass
from phalanx.api.resourceflavor import ResourceFlavor, ResourceFlavorSpec
from phalanx.api.rules import FieldError
from phalanx.api.topology import Topology, TopologySpec
from phalanx.api.workload import PodSet, Workload, WorkloadSpec
from phalanx.api.workload_status import WorkloadStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "ClusterQueue",
    "ClusterQueueSpec",
    "ClusterQueueStatus",
    "Cohort",
    "CohortSpec",
    "Document",
    "FieldError",
    "InvalidObjectError",
    "KindInfo",
    "KueueObject",
    "LocalQueue",
    "LocalQueueSpec",
    "ManifestError",
    "PodSet",
    "ResourceFlavor",
    "ResourceFlavorSpec",
    "Topology",
    "TopologySpec",
    "Workload",
    "WorkloadPriorityClass",
    "WorkloadSpec",
    "WorkloadStatus",
    "check_manifests",
    "check_object",
    "generate_crds",
    "kind_info",
    "load_manifests",
    "parse_object",
    "to_manifest",
    "validate_object",
    "write_crds",
]
