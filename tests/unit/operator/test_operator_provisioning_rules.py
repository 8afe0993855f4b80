"""Kueue's ProvisioningRequest admission check, the pure rules: names and attempts, the
request and its PodTemplates, the check's state from the autoscaler's conditions (a table of
cases), when the next attempt is made, and the check's Active condition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from phalanx.operator import provisioning_rules as rules

WL = "job-train-abcde"
CHECK = "prov"


def config(**spec: Any) -> rules.Config:
    return rules.Config.of(
        {"spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io", **spec}}
    )


def workload(*, admitted: bool = False, active: bool = True, **extra: Any) -> dict[str, Any]:
    conditions = [{"type": "QuotaReserved", "status": "True"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    pod_sets = extra.get("pod_sets") or [
        {
            "name": "main",
            "count": 4,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "resources": {
                                "limits": {"nvidia.com/gpu": "8"},
                                "requests": {"cpu": "1"},
                            },
                        }
                    ]
                }
            },
        }
    ]
    return {
        "metadata": {
            "name": WL,
            "namespace": "ns",
            "uid": "u-1",
            "annotations": extra.get("annotations", {}),
        },
        "spec": {"active": active, "podSets": pod_sets},
        "status": {
            "conditions": conditions,
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": extra.get(
                    "assignments",
                    [{"name": "main", "count": 3, "flavors": {"nvidia.com/gpu": "a100"}}],
                ),
            },
        },
    }


def request(attempt: int, *conditions: tuple[str, str], **details: str) -> dict[str, Any]:
    return {
        "metadata": {"name": rules.request_name(WL, CHECK, attempt), "namespace": "ns", "uid": "r"},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": [
                {
                    "podTemplateRef": {
                        "name": rules.pod_template_name(
                            rules.request_name(WL, CHECK, attempt), "main"
                        )
                    },
                    "count": 3,
                }
            ],
        },
        "status": {
            "conditions": [{"type": t, "status": "True", "message": m} for t, m in conditions],
            "provisioningClassDetails": details,
        },
    }


def test_names_and_attempts_are_kueues() -> None:
    assert rules.request_name(WL, CHECK, 2) == f"{WL}-{CHECK}-2"
    assert rules.pod_template_name(f"{WL}-{CHECK}-2", "main") == f"ppt-{WL}-{CHECK}-2-main"
    assert rules.attempt_of(f"{WL}-{CHECK}-12", WL, CHECK) == 12
    assert rules.attempt_of(f"{WL}-other-1", WL, CHECK) is None
    long = "w" * 300
    name = rules.request_name(long, CHECK, 1)
    assert len(name) == 253 and rules.attempt_of(name, long, CHECK) is None  # hashed, as Kueue


def test_config_defaults_and_backoff() -> None:
    c = config()
    assert (c.backoff_limit_count, c.backoff_base_seconds, c.backoff_max_seconds) == (3, 60, 1800)
    assert [c.backoff_seconds(n) for n in (1, 2, 3, 7)] == [60, 120, 240, 1800]


@dataclass
class Case:
    name: str
    state: dict[str, Any]
    request: dict[str, Any] | None
    want: tuple[str, str] | None
    limit: int = 1
    admitted: bool = False
    extra: dict[str, Any] | None = None


CASES = [
    Case(
        "no answer yet: pending", {"state": "Pending", "message": "x"}, request(1), ("Pending", "")
    ),
    Case("unchanged: no write", {"state": "Pending", "message": ""}, request(1), None),
    Case(
        "provisioned: ready",
        {"state": "Pending"},
        request(1, ("Provisioned", "done"), pool="p1"),
        ("Ready", "done"),
    ),
    Case(
        "accepted, provisioning message",
        {"state": "Pending", "message": ""},
        request(1, ("Accepted", ""))
        | {
            "status": {
                "conditions": [
                    {"type": "Accepted", "status": "True", "message": ""},
                    {"type": "Provisioned", "status": "False", "message": "waiting for nodes"},
                ]
            }
        },
        ("Pending", "waiting for nodes"),
    ),
    Case(
        "failed within the limit: retry",
        {"state": "Pending"},
        request(1, ("Failed", "no capacity")),
        ("Retry", "Retrying after failure: no capacity"),
    ),
    Case(
        "failed, attempt already counted: stays pending with the message",
        {"state": "Pending", "retryCount": 1},
        request(1, ("Failed", "no capacity")),
        ("Pending", "Retrying after failure: no capacity"),
    ),
    Case(
        "failed past the limit: rejected",
        {"state": "Pending", "retryCount": 1},
        request(2, ("Failed", "still none")),
        ("Rejected", "still none"),
    ),
    Case(
        "booking expired before admission: retry",
        {"state": "Ready"},
        request(1, ("BookingExpired", "expired")),
        ("Retry", "Retrying after booking expired: expired"),
    ),
    Case(
        "booking expired after admission: ignored",
        {"state": "Ready", "message": "m"},
        request(1, ("Provisioned", "m"), ("BookingExpired", "expired")),
        None,
        admitted=True,
    ),
    Case(
        "capacity revoked: rejected",
        {"state": "Ready"},
        request(1, ("CapacityRevoked", "nodes gone")),
        ("Rejected", "nodes gone"),
        admitted=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_check_state_follows_the_requests_conditions(case: Case) -> None:
    state = {"name": CHECK, "lastTransitionTime": "t", **case.state}
    update = rules.check_update(
        workload(admitted=case.admitted),
        state,
        check=CHECK,
        config=config(retryStrategy={"backoffLimitCount": case.limit, "backoffBaseSeconds": 10}),
        request=case.request,
    )
    if case.want is None:
        assert update is None
        return
    assert update is not None
    assert (update["state"], update["message"]) == case.want
    if update["state"] == "Retry":
        assert update["requeueAfterSeconds"] == 10


def test_ready_carries_the_pod_set_updates() -> None:
    c = config(
        podSetUpdates={"nodeSelector": [{"key": "pool", "valueFromProvisioningClassDetail": "p"}]}
    )
    update = rules.check_update(
        workload(),
        {"name": CHECK, "state": "Pending"},
        check=CHECK,
        config=c,
        request=request(1, ("Provisioned", "ok"), p="rack-7"),
    )
    assert update is not None and update["podSetUpdates"] == [
        {
            "name": "main",
            "annotations": {
                rules.CONSUME_ANNOTATION: f"{WL}-{CHECK}-1",
                rules.PROVISIONING_CLASS_ANNOTATION: "check-capacity.autoscaling.x-k8s.io",
            },
            "nodeSelector": {"pool": "rack-7"},
        }
    ]


def test_missing_config_and_unneeded_request() -> None:
    pending = rules.check_update(
        workload(), {"name": CHECK, "state": "Ready"}, check=CHECK, config=None, request=None
    )
    assert pending is not None and (pending["state"], pending["message"]) == (
        "Pending",
        rules.CHECK_INACTIVE,
    )
    # Only pod sets using a managed resource are provisioned; none does: Ready at once.
    unneeded = rules.check_update(
        workload(),
        {"name": CHECK, "state": "Pending"},
        check=CHECK,
        config=config(managedResources=["example.com/tpu"]),
        request=None,
    )
    assert unneeded is not None and (unneeded["state"], unneeded["message"]) == (
        "Ready",
        rules.NO_REQUEST_NEEDED,
    )


@pytest.mark.parametrize(
    ("state", "req", "admitted", "want"),
    [
        ({"state": "Pending"}, None, False, 1),
        ({"state": "Pending", "retryCount": 2}, None, False, 3),
        ({"state": "Pending"}, request(1), False, None),
        ({"state": "Pending", "retryCount": 1}, request(1, ("Failed", "x")), False, 2),
        ({"state": "Retry"}, request(1, ("Failed", "x")), False, None),  # eviction first
        ({"state": "Pending"}, request(1, ("BookingExpired", "x")), False, 2),
        ({"state": "Pending"}, request(1, ("BookingExpired", "x")), True, None),
        ({"state": "Ready"}, None, False, None),
    ],
)
def test_next_attempt(
    state: dict[str, Any], req: dict[str, Any] | None, admitted: bool, want: int | None
) -> None:
    assert rules.next_attempt(state, req, workload=workload(admitted=admitted), check=CHECK) == want


def test_request_and_pod_template_bodies() -> None:
    wl = workload(annotations={"provreq.kueue.x-k8s.io/ValidUntilSeconds": "60", "other": "x"})
    c = config(parameters={"a": "b"})
    merged = rules.merged_pod_sets(wl, c)
    assert [(m.name, m.count) for m in merged] == [("main", 3)]  # the admitted count
    flavors = {
        "a100": {
            "spec": {
                "nodeLabels": {"gpu": "a100"},
                "tolerations": [{"key": "t", "operator": "Exists"}],
            }
        }
    }
    template = rules.pod_template(wl, merged[0], name="ppt-x-main", flavors=flavors)
    spec = template["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert spec["tolerations"] == [{"key": "t", "operator": "Exists"}]
    # Limits stand in for missing requests, as Kueue does for the autoscaler.
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "8", "cpu": "1"}
    assert template["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    body = rules.provisioning_request(wl, c, name="r-1", pod_sets=[("ppt-x-main", 3)])
    assert body["spec"]["parameters"] == {"a": "b", "ValidUntilSeconds": "60"}
    assert body["spec"]["podSets"] == [{"podTemplateRef": {"name": "ppt-x-main"}, "count": 3}]
    assert body["metadata"]["labels"] == {rules.MANAGED_LABEL: "true"}


def test_pod_sets_merge_per_policy() -> None:
    template = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}
    pod_sets = [
        {"name": "a", "count": 2, "template": template},
        {"name": "b", "count": 3, "template": template},
    ]
    assignments = [
        {"name": "a", "count": 2, "flavors": {}},
        {"name": "b", "count": 3, "flavors": {}},
    ]
    wl = workload(pod_sets=pod_sets, assignments=assignments)
    assert [(m.name, m.count) for m in rules.merged_pod_sets(wl, config())] == [("a", 2), ("b", 3)]
    merged = rules.merged_pod_sets(wl, config(podSetMergePolicy="IdenticalPodTemplates"))
    assert [(m.name, m.count) for m in merged] == [("a", 5)]


def test_check_active_needs_its_config() -> None:
    check = {
        "spec": {
            "controllerName": "kueue.x-k8s.io/provisioning-request",
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "ProvisioningRequestConfig",
                "name": "c",
            },
        }
    }
    assert rules.check_active(check, {})["reason"] == "BadParametersRef"  # type: ignore[index]
    assert rules.check_active(check, {"c": {"spec": {}}})["status"] == "True"  # type: ignore[index]
    assert rules.check_active({"spec": {"controllerName": "example.com/other"}}, {}) is None
    bad_kind = {
        "spec": {**check["spec"], "parameters": {**check["spec"]["parameters"], "kind": "X"}}
    }
    assert "wrong kind" in rules.check_active(bad_kind, {})["message"]  # type: ignore[index]
