"""The KWOK stages file: well-formed Stage objects covering the lifecycle the tests rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

STAGES = Path(__file__).resolve().parents[3] / "devcluster" / "kwok-stages.yaml"


def _stages() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(STAGES.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs}


def test_devcluster_stages_are_kwok_v1alpha1_with_steps() -> None:
    stages = _stages()
    assert set(stages) == {
        "node-initialize",
        "node-heartbeat",
        "pod-ready",
        "pod-complete",
        "pod-terminate",
        "pod-delete",
    }
    for name, stage in stages.items():
        assert stage["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and stage["kind"] == "Stage"
        spec = stage["spec"]
        assert spec["resourceRef"]["kind"] in ("Node", "Pod"), name
        assert spec["steps"], name
        for expr in spec["selector"]["matchExpressions"]:
            assert set(expr) == {"jq"}, f"{name}: use jq selectors, not the deprecated form"
        for step in spec["steps"]:
            if "patch" in step:
                assert step["patch"]["subresource"] == "status", name


def test_devcluster_job_pods_complete_after_the_run_seconds_annotation() -> None:
    spec = _stages()["pod-complete"]["spec"]
    expression = spec["delay"]["durationFrom"]["jq"]["expression"]
    assert '.metadata.annotations["phalanx.dev/run-seconds"]' in expression
    assert spec["delay"]["durationMilliseconds"] == 5000
    keys = " ".join(e["jq"]["key"] for e in spec["selector"]["matchExpressions"])
    assert '.kind == "Job"' in keys
    template = spec["steps"][-1]["patch"]["template"]
    assert "phase: Succeeded" in template
