"""The validating Job webhook's checks: a queued Job's Kueue labels and annotations, as Kueue's
Job webhook checks them.

Refused at ``kubectl apply``, a mistake is seen by whoever made it. Accepted, it surfaced only in
the operator's log: a ``kueue.x-k8s.io/job-min-parallelism`` that is not a number left the Job
with no Workload and no Event, a queue name no LocalQueue can have or conflicting topology
annotations made a Workload the API server refuses. Pure functions over API dicts;
``phalanx.operator.webhooks`` registers them for Jobs labelled with a queue name, on create and
update. An update is checked only for what it changes, so that a Job accepted before these
checks (or by another version) can still be updated, suspended and deleted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from phalanx.api.fields import DNS_SUBDOMAIN_PATTERN
from phalanx.api.label_rules import is_qualified_name
from phalanx.operator.integration import controlled_by
from phalanx.operator.jobs import JOB_MIN_PARALLELISM_ANNOTATION, QUEUE_LABEL

__all__ = [
    "validate_job",
    "validate_jobset",
    "validate_pytorchjob",
    "validate_raycluster",
    "validate_rayjob",
    "validate_trainjob",
]

_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
_SLICE_LEVEL = "kueue.x-k8s.io/podset-slice-required-topology"
_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
_TOPOLOGY_MODES = (_REQUIRED, _PREFERRED, _UNCONSTRAINED)

# What Go's strconv.Atoi and ParseBool accept, which is what Kueue parses these with.
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_BOOLEANS: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"}) | frozenset(
    {"0", "f", "F", "FALSE", "false", "False"}
)
_INT32_MAX: Final = 2**31 - 1

_QUEUE_PATH = f"metadata.labels[{QUEUE_LABEL}]"
_MIN_PATH = f"metadata.annotations[{JOB_MIN_PARALLELISM_ANNOTATION}]"
_TEMPLATE_ANNOTATIONS = "spec.template.metadata.annotations"


def validate_job(job: Mapping[str, Any], *, old: Mapping[str, Any] | None = None) -> list[str]:
    """One message per problem with a queued Job, each starting with its field path.

    ``old`` is the Job before an update (None on create).
    """
    errors = list(_queue_name(job, old))
    errors.extend(_min_parallelism(job, old))
    errors.extend(_topology_annotations(job, old))
    return errors


def _labels(job: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((job or {}).get("metadata") or {}).get("labels") or {}


def _annotations(job: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((job or {}).get("metadata") or {}).get("annotations") or {}


def _template_annotations(job: Mapping[str, Any] | None) -> Mapping[str, str]:
    template = ((job or {}).get("spec") or {}).get("template") or {}
    return (template.get("metadata") or {}).get("annotations") or {}


def _suspended(job: Mapping[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("suspend"))


def _pod_count(job: Mapping[str, Any]) -> int:
    """Kueue's count of a Job's pods: the lesser of parallelism (default 1) and completions."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism")
    count = 1 if parallelism is None else int(parallelism)
    completions = spec.get("completions")
    return count if completions is None else min(count, int(completions))


def _queue_name(job: Mapping[str, Any], old: Mapping[str, Any] | None) -> Iterator[str]:
    name = _labels(job).get(QUEUE_LABEL)
    old_name = _labels(old).get(QUEUE_LABEL) if old is not None else None
    if old is not None and name != old_name and not _suspended(job):
        yield (
            f"{_QUEUE_PATH}: cannot be changed or removed while the Job runs"
            f" (from {old_name!r} to {name!r}); suspend the Job (spec.suspend: true) first"
        )
    if name and (old is None or name != old_name) and not re.match(DNS_SUBDOMAIN_PATTERN, name):
        yield (
            f"{_QUEUE_PATH}: {name!r} cannot be the name of a LocalQueue: use lower-case letters,"
            " digits, '-' and '.', starting and ending with a letter or digit; name a LocalQueue"
            " of the Job's namespace"
        )


def _min_parallelism(job: Mapping[str, Any], old: Mapping[str, Any] | None) -> Iterator[str]:
    text = _annotations(job).get(JOB_MIN_PARALLELISM_ANNOTATION)
    if text is None:
        return
    if old is not None and _annotations(old).get(JOB_MIN_PARALLELISM_ANNOTATION) == text:
        return
    pods = _pod_count(job)
    if not _INTEGER.fullmatch(text):
        yield (
            f"{_MIN_PATH}: {text!r} is not an integer; write the fewest pods the Job can start"
            f" with (partial admission), from 1 to {max(pods - 1, 1)}, or remove the annotation"
        )
    elif pods < 2:
        yield (
            f"{_MIN_PATH}: partial admission needs a Job of at least 2 pods, and this Job has"
            f" {pods} (the lesser of spec.parallelism and spec.completions); remove the"
            " annotation or raise spec.parallelism"
        )
    elif not 0 < int(text) < pods:
        yield (
            f"{_MIN_PATH}: must be between 1 and {pods - 1}, fewer than the Job's {pods} pods"
            f" (the lesser of spec.parallelism and spec.completions); got {text}"
        )


def _topology_annotations(job: Mapping[str, Any], old: Mapping[str, Any] | None) -> Iterator[str]:
    annotations = _template_annotations(job)
    if old is not None and annotations == _template_annotations(old):
        return
    modes = [name for name in _TOPOLOGY_MODES if name in annotations]
    if len(modes) > 1:
        yield (
            f"{_TEMPLATE_ANNOTATIONS}: set at most one of {', '.join(_TOPOLOGY_MODES)};"
            f" this Job sets {', '.join(modes)}"
        )
    for name in (_REQUIRED, _PREFERRED, _SLICE_LEVEL):
        value = annotations.get(name)
        if value is not None and not is_qualified_name(value):
            yield (
                f"{_TEMPLATE_ANNOTATIONS}[{name}]: {value!r} is not a node label key; name a"
                " level of the flavor's Topology, such as cloud.example.com/rack"
            )
    unconstrained = annotations.get(_UNCONSTRAINED)
    if unconstrained is not None and unconstrained not in _BOOLEANS:
        where = f"{_TEMPLATE_ANNOTATIONS}[{_UNCONSTRAINED}]"
        yield f"{where}: must be true or false; got {unconstrained!r}"
    yield from _slice_annotations(job, annotations)


def _slice_annotations(job: Mapping[str, Any], annotations: Mapping[str, str]) -> Iterator[str]:
    level, size = annotations.get(_SLICE_LEVEL), annotations.get(_SLICE_SIZE)
    if level is not None and size is None:
        yield f"{_TEMPLATE_ANNOTATIONS}[{_SLICE_SIZE}]: required with {_SLICE_LEVEL}; set both"
    if level is None and size is not None:
        yield (
            f"{_TEMPLATE_ANNOTATIONS}[{_SLICE_SIZE}]: only allowed with {_SLICE_LEVEL}; set the"
            " slice's topology level or remove the size"
        )
    if size is None:
        return
    where = f"{_TEMPLATE_ANNOTATIONS}[{_SLICE_SIZE}]"
    if not _INTEGER.fullmatch(size) or abs(int(size)) > _INT32_MAX:
        yield f"{where}: must be a number of pods such as 4; got {size!r}"
    elif int(size) < 1:
        yield f"{where}: must be at least 1; got {size}"
    elif int(size) > _pod_count(job):
        yield f"{where}: must not be greater than the Job's {_pod_count(job)} pods; got {size}"


_MAX_POD_SETS: Final = 8


def validate_jobset(
    jobset: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> list[str]:
    """One message per problem with a queued JobSet, each starting with its field path: the
    queue name as for a Job, at most 8 replicated jobs (one pod set each), and each replicated
    job's pod template annotations as for a Job's (paths under
    ``spec.replicatedJobs[i].template.spec.template``). A TrainJob's JobSet is the TrainJob's:
    not checked."""
    if controlled_by(jobset, "TrainJob"):
        return []
    errors = [e.replace("the Job", "the JobSet") for e in _queue_name(jobset, old)]
    rjobs = list((jobset.get("spec") or {}).get("replicatedJobs") or ())
    if old is None and len(rjobs) > _MAX_POD_SETS:
        errors.append(
            f"spec.replicatedJobs: {len(rjobs)} replicated jobs, but its Workload holds at most"
            f" {_MAX_POD_SETS} pod sets (one per replicated job); merge or split them"
        )
    old_rjobs = {
        r.get("name"): r for r in ((old or {}).get("spec") or {}).get("replicatedJobs") or ()
    }
    for index, rjob in enumerate(rjobs):
        probe = _replicated_job_as_job(rjob)
        before = old_rjobs.get(rjob.get("name")) if old is not None else None
        old_probe = _replicated_job_as_job(before) if before is not None else None
        where = f"spec.replicatedJobs[{index}].template.spec.template.metadata.annotations"
        for error in _topology_annotations(probe, old_probe if old is not None else None):
            errors.append(
                error.replace(_TEMPLATE_ANNOTATIONS, where).replace("Job's", "replicated job's")
            )
    return errors


def _replicated_job_as_job(rjob: Mapping[str, Any]) -> dict[str, Any]:
    """A replicated job seen as one Job of all its replicas' pods (its pod set)."""
    job_spec = (rjob.get("template") or {}).get("spec") or {}
    replicas = rjob.get("replicas")
    pods = (1 if replicas is None else int(replicas)) * _pod_count({"spec": job_spec})
    return {"spec": {"template": job_spec.get("template") or {}, "parallelism": pods}}


_PYTORCH_REPLICA_TYPES: Final = ("Master", "Worker")


def validate_pytorchjob(
    pytorchjob: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> list[str]:
    """One message per problem with a queued PyTorchJob, each starting with its field path:
    the queue name as for a Job (held by ``spec.runPolicy.suspend``), and each replica type's
    pod template annotations as for a Job of its replicas (paths under
    ``spec.pytorchReplicaSpecs[<type>].template``), as Kueue's kubeflow webhook checks them."""
    probe = _run_policy_as_job(pytorchjob)
    old_probe = _run_policy_as_job(old) if old is not None else None
    errors = [
        e.replace("the Job", "the PyTorchJob").replace("spec.suspend", "spec.runPolicy.suspend")
        for e in _queue_name(probe, old_probe)
    ]
    specs = (pytorchjob.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    old_specs = ((old or {}).get("spec") or {}).get("pytorchReplicaSpecs") or {}
    for rtype in _PYTORCH_REPLICA_TYPES:
        if rtype not in specs:
            continue
        before = old_specs.get(rtype) if old is not None else None
        where = f"spec.pytorchReplicaSpecs[{rtype}].template.metadata.annotations"
        for error in _topology_annotations(
            _replica_spec_as_job(specs[rtype] or {}),
            _replica_spec_as_job(before) if before is not None else None,
        ):
            errors.append(
                error.replace(_TEMPLATE_ANNOTATIONS, where).replace("Job's", "replica type's")
            )
    return errors


def _run_policy_as_job(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A PyTorchJob's metadata and hold as a Job's (``spec.runPolicy.suspend``)."""
    run_policy = (obj.get("spec") or {}).get("runPolicy") or {}
    return {"metadata": obj.get("metadata") or {}, "spec": {"suspend": run_policy.get("suspend")}}


def _replica_spec_as_job(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A replica type seen as one Job of all its replicas' pods (its pod set)."""
    replicas = spec.get("replicas")
    pods = 1 if replicas is None else int(replicas)
    return {"spec": {"template": spec.get("template") or {}, "parallelism": pods}}


_RAY_CLUSTER = "spec.rayClusterSpec"


def validate_rayjob(
    rayjob: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> list[str]:
    """One message per problem with a queued RayJob, each starting with its field path, as
    Kueue's RayJob webhook checks it: the queue name as for a Job; a cluster of its own
    (``spec.rayClusterSpec``, not ``spec.clusterSelector``: a RayJob on an existing cluster
    is not queued, and is not checked further), deleted when the job ends
    (``spec.shutdownAfterJobFinishes``), without the autoscaler, at most 8 pod sets (the head
    and the worker groups), no worker group named ``head``, and each group's pod template
    annotations as for a Job's."""
    errors = [e.replace("the Job", "the RayJob") for e in _queue_name(rayjob, old)]
    spec = rayjob.get("spec") or {}
    cluster = spec.get("rayClusterSpec")
    if spec.get("clusterSelector"):
        if cluster:
            errors.append(
                "spec.clusterSelector: a queued RayJob runs on a cluster of its own"
                " (spec.rayClusterSpec), not an existing one; remove spec.clusterSelector"
            )
        return errors
    if not cluster:
        errors.append(
            f"{_RAY_CLUSTER}: required for a queued RayJob that does not use"
            " spec.clusterSelector; describe the Ray cluster to create"
        )
        return errors
    if not spec.get("shutdownAfterJobFinishes"):
        errors.append(
            "spec.shutdownAfterJobFinishes: must be true for a queued RayJob, or its cluster"
            " would hold the queue's quota after the job ended; set it to true"
        )
    groups = len(cluster.get("workerGroupSpecs") or ())
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode" and groups + 1 == _MAX_POD_SETS:
        errors.append(
            f"{_RAY_CLUSTER}.workerGroupSpecs: {groups} worker groups, the head and the"
            f" submitter Job (K8sJobMode) make {groups + 2} pod sets, but its Workload holds at"
            f" most {_MAX_POD_SETS}; merge worker groups, or submit another way"
            " (spec.submissionMode)"
        )
    old_cluster = None
    if old is not None:
        old_cluster = (old.get("spec") or {}).get("rayClusterSpec") or {}
    errors.extend(_ray_cluster(cluster, old_cluster, _RAY_CLUSTER, "RayJob"))
    return errors


def validate_trainjob(
    trainjob: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> list[str]:
    """One message per problem with a queued TrainJob, each starting with its field path: the
    queue name as for a Job. Its pod templates are the runtime's: a problem in their
    annotations is told when its Workload is made (an Event on the TrainJob)."""
    return [e.replace("the Job", "the TrainJob") for e in _queue_name(trainjob, old)]


def validate_raycluster(
    raycluster: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> list[str]:
    """One message per problem with a queued RayCluster, each starting with its field path,
    as Kueue's RayCluster webhook checks it: the queue name as for a Job, without the
    autoscaler, at most 8 pod sets, no worker group named ``head``, each group's pod template
    annotations as for a Job's. A RayJob's RayCluster is the RayJob's: not checked."""
    if controlled_by(raycluster, "RayJob"):
        return []
    errors = [e.replace("the Job", "the RayCluster") for e in _queue_name(raycluster, old)]
    old_spec = ((old or {}).get("spec") or {}) if old is not None else None
    errors.extend(_ray_cluster(raycluster.get("spec") or {}, old_spec, "spec", "RayCluster"))
    return errors


def _ray_cluster(
    cluster: Mapping[str, Any], old_cluster: Mapping[str, Any] | None, prefix: str, kind: str
) -> Iterator[str]:
    """A Ray cluster spec's checks (``old_cluster`` on an update), paths under ``prefix``."""
    if cluster.get("enableInTreeAutoscaling"):
        yield (
            f"{prefix}.enableInTreeAutoscaling: a queued {kind} cannot autoscale (its"
            " quota is reserved at admission); set it to false and size the worker groups"
        )
    groups = list(cluster.get("workerGroupSpecs") or ())
    if len(groups) + 1 > _MAX_POD_SETS:
        yield (
            f"{prefix}.workerGroupSpecs: {len(groups)} worker groups and the head make"
            f" {len(groups) + 1} pod sets, but its Workload holds at most {_MAX_POD_SETS};"
            " merge worker groups"
        )
    updating = old_cluster is not None
    old_spec = old_cluster or {}
    head = (cluster.get("headGroupSpec") or {}).get("template") or {}
    old_head = (old_spec.get("headGroupSpec") or {}).get("template") or {}
    yield from _template_topology(
        head,
        1,
        f"{prefix}.headGroupSpec.template.metadata.annotations",
        old_head if updating else None,
    )
    old_groups = {g.get("groupName"): g for g in old_spec.get("workerGroupSpecs") or ()}
    for index, group in enumerate(groups):
        where = f"{prefix}.workerGroupSpecs[{index}]"
        if group.get("groupName") == "head":
            yield f"{where}.groupName: 'head' is the head group's pod set; rename the worker group"
        before = old_groups.get(group.get("groupName")) if updating else None
        yield from _template_topology(
            group.get("template") or {},
            _ray_workers(group),
            f"{where}.template.metadata.annotations",
            (before.get("template") or {}) if before is not None else None,
        )


def _ray_workers(group: Mapping[str, Any]) -> int:
    replicas = group.get("replicas")
    count = 1 if replicas is None else int(replicas)
    hosts = int(group.get("numOfHosts") or 1)
    return count * hosts if hosts > 1 else count


def _template_topology(
    template: Mapping[str, Any], pods: int, where: str, old: Mapping[str, Any] | None
) -> Iterator[str]:
    """A pod template's topology annotations checked as a Job's of ``pods`` pods, with the
    messages' field path and wording for a Ray group."""
    probe = {"spec": {"template": template, "parallelism": pods}}
    old_probe = {"spec": {"template": old, "parallelism": pods}} if old is not None else None
    for error in _topology_annotations(probe, old_probe):
        yield error.replace(_TEMPLATE_ANNOTATIONS, where).replace("Job's", "group's")
