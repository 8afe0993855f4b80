"""The cross-field rules of Phalanx's API, each as CEL for the API server and Python for
``phalanx validate``. Messages say what is wrong and what to do.

CEL cost: the API server refuses a CRD whose rules may cost too much on the largest object
the schema allows, so every list a rule iterates has a ``maxItems`` and every string it
compares a ``maxLength`` (see phalanx.api.quota for the resource-group bounds).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from phalanx.api.admissioncheck import AdmissionCheckSpec
from phalanx.api.clusterqueue import ClusterQueuePreemption, ClusterQueueSpec, PreemptionPolicy
from phalanx.api.cohort import CohortSpec
from phalanx.api.label_rules import LABEL_RULES
from phalanx.api.localqueue import LocalQueueSpec
from phalanx.api.meta import LabelSelectorOperator, LabelSelectorRequirement
from phalanx.api.quota import ResourceGroup
from phalanx.api.resourceflavor import (
    ResourceFlavorSpec,
    TaintEffect,
    Toleration,
    TolerationOperator,
)
from phalanx.api.rules import Rule
from phalanx.api.topology import HOSTNAME_LABEL, TopologySpec
from phalanx.api.unimplemented import unimplemented_rules
from phalanx.api.workload_rules import WORKLOAD_RULES
from phalanx.quotas.quantity import parse_quantity

__all__ = ["RULES"]

QuotaSpec = ClusterQueueSpec | CohortSpec


# --- resource groups (ClusterQueue and Cohort) ------------------------------------------


def _quota_paths(spec: QuotaSpec, attribute: str) -> Iterator[str]:
    for i, group in enumerate(spec.resource_groups or ()):
        for j, flavor in enumerate(group.flavors):
            for k, quota in enumerate(flavor.resources):
                if getattr(quota, attribute) is not None:
                    alias = "borrowingLimit" if attribute == "borrowing_limit" else "lendingLimit"
                    yield f"resourceGroups[{i}].flavors[{j}].resources[{k}].{alias}"


def _limit_needs_owner(spec: QuotaSpec, attribute: str) -> Iterator[str]:
    owner = spec.cohort_name if isinstance(spec, ClusterQueueSpec) else spec.parent_name
    if owner is None:
        yield from _quota_paths(spec, attribute)


def _cel_limit_needs_owner(owner: str, limit: str) -> str:
    return (
        f"has(self.{owner}) || !has(self.resourceGroups) || self.resourceGroups.all(rg, "
        f"rg.flavors.all(f, f.resources.all(r, !has(r.{limit}))))"
    )


def _duplicate_flavors(spec: QuotaSpec) -> Iterator[str]:
    # Within one group the map-list already forbids duplicates; this is across groups.
    first_group: dict[str, int] = {}
    for i, group in enumerate(spec.resource_groups or ()):
        for j, flavor in enumerate(group.flavors):
            if first_group.setdefault(flavor.name, i) != i:
                yield f"resourceGroups[{i}].flavors[{j}].name"


_CEL_UNIQUE_FLAVORS = (
    "!has(self.resourceGroups) || self.resourceGroups.all(rg, rg.flavors.all(f, "
    "self.resourceGroups.exists_one(g, g.flavors.exists(h, h.name == f.name))))"
)


def _duplicate_resources(spec: QuotaSpec) -> Iterator[str]:
    first_group: dict[str, int] = {}
    for i, group in enumerate(spec.resource_groups or ()):
        for j, resource in enumerate(group.covered_resources):
            if first_group.setdefault(resource, i) != i:
                yield f"resourceGroups[{i}].coveredResources[{j}]"


_CEL_UNIQUE_RESOURCES = (
    "!has(self.resourceGroups) || self.resourceGroups.all(rg, rg.coveredResources.all(r, "
    "self.resourceGroups.exists_one(g, r in g.coveredResources)))"
)


def _flavors_cover_group(group: ResourceGroup) -> Iterator[str]:
    covered = group.covered_resources
    for j, flavor in enumerate(group.flavors):
        names = [quota.name for quota in flavor.resources]
        if len(names) != len(covered) or not all(name in covered for name in names):
            yield f"flavors[{j}].resources"


def _lending_within_nominal(spec: ClusterQueueSpec) -> Iterator[str]:
    for i, group in enumerate(spec.resource_groups or ()):
        for j, flavor in enumerate(group.flavors):
            for k, quota in enumerate(flavor.resources):
                if quota.lending_limit is None:
                    continue
                lend = parse_quantity(quota.lending_limit, resource=quota.name)
                if lend > parse_quantity(quota.nominal_quota, resource=quota.name):
                    yield f"resourceGroups[{i}].flavors[{j}].resources[{k}].lendingLimit"


def _quota_rules(model: type[QuotaSpec], *, owner: str, who: str) -> tuple[Rule[Any], ...]:
    kind = model.__name__.removesuffix("Spec")
    return (
        Rule(
            name=f"{kind}-borrowing-limit-needs-{owner}",
            model=model,
            cel=_cel_limit_needs_owner(owner, "borrowingLimit"),
            message=f"borrowingLimit requires spec.{owner}: {who}; set {owner} or remove"
            " borrowingLimit",
            check=lambda spec: _limit_needs_owner(spec, "borrowing_limit"),
            field_path=".resourceGroups",
        ),
        Rule(
            name=f"{kind}-lending-limit-needs-{owner}",
            model=model,
            cel=_cel_limit_needs_owner(owner, "lendingLimit"),
            message=f"lendingLimit requires spec.{owner}: {who}; set {owner} or remove"
            " lendingLimit",
            check=lambda spec: _limit_needs_owner(spec, "lending_limit"),
            field_path=".resourceGroups",
        ),
        Rule(
            name=f"{kind}-flavors-unique",
            model=model,
            cel=_CEL_UNIQUE_FLAVORS,
            message="a flavor can appear in only one resource group; merge the groups or"
            " remove the duplicate flavor",
            check=_duplicate_flavors,
            field_path=".resourceGroups",
        ),
        Rule(
            name=f"{kind}-resources-unique",
            model=model,
            cel=_CEL_UNIQUE_RESOURCES,
            message="a resource can be covered by only one resource group; list it in one"
            " group's coveredResources",
            check=_duplicate_resources,
            field_path=".resourceGroups",
        ),
    )


_RESOURCE_GROUP_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="ResourceGroup-flavors-cover-resources",
        model=ResourceGroup,
        cel="self.flavors.all(f, size(f.resources) == size(self.coveredResources) &&"
        " f.resources.all(r, r.name in self.coveredResources))",
        message="each flavor must give exactly one quota for each of the group's"
        " coveredResources, and no other",
        check=_flavors_cover_group,
        field_path=".flavors",
    ),
)

_CLUSTER_QUEUE_RULES: tuple[Rule[Any], ...] = (
    *_quota_rules(
        ClusterQueueSpec,
        owner="cohortName",
        who="a ClusterQueue outside a cohort has nobody to borrow from or lend to",
    ),
    Rule(
        name="ClusterQueue-lending-within-nominal",
        model=ClusterQueueSpec,
        cel=None,
        why_no_cel="quantities are int-or-string; comparing them needs Python's parser",
        message="lendingLimit must not exceed nominalQuota: a queue cannot lend more than it has",
        check=_lending_within_nominal,
    ),
    Rule(
        name="ClusterQueue-borrow-within-cohort-needs-reclaim",
        model=ClusterQueuePreemption,
        cel="!(self.reclaimWithinCohort == 'Never' && has(self.borrowWithinCohort) &&"
        " self.borrowWithinCohort.policy != 'Never')",
        message="borrowWithinCohort.policy other than Never needs reclaimWithinCohort other"
        " than Never",
        check=lambda p: (
            [""]
            if p.reclaim_within_cohort == PreemptionPolicy.NEVER
            and p.borrow_within_cohort.policy != "Never"
            else []
        ),
    ),
)

_COHORT_RULES = _quota_rules(
    CohortSpec,
    owner="parentName",
    who="limits bound a Cohort against its parent, and a root Cohort has none",
)

_LOCAL_QUEUE_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="LocalQueue-cluster-queue-immutable",
        model=LocalQueueSpec,
        field="clusterQueue",
        cel="self == oldSelf",
        message="clusterQueue cannot be changed; delete the LocalQueue and create it again"
        " to point it to another ClusterQueue",
        check=None,
    ),
)


# --- ResourceFlavor ---------------------------------------------------------------------


def _toleration_rule(name: str, cel: str, message: str, bad: Any) -> Rule[Toleration]:
    return Rule(
        name=f"Toleration-{name}",
        model=Toleration,
        cel=cel,
        message=message,
        check=lambda t: [""] if bad(t) else [],
    )


_RESOURCE_FLAVOR_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="ResourceFlavor-topology-needs-node-labels",
        model=ResourceFlavorSpec,
        cel="!has(self.topologyName) || (has(self.nodeLabels) && size(self.nodeLabels) >= 1)",
        message="a ResourceFlavor with topologyName needs at least one nodeLabel to select"
        " its nodes",
        check=lambda s: ["nodeLabels"] if s.topology_name and not s.node_labels else [],
        field_path=".nodeLabels",
    ),
    Rule(
        name="ResourceFlavor-topology-immutable",
        model=ResourceFlavorSpec,
        cel="!has(oldSelf.topologyName) || (has(self.topologyName) &&"
        " self.topologyName == oldSelf.topologyName)",
        message="topologyName cannot be changed or removed once set; create a new"
        " ResourceFlavor for the other Topology",
        check=None,
        field_path=".topologyName",
    ),
    _toleration_rule(
        "empty-key-needs-exists",
        "has(self.key) || (has(self.operator) && self.operator == 'Exists')",
        "operator must be Exists when key is empty (an empty key matches every taint)",
        lambda t: t.key is None and t.operator != TolerationOperator.EXISTS,
    ),
    _toleration_rule(
        "seconds-need-no-execute",
        "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        "tolerationSeconds can only be set with effect NoExecute",
        lambda t: t.toleration_seconds is not None and t.effect != TaintEffect.NO_EXECUTE,
    ),
    _toleration_rule(
        "exists-without-value",
        "!(has(self.operator) && self.operator == 'Exists' && has(self.value))",
        "value must be empty when operator is Exists",
        lambda t: t.operator == TolerationOperator.EXISTS and t.value is not None,
    ),
)


# --- Topology ---------------------------------------------------------------------------


def _hostname_not_last(spec: TopologySpec) -> Iterator[str]:
    labels = [level.node_label for level in spec.levels]
    if HOSTNAME_LABEL in labels and labels[-1] != HOSTNAME_LABEL:
        yield f"levels[{labels.index(HOSTNAME_LABEL)}].nodeLabel"


def _duplicate_levels(spec: TopologySpec) -> Iterator[str]:
    seen: set[str] = set()
    for i, level in enumerate(spec.levels):
        if level.node_label in seen:
            yield f"levels[{i}].nodeLabel"
        seen.add(level.node_label)


_TOPOLOGY_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="Topology-hostname-last",
        model=TopologySpec,
        cel=f"!self.levels.exists(l, l.nodeLabel == '{HOSTNAME_LABEL}') ||"
        f" self.levels[size(self.levels) - 1].nodeLabel == '{HOSTNAME_LABEL}'",
        message=f"{HOSTNAME_LABEL} can only be the last (lowest) level of a Topology",
        check=_hostname_not_last,
        field_path=".levels",
    ),
    Rule(
        name="Topology-levels-unique",
        model=TopologySpec,
        cel="self.levels.all(l, self.levels.exists_one(m, m.nodeLabel == l.nodeLabel))",
        message="each nodeLabel can appear only once in levels",
        check=_duplicate_levels,
        field_path=".levels",
    ),
    Rule(
        name="Topology-levels-immutable",
        model=TopologySpec,
        field="levels",
        cel="self == oldSelf",
        message="levels cannot be changed; create a new Topology and point the"
        " ResourceFlavor to it",
        check=None,
    ),
)


# --- AdmissionCheck -----------------------------------------------------------------------

_ADMISSION_CHECK_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="AdmissionCheck-controller-name-immutable",
        model=AdmissionCheckSpec,
        field="controllerName",
        cel="self == oldSelf",
        message="controllerName cannot be changed; create a new AdmissionCheck for the other"
        " controller",
        check=None,
    ),
)


# --- meta -------------------------------------------------------------------------------


def _selector_values_mismatch(req: LabelSelectorRequirement) -> list[str]:
    needs_values = req.operator in (LabelSelectorOperator.IN, LabelSelectorOperator.NOT_IN)
    return ["values"] if needs_values != bool(req.values) else []


_META_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="LabelSelectorRequirement-values",
        model=LabelSelectorRequirement,
        cel="(self.operator == 'In' || self.operator == 'NotIn') =="
        " (has(self.values) && size(self.values) > 0)",
        message="values must be non-empty for In and NotIn, and empty for Exists and DoesNotExist",
        check=_selector_values_mismatch,
        field_path=".values",
    ),
)


RULES: tuple[Rule[Any], ...] = (
    *_RESOURCE_GROUP_RULES,
    *_CLUSTER_QUEUE_RULES,
    *_COHORT_RULES,
    *_LOCAL_QUEUE_RULES,
    *_RESOURCE_FLAVOR_RULES,
    *_TOPOLOGY_RULES,
    *_ADMISSION_CHECK_RULES,
    *WORKLOAD_RULES,
    *_META_RULES,
    *LABEL_RULES,
    *unimplemented_rules(),
)
