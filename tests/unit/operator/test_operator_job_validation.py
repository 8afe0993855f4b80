"""The validating Job webhook refuses what Kueue's Job webhook refuses: a bad
``kueue.x-k8s.io/job-min-parallelism``, a queue name no LocalQueue can have, a queue change
while the Job runs, conflicting or malformed topology annotations. An update is judged only
on what it changes."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kopf._cogs.structs import references
from kopf._core.engines.admission import build_webhooks
from kopf._core.intents.causes import WebhookType

from phalanx.operator.job_validation import validate_job
from phalanx.operator.webhooks import register_webhooks

MIN = "kueue.x-k8s.io/job-min-parallelism"
MIN_PATH = f"metadata.annotations[{MIN}]"
QUEUE_PATH = "metadata.labels[kueue.x-k8s.io/queue-name]"
TEMPLATE = "spec.template.metadata.annotations"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
SLICE_LEVEL = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"


def job(
    *,
    queue: str = "team-a",
    parallelism: int = 4,
    completions: int | None = None,
    suspend: bool = True,
    annotations: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "suspend": suspend,
        "template": {"metadata": {"annotations": pod_annotations or {}}, "spec": {}},
    }
    if completions is not None:
        spec["completions"] = completions
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": queue},
            "annotations": annotations or {},
        },
        "spec": spec,
    }


def _one(errors: list[str], path: str, words: str) -> None:
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{path}: "), errors
    assert words in errors[0], errors


@pytest.mark.parametrize(
    ("value", "parallelism", "completions", "words"),
    [
        ("two", 4, None, "'two' is not an integer"),
        ("2.5", 4, None, "is not an integer"),
        (" 2", 4, None, "is not an integer"),
        ("0", 4, None, "must be between 1 and 3"),
        ("-1", 4, None, "must be between 1 and 3"),
        ("4", 4, None, "must be between 1 and 3, fewer than the Job's 4 pods"),
        ("3", 4, 3, "must be between 1 and 2"),
        ("1", 1, None, "needs a Job of at least 2 pods"),
    ],
)
def test_job_min_parallelism_is_refused_naming_the_annotation(
    value: str, parallelism: int, completions: int | None, words: str
) -> None:
    errors = validate_job(
        job(parallelism=parallelism, completions=completions, annotations={MIN: value})
    )
    _one(errors, MIN_PATH, words)


@pytest.mark.parametrize(("value", "parallelism"), [("1", 2), ("3", 4), ("+2", 4), ("07", 8)])
def test_job_min_parallelism_below_the_pod_count_is_accepted(value: str, parallelism: int) -> None:
    assert validate_job(job(parallelism=parallelism, annotations={MIN: value})) == []


def test_job_min_parallelism_is_judged_on_update_only_when_it_changes() -> None:
    old = job(parallelism=4, annotations={MIN: "3"})
    shrunk = job(parallelism=2, annotations={MIN: "3"})
    assert validate_job(shrunk, old=old) == []
    changed = job(parallelism=4, annotations={MIN: "x"})
    _one(validate_job(changed, old=old), MIN_PATH, "is not an integer")


@pytest.mark.parametrize("queue", ["Team_A", "team a", "-team", "team."])
def test_a_queue_name_no_local_queue_can_have_is_refused(queue: str) -> None:
    _one(validate_job(job(queue=queue)), QUEUE_PATH, "cannot be the name of a LocalQueue")


def test_the_queue_of_a_running_job_cannot_change() -> None:
    running = job(queue="team-a", suspend=False)
    moved = job(queue="team-b", suspend=False)
    _one(validate_job(moved, old=running), QUEUE_PATH, "suspend the Job (spec.suspend: true)")
    # Suspended, it can move (Kueue's rule too).
    assert validate_job(job(queue="team-b", suspend=True), old=running) == []


def test_an_update_that_does_not_touch_the_checked_fields_passes_even_if_they_are_bad() -> None:
    # A Job accepted before these checks can still get a finalizer, be suspended, be deleted.
    old = job(queue="Team_A", annotations={MIN: "x"}, pod_annotations={REQUIRED: "a b"})
    new = job(queue="Team_A", annotations={MIN: "x"}, pod_annotations={REQUIRED: "a b"})
    new["metadata"]["finalizers"] = ["example.com/keep"]
    assert validate_job(new, old=old) == []


@pytest.mark.parametrize(
    ("pod_annotations", "path", "words"),
    [
        (
            {REQUIRED: "rack", PREFERRED: "block"},
            TEMPLATE,
            f"set at most one of {REQUIRED}, {PREFERRED}, {UNCONSTRAINED}",
        ),
        ({REQUIRED: "a rack"}, f"{TEMPLATE}[{REQUIRED}]", "'a rack' is not a node label key"),
        ({UNCONSTRAINED: "yes"}, f"{TEMPLATE}[{UNCONSTRAINED}]", "must be true or false"),
        ({SLICE_LEVEL: "rack"}, f"{TEMPLATE}[{SLICE_SIZE}]", f"required with {SLICE_LEVEL}"),
        ({SLICE_SIZE: "2"}, f"{TEMPLATE}[{SLICE_SIZE}]", f"only allowed with {SLICE_LEVEL}"),
        ({SLICE_LEVEL: "rack", SLICE_SIZE: "two"}, f"{TEMPLATE}[{SLICE_SIZE}]", "number of pods"),
        ({SLICE_LEVEL: "rack", SLICE_SIZE: "0"}, f"{TEMPLATE}[{SLICE_SIZE}]", "at least 1"),
        (
            {SLICE_LEVEL: "rack", SLICE_SIZE: "8"},
            f"{TEMPLATE}[{SLICE_SIZE}]",
            "must not be greater than the Job's 4 pods",
        ),
    ],
)
def test_topology_annotations_are_refused_as_kueue_refuses_them(
    pod_annotations: dict[str, str], path: str, words: str
) -> None:
    _one(validate_job(job(pod_annotations=pod_annotations)), path, words)


def test_valid_topology_annotations_are_accepted() -> None:
    ok = {REQUIRED: "cloud.example.com/block", SLICE_LEVEL: "rack", SLICE_SIZE: "2"}
    assert validate_job(job(pod_annotations=ok)) == []
    assert validate_job(job(pod_annotations={UNCONSTRAINED: "true"})) == []


def test_the_job_webhook_validates_queued_jobs_on_create_and_update() -> None:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [])
    handlers = [
        h for h in registry._webhooks.get_all_handlers() if h.reason == WebhookType.VALIDATING
    ]
    jobs = references.Resource(group="batch", version="v1", plural="jobs", namespaced=True)
    webhooks = build_webhooks(
        handlers,
        resources=[jobs],
        name_suffix="phalanx.kueue.x-k8s.io",
        client_config={"url": "https://127.0.0.1:9443"},
    )
    (webhook,) = [w for w in webhooks if w["name"].startswith("validate-queued-jobs")]
    assert webhook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert webhook["objectSelector"] == {
        "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
    }
