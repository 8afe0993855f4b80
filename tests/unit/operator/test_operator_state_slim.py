"""The state keeps what its readers need, not server-side apply's bookkeeping."""

from __future__ import annotations

from phalanx.operator.state import ClusterState


def test_managed_fields_and_last_applied_are_not_kept() -> None:
    state = ClusterState()
    state.apply(
        "Workload",
        "ADDED",
        {
            "metadata": {
                "name": "w",
                "namespace": "ns",
                "resourceVersion": "3",
                "managedFields": [{"manager": "phalanx", "fieldsV1": {"f:status": {}}}],
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}" * 100,
                    "team": "a",
                },
            },
            "spec": {"queueName": "lq"},
        },
    )
    stored = state.get("Workload", "ns/w")
    assert stored is not None
    assert "managedFields" not in stored["metadata"]
    assert stored["metadata"]["annotations"] == {"team": "a"}
    assert stored["spec"] == {"queueName": "lq"}
    assert stored["metadata"]["resourceVersion"] == "3"
