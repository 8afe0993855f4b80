"""The objects the plugin's ``create``, ``stop`` and ``resume`` verbs write, built from their flags
as kueuectl builds them; no I/O, so every rule is unit-tested.

- ``--nominal-quota``/``--borrowing-limit``/``--lending-limit``: ``FLAVOR:RES=QTY;RES=QTY``, one
  flavor per comma-separated item (the flag may repeat). The three flags are merged per flavor
  (each must list the same resources), then flavors covering the same resources share one
  resource group, in the order given; two groups may not share a resource.
- ``--namespace-selector K=V,...``: ``matchLabels`` (``{}``, every namespace, when absent).
- ``--node-taints KEY[=VALUE]:EFFECT``, ``--tolerations KEY[=VALUE][:EFFECT] | :EFFECT``.

A wrong value raises :class:`FlagError`, which names the flag and the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from phalanx.api.label_rules import is_label_value, is_qualified_name
from phalanx.quotas.quantity import QuantityError, parse_quantity

API_VERSION: Final = "kueue.x-k8s.io/v1beta2"
QUEUEING_STRATEGIES: Final = ("BestEffortFIFO", "StrictFIFO")
RECLAIM_POLICIES: Final = ("Never", "LowerPriority", "Any")
WITHIN_CQ_POLICIES: Final = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
QUOTA_FLAGS: Final = {
    "nominal-quota": "nominalQuota",
    "borrowing-limit": "borrowingLimit",
    "lending-limit": "lendingLimit",
}
_FLAVOR_NAME: Final = re.compile(r"[a-z0-9][a-z0-9.-]{0,252}")


class FlagError(ValueError):
    """A flag's value the plugin cannot use; the message names the flag."""

    def __init__(self, flag: str, message: str) -> None:
        self.flag = flag
        super().__init__(f"--{flag}: {message}")


def split_items(values: Sequence[str]) -> list[str]:
    """A repeatable, comma-separated flag's items (pflag's StringSlice), empty ones dropped."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def parse_key_values(flag: str, values: Sequence[str]) -> dict[str, str]:
    """``K=V,K2=V2`` (pflag's StringToString) into a dict; keys and values as labels'."""
    pairs: dict[str, str] = {}
    for item in split_items(values):
        key, equals, value = item.partition("=")
        if not equals:
            raise FlagError(flag, f"{item!r} is not KEY=VALUE")
        if not is_qualified_name(key):
            raise FlagError(flag, f"{key!r} is not a label key")
        if not is_label_value(value):
            raise FlagError(flag, f"{value!r} (for {key}) is not a label value")
        pairs[key] = value
    return pairs


def choice(flag: str, value: str | None, allowed: Sequence[str]) -> str:
    """The value of an enum flag, its first choice when absent (kueuectl's default)."""
    if value is None:
        return allowed[0]
    if value not in allowed:
        raise FlagError(flag, f"{value!r} is not one of {', '.join(allowed)}")
    return value


# -- quotas -------------------------------------------------------------------------------------


def parse_quotas(flag: str, values: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """``FLAVOR:RES=QTY;RES=QTY`` items into (flavor, {resource: quantity}) in their order."""
    parsed: list[tuple[str, dict[str, str]]] = []
    for item in split_items(values):
        flavor, colon, spec = item.partition(":")
        if not colon or not spec:
            raise FlagError(flag, f"{item!r} is not FLAVOR:RESOURCE=QUANTITY[;RESOURCE=QUANTITY]")
        if not _FLAVOR_NAME.fullmatch(flavor):
            raise FlagError(flag, f"{flavor!r} is not a ResourceFlavor name")
        resources: dict[str, str] = {}
        for part in (p for p in spec.split(";") if p):
            name, equals, quantity = part.partition("=")
            if not equals or not name or not quantity:
                raise FlagError(flag, f"{part!r} in {item!r} is not RESOURCE=QUANTITY")
            if not is_qualified_name(name):
                raise FlagError(flag, f"{name!r} in {item!r} is not a resource name")
            try:
                parse_quantity(quantity, resource=name)
            except QuantityError as error:
                raise FlagError(flag, f"{name} in {item!r}: {error}") from None
            if name in resources:
                raise FlagError(flag, f"{name} is given twice for flavor {flavor}")
            resources[name] = quantity
        parsed.append((flavor, resources))
    return parsed


def resource_groups(
    nominal: Sequence[str], borrowing: Sequence[str], lending: Sequence[str]
) -> list[dict[str, Any]]:
    """The ClusterQueue's ``resourceGroups`` from the three quota flags, as kueuectl merges them."""
    flavors: dict[str, dict[str, dict[str, str]]] = {}
    for flag, values in (
        ("nominal-quota", nominal),
        ("borrowing-limit", borrowing),
        ("lending-limit", lending),
    ):
        field = QUOTA_FLAGS[flag]
        for flavor, resources in parse_quotas(flag, values):
            known = flavors.setdefault(flavor, {name: {} for name in resources})
            if set(known) != set(resources):
                raise FlagError(
                    flag,
                    f"flavor {flavor} lists {', '.join(resources)} but was given "
                    f"{', '.join(known)}: each quota flag must list the same resources of a flavor",
                )
            for name, quantity in resources.items():
                if field in known[name]:
                    raise FlagError(flag, f"flavor {flavor} is given twice")
                known[name][field] = quantity
    groups: list[dict[str, Any]] = []
    for flavor, limits in flavors.items():
        covered = list(limits)
        # kueuectl's quota always carries nominalQuota: 0 when only a limit is given.
        quotas = [
            {"name": name, "nominalQuota": fields.get("nominalQuota", "0"), **fields}
            for name, fields in limits.items()
        ]
        entry = {"name": flavor, "resources": quotas}
        same = next((g for g in groups if set(g["coveredResources"]) == set(covered)), None)
        if same is not None:
            same["flavors"].append(entry)
            continue
        for group in groups:
            shared = set(group["coveredResources"]) & set(covered)
            if shared:
                raise FlagError(
                    "nominal-quota",
                    f"flavor {flavor} covers {', '.join(covered)}, which shares "
                    f"{', '.join(sorted(shared))} with flavor {group['flavors'][0]['name']} "
                    f"({', '.join(group['coveredResources'])}): flavors of one resource group "
                    "must cover exactly the same resources",
                )
        groups.append({"coveredResources": covered, "flavors": [entry]})
    return groups


# -- objects ------------------------------------------------------------------------------------


def cluster_queue(
    name: str,
    *,
    cohort: str | None = None,
    queuing_strategy: str | None = None,
    namespace_selector: Sequence[str] = (),
    reclaim_within_cohort: str | None = None,
    preemption_within_cluster_queue: str | None = None,
    nominal_quota: Sequence[str] = (),
    borrowing_limit: Sequence[str] = (),
    lending_limit: Sequence[str] = (),
) -> dict[str, Any]:
    """The ClusterQueue ``kueuectl create clusterqueue`` builds for the same flags."""
    spec: dict[str, Any] = {}
    if cohort:
        spec["cohortName"] = cohort
    labels = parse_key_values("namespace-selector", namespace_selector)
    spec["namespaceSelector"] = {"matchLabels": labels} if labels else {}
    spec["preemption"] = {
        "reclaimWithinCohort": choice(
            "reclaim-within-cohort", reclaim_within_cohort, RECLAIM_POLICIES
        ),
        "withinClusterQueue": choice(
            "preemption-within-cluster-queue", preemption_within_cluster_queue, WITHIN_CQ_POLICIES
        ),
    }
    spec["queueingStrategy"] = choice("queuing-strategy", queuing_strategy, QUEUEING_STRATEGIES)
    groups = resource_groups(nominal_quota, borrowing_limit, lending_limit)
    if groups:
        spec["resourceGroups"] = groups
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(name: str, *, namespace: str, cluster_queue: str) -> dict[str, Any]:
    if not cluster_queue:
        raise FlagError("clusterqueue", "required: the ClusterQueue this LocalQueue submits to")
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def resource_flavor(
    name: str,
    *,
    node_labels: Sequence[str] = (),
    node_taints: Sequence[str] = (),
    tolerations: Sequence[str] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    labels = parse_key_values("node-labels", node_labels)
    if labels:
        spec["nodeLabels"] = labels
    taints = parse_taints(node_taints)
    if taints:
        spec["nodeTaints"] = taints
    parsed = [parse_toleration(t) for t in split_items(tolerations)]
    if parsed:
        spec["tolerations"] = parsed
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def _split_spec(flag: str, text: str) -> tuple[str, str, str]:
    """``KEY[=VALUE][:EFFECT]`` into its three parts (kueuectl's splitSpecItem)."""
    head, _, effect = text.partition(":")
    if ":" in effect or head.count("=") > 1:
        raise FlagError(flag, f"{text!r} is not KEY[=VALUE][:EFFECT]")
    key, _, value = head.partition("=")
    if effect and effect not in TAINT_EFFECTS:
        raise FlagError(
            flag, f"{text!r}: effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}"
        )
    if key and not is_qualified_name(key):
        raise FlagError(flag, f"{text!r}: {key!r} is not a label key")
    if value and not is_label_value(value):
        raise FlagError(flag, f"{text!r}: {value!r} is not a label value")
    return key, value, effect


def parse_taints(values: Sequence[str]) -> list[dict[str, str]]:
    taints: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for item in split_items(values):
        key, value, effect = _split_spec("node-taints", item)
        if not key or not effect:
            raise FlagError("node-taints", f"{item!r} is not KEY[=VALUE]:EFFECT")
        if (key, effect) in seen:
            raise FlagError("node-taints", f"{key} with effect {effect} is given twice")
        seen.add((key, effect))
        taints.append({"key": key, **({"value": value} if value else {}), "effect": effect})
    return taints


def parse_toleration(item: str) -> dict[str, str]:
    key, value, effect = _split_spec("tolerations", item)
    if value and not key:
        raise FlagError("tolerations", f"{item!r} has a value but no key")
    toleration = {"key": key} if key else {}
    toleration["operator"] = "Equal" if key and value else "Exists"
    if value:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def stop_policy(*, stop: bool, keep_already_running: bool = False) -> str:
    """A queue's ``spec.stopPolicy``: stop holds new admissions and, unless the admitted
    workloads may keep running, evicts them too; resume is ``None``."""
    if not stop:
        return "None"
    return "Hold" if keep_already_running else "HoldAndDrain"
