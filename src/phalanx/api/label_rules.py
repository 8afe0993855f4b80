"""Kubernetes' syntax for label keys, label values and resource names, as rules.

Kueue's webhooks check these (apimachinery's IsQualifiedName and IsValidLabelValue) because an
invalid one accepted here fails later, where nobody looks: a ResourceFlavor's nodeLabels and
tolerations go into the pods of every Job it admits (the API server then refuses the Job's
update, which stays suspended while holding quota), a resource name must be one that pods can
request, and a LocalQueue's name travels in a label. Each rule is CEL for the API server and
Python for ``phalanx validate``, as in phalanx.api.rulebook.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

from phalanx.api.cohort import Cohort
from phalanx.api.localqueue import LocalQueue
from phalanx.api.meta import LabelSelector
from phalanx.api.quota import ResourceGroup, ResourceQuota
from phalanx.api.resourceflavor import ResourceFlavorSpec, Taint, Toleration
from phalanx.api.rules import Rule

__all__ = [
    "LABEL_RULES",
    "LABEL_VALUE_MAX",
    "cel_label_value",
    "cel_qualified_name",
    "is_label_value",
    "is_qualified_name",
]

LABEL_VALUE_MAX: Final = 63
# A name part (and a label value): at most 63 characters, alphanumeric at both ends.
_NAME_PART: Final = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_DNS_SUBDOMAIN: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
# Two patterns because a regular expression cannot both follow a DNS subdomain's shape and
# bound its length to 253: one checks the shape, the other the lengths of prefix and name.
_QUALIFIED_SHAPE: Final = rf"({_DNS_SUBDOMAIN}/)?{_NAME_PART}"
_QUALIFIED_LENGTHS: Final = r"([^/]{1,253}/)?[^/]{1,63}"
_LABEL_VALUE: Final = rf"{_NAME_PART}?"

_QUALIFIED_TEXT: Final = (
    "an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at"
    " most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit"
)
_LABEL_VALUE_TEXT: Final = (
    "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    " (or empty)"
)


def is_qualified_name(value: str) -> bool:
    """Whether ``value`` is a label key or resource name (IsQualifiedName)."""
    return bool(re.fullmatch(_QUALIFIED_SHAPE, value) and re.fullmatch(_QUALIFIED_LENGTHS, value))


def is_label_value(value: str) -> bool:
    """Whether ``value`` can be a label's value (IsValidLabelValue)."""
    return re.fullmatch(_LABEL_VALUE, value) is not None


def _cel_matches(expr: str, pattern: str) -> str:
    # A CEL string literal takes a backslash only as an escape: double each one.
    escaped = pattern.replace("\\", "\\\\")
    return f"{expr}.matches('^{escaped}$')"


def cel_qualified_name(expr: str) -> str:
    """CEL that holds when the string ``expr`` is a qualified name."""
    return f"{_cel_matches(expr, _QUALIFIED_SHAPE)} && {_cel_matches(expr, _QUALIFIED_LENGTHS)}"


def cel_label_value(expr: str) -> str:
    """CEL that holds when the string ``expr`` is a valid label value."""
    return _cel_matches(expr, _LABEL_VALUE)


# --- resource names (ClusterQueue and Cohort) -------------------------------------------

_RESOURCE_NAME_MESSAGE = (
    "a resource name must be a qualified name such as cpu or nvidia.com/gpu: "
    + _QUALIFIED_TEXT
    + "; use the name the pods request"
)


def _bad_covered_resources(group: ResourceGroup) -> Iterator[str]:
    for j, name in enumerate(group.covered_resources):
        if not is_qualified_name(name):
            yield f"coveredResources[{j}]"


_RESOURCE_NAME_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="ResourceGroup-covered-resources-qualified",
        model=ResourceGroup,
        cel=f"self.coveredResources.all(r, {cel_qualified_name('r')})",
        message=_RESOURCE_NAME_MESSAGE,
        check=_bad_covered_resources,
        field_path=".coveredResources",
    ),
    Rule(
        name="ResourceQuota-name-qualified",
        model=ResourceQuota,
        cel=None,
        why_no_cel="the API server checks each name against coveredResources, which the"
        " rule above checks; a regular expression per quota (up to 16 x 16 x 16 of them)"
        " exceeds its CEL cost budget",
        message=_RESOURCE_NAME_MESSAGE,
        check=lambda quota: [] if is_qualified_name(quota.name) else ["name"],
    ),
)


# --- ResourceFlavor ---------------------------------------------------------------------


def _bad_node_label_keys(spec: ResourceFlavorSpec) -> Iterator[str]:
    for key in spec.node_labels or {}:
        if not is_qualified_name(key):
            yield f"nodeLabels[{key}]"


def _bad_node_label_values(spec: ResourceFlavorSpec) -> Iterator[str]:
    for key, value in (spec.node_labels or {}).items():
        if not is_label_value(value):
            yield f"nodeLabels[{key}]"


def _duplicate_taints(spec: ResourceFlavorSpec) -> Iterator[str]:
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(spec.node_taints or ()):
        key = (taint.key, taint.effect.value)
        if key in seen:
            yield f"nodeTaints[{i}]"
        seen.add(key)


_RESOURCE_FLAVOR_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="ResourceFlavor-node-label-keys",
        model=ResourceFlavorSpec,
        field="nodeLabels",
        cel=f"self.all(k, {cel_qualified_name('k')})",
        message="each nodeLabels key must be a label key such as cloud.google.com/gke-accelerator:"
        f" {_QUALIFIED_TEXT}; they become the node selector of the admitted pods",
        check=_bad_node_label_keys,
    ),
    Rule(
        name="ResourceFlavor-node-label-values",
        model=ResourceFlavorSpec,
        field="nodeLabels",
        cel=f"self.all(k, {cel_label_value('self[k]')})",
        message=f"each nodeLabels value must be a label value: {_LABEL_VALUE_TEXT}; they become"
        " the node selector of the admitted pods",
        check=_bad_node_label_values,
    ),
    Rule(
        name="ResourceFlavor-taints-unique",
        model=ResourceFlavorSpec,
        field="nodeTaints",
        cel="self.all(t, self.exists_one(u, u.key == t.key && u.effect == t.effect))",
        message="nodeTaints must be unique by key and effect; merge or remove the duplicate",
        check=_duplicate_taints,
    ),
    Rule(
        name="Taint-key-qualified",
        model=Taint,
        field="key",
        cel=cel_qualified_name("self"),
        message=f"a taint key must be a label key: {_QUALIFIED_TEXT}",
        check=lambda taint: [] if is_qualified_name(taint.key) else ["key"],
    ),
    Rule(
        name="Taint-value-label-value",
        model=Taint,
        field="value",
        cel=cel_label_value("self"),
        message=f"a taint value must be a label value: {_LABEL_VALUE_TEXT}",
        check=lambda taint: [] if taint.value is None or is_label_value(taint.value) else ["value"],
    ),
    Rule(
        name="Toleration-key-qualified",
        model=Toleration,
        field="key",
        cel=cel_qualified_name("self"),
        message=f"a toleration key must be a label key: {_QUALIFIED_TEXT}; the admitted pods"
        " carry it",
        check=lambda t: [] if t.key is None or is_qualified_name(t.key) else ["key"],
    ),
    Rule(
        name="Toleration-value-label-value",
        model=Toleration,
        field="value",
        cel=cel_label_value("self"),
        message=f"a toleration value must be a label value: {_LABEL_VALUE_TEXT}; the admitted"
        " pods carry it",
        check=lambda t: [] if t.value is None or is_label_value(t.value) else ["value"],
    ),
)


# --- label selectors (a ClusterQueue's namespaceSelector) -------------------------------

_NO_SELECTOR_CEL = (
    "Kubernetes' LabelSelector bounds neither the number nor the length of its labels, so a"
    " regular expression over them exceeds the API server's CEL cost budget"
)


def _bad_match_label_keys(selector: LabelSelector) -> Iterator[str]:
    for key in selector.match_labels or {}:
        if not is_qualified_name(key):
            yield f"matchLabels[{key}]"


def _bad_selector_values(selector: LabelSelector) -> Iterator[str]:
    for key, value in (selector.match_labels or {}).items():
        if not is_label_value(value):
            yield f"matchLabels[{key}]"
    for i, requirement in enumerate(selector.match_expressions or ()):
        for j, value in enumerate(requirement.values or ()):
            if not is_label_value(value):
                yield f"matchExpressions[{i}].values[{j}]"


_SELECTOR_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="LabelSelector-keys-qualified",
        model=LabelSelector,
        cel=None,
        why_no_cel=_NO_SELECTOR_CEL,
        message=f"a selector's label key must be a label key: {_QUALIFIED_TEXT}",
        check=_bad_match_label_keys,
    ),
    Rule(
        name="LabelSelector-values-label-values",
        model=LabelSelector,
        cel=None,
        why_no_cel=_NO_SELECTOR_CEL,
        message=f"a selector's value must be a label value: {_LABEL_VALUE_TEXT}",
        check=_bad_selector_values,
    ),
)


# --- names that travel in labels, and the cohort tree -----------------------------------

_OBJECT_RULES: tuple[Rule[Any], ...] = (
    Rule(
        name="LocalQueue-name-fits-label",
        model=LocalQueue,
        cel=f"size(self.metadata.name) <= {LABEL_VALUE_MAX}",
        message=f"a LocalQueue's name (metadata.name) can have at most {LABEL_VALUE_MAX}"
        " characters: Jobs name their LocalQueue in the kueue.x-k8s.io/queue-name label, whose"
        " values are that short; choose a shorter name",
        check=lambda lq: ["metadata.name"] if len(lq.metadata.name) > LABEL_VALUE_MAX else [],
    ),
    Rule(
        name="Cohort-not-own-parent",
        model=Cohort,
        cel="!has(self.spec) || !has(self.spec.parentName) ||"
        " self.spec.parentName != self.metadata.name",
        message="a Cohort cannot be its own parent (spec.parentName names this Cohort); name"
        " another Cohort, or remove parentName to make this Cohort a root",
        check=lambda c: ["spec.parentName"] if c.spec.parent_name == c.metadata.name else [],
        field_path=".spec.parentName",
    ),
)

LABEL_RULES: tuple[Rule[Any], ...] = (
    *_RESOURCE_NAME_RULES,
    *_RESOURCE_FLAVOR_RULES,
    *_SELECTOR_RULES,
    *_OBJECT_RULES,
)
