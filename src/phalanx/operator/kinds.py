"""Every kind with its own CRD and controller that the operator integrates, as the generic
controller (``phalanx.operator.kindsync``) runs it. Adding a kind is its rules module (an
:class:`~phalanx.operator.integration.OwnedKind`), one entry here (with how its webhooks hold
and check it), its name in ``configfile.FRAMEWORKS``, its name in ``state.KINDS`` and its RBAC
component in ``manifests/components``."""

from __future__ import annotations

from phalanx.operator import jobset, pytorchjob, raycluster, rayjob, trainjob
from phalanx.operator.job_validation import (
    validate_jobset,
    validate_pytorchjob,
    validate_raycluster,
    validate_rayjob,
    validate_trainjob,
)
from phalanx.operator.kindsync import ChildWatch, KindSpec, SourceWatch
from phalanx.operator.kube import JOBS, JOBSETS, RAYCLUSTERS

__all__ = ["OWNED_KINDS", "by_framework"]

_JOBSET_JOBS = ChildWatch(
    state_kind="JobSetJob",
    resource=JOBS,
    owner_label=jobset.JOBSET_NAME_LABEL,
    stopped=jobset.child_job_stopped,
)
"""A JobSet's child Jobs (a TrainJob's JobSet is named after it: its Jobs name the TrainJob)."""

OWNED_KINDS: tuple[KindSpec, ...] = (
    KindSpec(
        jobset.JOBSET,
        hold_at_creation={"spec": {"suspend": True}},
        validate=lambda obj, old: validate_jobset(obj, old=old),
        # The JobSet's own status may be stale: its child Jobs say whether pods still run.
        child=_JOBSET_JOBS,
    ),
    # The training-operator deletes a held job's pods itself: they are all it makes that runs.
    KindSpec(
        pytorchjob.PYTORCHJOB,
        hold_at_creation={"spec": {"runPolicy": {"suspend": True}}},
        validate=lambda obj, old: validate_pytorchjob(obj, old=old),
    ),
    KindSpec(
        rayjob.RAYJOB,
        hold_at_creation={"spec": {"suspend": True}},
        validate=lambda obj, old: validate_rayjob(obj, old=old),
        # Suspended, KubeRay deletes the RayCluster; until it is gone it may still make pods.
        child=ChildWatch(
            state_kind="RayJobCluster",
            resource=RAYCLUSTERS,
            owner_label=rayjob.ORIGIN_LABEL,
            stopped=rayjob.raycluster_stopped,
        ),
    ),
    # The Trainer makes a JobSet of the TrainJob's name: its pod sets are read from it, and
    # held, its Jobs say whether pods still run.
    KindSpec(
        trainjob.TRAINJOB,
        hold_at_creation=trainjob.hold_patch,
        validate=lambda obj, old: validate_trainjob(obj, old=old),
        child=_JOBSET_JOBS,
        source=SourceWatch(
            state_kind="TrainJobSet",
            resource=JOBSETS,
            kind=jobset.KIND,
            current=trainjob.jobset_is_current,
            pod_sets=trainjob.pod_sets_from_jobset,
            priority=trainjob.resolve_priority_from,
            pods_ready=trainjob.pods_ready,
            held=jobset.JOBSET.suspended,
        ),
        restore_when=lambda obj: not trainjob.active(obj),
    ),
    # Suspended, KubeRay deletes the pods; they name the RayCluster (ray.io/cluster).
    KindSpec(
        raycluster.RAYCLUSTER,
        hold_at_creation={"spec": {"suspend": True}},
        validate=lambda obj, old: validate_raycluster(obj, old=old),
    ),
)


def by_framework() -> dict[str, KindSpec]:
    """The kinds by their ``integrations.frameworks`` name."""
    return {spec.rules.framework: spec for spec in OWNED_KINDS}
