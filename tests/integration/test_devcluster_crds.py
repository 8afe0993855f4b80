"""The CRDs of crds/ on the real API server: Established, and CEL rules enforced server-side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

CRDS_DIR = Path(__file__).resolve().parents[2] / "crds"
KINDS = {
    "ClusterQueue",
    "LocalQueue",
    "Workload",
    "ResourceFlavor",
    "Cohort",
    "Topology",
    "WorkloadPriorityClass",
    "AdmissionCheck",
    "ProvisioningRequestConfig",
}


def _crd_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(CRDS_DIR.glob("*.y*ml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _walk_validations(schema: Any) -> list[dict[str, str]]:
    """Every x-kubernetes-validations rule anywhere in a schema."""
    found: list[dict[str, str]] = []
    if isinstance(schema, dict):
        found.extend(schema.get("x-kubernetes-validations", []))
        for value in schema.values():
            found.extend(_walk_validations(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(_walk_validations(value))
    return found


@pytest.fixture(scope="module")
def applied_crds(cluster: ClusterHandle) -> list[dict[str, Any]]:
    docs = _crd_documents()
    kinds = {d["spec"]["names"]["kind"] for d in docs}
    assert kinds == KINDS, f"crds/ should hold the {len(KINDS)} Kueue kinds, holds {sorted(kinds)}"
    # Server-side apply: CRDs exceed the client-side last-applied annotation limit.
    cluster.apply_crds(path.read_text() for path in sorted(CRDS_DIR.glob("*.y*ml")))
    return docs


def test_devcluster_crds_become_established_serving_v1beta2(
    cluster: ClusterHandle, applied_crds: list[dict[str, Any]]
) -> None:
    for doc in applied_crds:
        name = doc["metadata"]["name"]
        live = json.loads(cluster.kubectl_ok("get", f"crd/{name}", "-o", "json"))
        conditions = {c["type"]: c["status"] for c in live["status"]["conditions"]}
        assert conditions.get("Established") == "True", name
        assert conditions.get("NamesAccepted") == "True", name
        assert live["spec"]["group"] == "kueue.x-k8s.io"
        served = [v["name"] for v in live["spec"]["versions"] if v["served"]]
        assert "v1beta2" in served, name
    # Discovery: the API server now serves the resources, short names included.
    resources = cluster.kubectl_ok("api-resources", "--api-group=kueue.x-k8s.io", "-o", "name")
    assert "clusterqueues.kueue.x-k8s.io" in resources.split()
    assert cluster.kubectl("get", "cq").returncode == 0


def _borrowing_rule_message(docs: list[dict[str, Any]]) -> str:
    cq = next(d for d in docs if d["spec"]["names"]["kind"] == "ClusterQueue")
    rules = _walk_validations(cq["spec"]["versions"])
    matching = [
        r for r in rules if "borrowingLimit" in r.get("rule", "") and "cohort" in r.get("rule", "")
    ]
    assert matching, "ClusterQueue CRD has no CEL rule tying borrowingLimit to the cohort"
    return str(matching[0].get("message") or matching[0]["rule"])


def test_devcluster_api_server_rejects_borrowing_limit_without_cohort(
    cluster: ClusterHandle, applied_crds: list[dict[str, Any]]
) -> None:
    message = _borrowing_rule_message(applied_crds)
    manifest = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: devcluster-cel-no-cohort
spec:
  resourceGroups:
  - coveredResources: ["nvidia.com/gpu"]
    flavors:
    - name: default-flavor
      resources:
      - name: nvidia.com/gpu
        nominalQuota: 8
        borrowingLimit: 4
"""
    proc = cluster.kubectl("apply", "-f", "-", input=manifest)
    assert proc.returncode != 0, f"the API server accepted an invalid ClusterQueue: {proc.stdout}"
    assert "Invalid value" in proc.stderr or "invalid" in proc.stderr.lower(), proc.stderr
    assert message in proc.stderr, f"expected the rule's message {message!r} in: {proc.stderr}"
    # The same queue with a cohort is accepted, so the rejection was the rule, not the shape.
    valid = manifest.replace("spec:\n", "spec:\n  cohortName: devcluster-cel\n", 1)
    cluster.kubectl_ok("apply", "-f", "-", input=valid)
    cluster.kubectl_ok("delete", "clusterqueue", "devcluster-cel-no-cohort")
