"""``phalanx operator --config FILE``: Kueue's ``Configuration``, where Phalanx has the same knob.

The file is what the ``phalanx-config`` ConfigMap of the manifests and the Helm chart holds, in
the shape of Kueue's ``config.kueue.x-k8s.io`` Configuration, so a Kueue configuration can be
brought over as it is:

- ``waitForPodsReady``, ``fairSharing``, ``admissionFairSharing`` and ``integrations`` are
  honoured (``admissionFairSharing`` only while the feature gate ``AdmissionFairSharing`` is
  on, Kueue's default since v0.15; ``featureGates: {AdmissionFairSharing: false}`` turns it off);
  ``managedJobsNamespaceSelector`` (``namespaceSelector``, its deprecated name) is checked and
  kept: in Kueue it selects the namespaces whose Jobs *without* a queue name are managed, and
  Phalanx manages only Jobs with one, so it changes nothing here (the manifests give the
  webhooks the same selector);
- ``featureGates``: ``TASBalancedPlacement`` (balanced topology placement of preferred pod
  sets) and ``AdmissionFairSharing`` are honoured; the other gates are read past, each named
  in a log line;
- ``budgets`` is Phalanx's own (usage budgets per LocalQueue or ClusterQueue;
  ``phalanx.operator.budgetconfig``, docs/budgets.md), and so is ``decayedFairSharing``
  (``usageHalfLifeTime``, ``usageSamplingInterval``: fair sharing between ClusterQueues on
  decayed usage; refused unless ``fairSharing.enable`` is true; docs/scheduling.md);
- the process-level sections (``health``, ``metrics``, ``webhook``, ``leaderElection``, ...) are
  set by ``phalanx operator`` flags instead and are read past, each named in a log line;
- anything else, or a value Phalanx does not implement (``manageJobsWithoutQueueName: true``,
  a framework Phalanx does not integrate yet), is an error naming the field, so a setting is
  never silently dropped. ``integrations.frameworks`` names the enabled integrations (Kueue's
  names; without it, ``batch/job``); a queued object of a kind left out is left alone, with an
  Event saying so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phalanx.admission.budgets import Budget
from phalanx.operator.budgetconfig import parse_budgets
from phalanx.operator.integration import KUEUE_FRAMEWORKS

__all__ = [
    "API_VERSIONS",
    "FAIR_SHARING_STRATEGIES",
    "PROCESS_SECTIONS",
    "AdmissionFairSharing",
    "ConfigFile",
    "ConfigFileError",
    "FairSharing",
    "load",
    "parse",
    "parse_duration",
]

API_VERSIONS = ("config.kueue.x-k8s.io/v1beta1", "config.kueue.x-k8s.io/v1beta2")
FAIR_SHARING_STRATEGIES: tuple[str, ...] = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
FRAMEWORKS = (
    "batch/job",
    "pod",
    "jobset.x-k8s.io/jobset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
    "kubeflow.org/pytorchjob",
    "ray.io/rayjob",
    "ray.io/raycluster",
    "trainer.kubeflow.org/trainjob",
)
"""The ``integrations.frameworks`` names Phalanx integrates (a subset of Kueue's)."""
PROCESS_SECTIONS = (
    "namespace",
    "health",
    "metrics",
    "webhook",
    "leaderElection",
    "controller",
    "clientConnection",
    "internalCertManagement",
    "pprofBindAddress",
)
"""Kueue sections about the process, not scheduling; ``phalanx operator`` flags set these."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ConfigFileError(ValueError):
    """The file cannot be used; ``problems`` holds one ``field: what is wrong`` per line."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"invalid configuration {path}:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class FairSharing:
    enabled: bool = False
    preemption_strategies: tuple[str, ...] = FAIR_SHARING_STRATEGIES


@dataclass(frozen=True)
class AdmissionFairSharing:
    """Kueue's ``admissionFairSharing``, or Phalanx's ``decayedFairSharing`` (durations in
    seconds, from Go durations)."""

    usage_half_life_seconds: float
    usage_sampling_interval_seconds: float = 300.0
    resource_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigFile:
    """What the file sets; ``None`` where it is silent (the flag or the default applies)."""

    wait_for_pods_ready: bool | None = None
    pods_ready_timeout_seconds: float | None = None
    backoff_base_seconds: float | None = None
    backoff_max_seconds: float | None = None
    backoff_limit_count: int | None = None
    fair_sharing: FairSharing | None = None
    managed_jobs_namespace_selector: Mapping[str, Any] | None = None
    tas_balanced_placement: bool | None = None
    """``featureGates.TASBalancedPlacement`` (Kueue's default: off)."""
    admission_fair_sharing: AdmissionFairSharing | None = None
    """``admissionFairSharing``; None when absent or its feature gate is off."""
    decayed_fair_sharing: AdmissionFairSharing | None = None
    """Phalanx's ``decayedFairSharing`` (the same decay, between ClusterQueues); None when
    absent."""
    frameworks: tuple[str, ...] | None = None
    """``integrations.frameworks``: the enabled integrations."""
    budgets: tuple[Budget, ...] = ()
    """Phalanx's ``budgets`` (usage budgets), in the file's order."""
    ignored: tuple[str, ...] = field(default=())
    """Process sections present in the file and read past (flags set them)."""


def parse_duration(text: str) -> float:
    """Seconds of a Go duration (``5m``, ``300s``, ``1h30m``, ``1.5h``); ValueError if not one."""
    if not isinstance(text, str) or not text:
        raise ValueError(text)
    if text == "0":
        return 0.0
    position, seconds = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            raise ValueError(text)
        seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(text):
        raise ValueError(text)
    return seconds


def load(path: Path) -> ConfigFile:
    """Read and check ``path``; :class:`ConfigFileError` lists every problem by field."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigFileError(str(path), [f"cannot read it: {error.strerror or error}"]) from None
    except yaml.YAMLError as error:
        raise ConfigFileError(str(path), [f"not YAML: {error}"]) from None
    return parse(document, source=str(path))


def parse(document: Any, *, source: str = "<config>") -> ConfigFile:
    problems: list[str] = []
    if not isinstance(document, Mapping):
        raise ConfigFileError(source, ["the file must hold one mapping (a Kueue Configuration)"])
    api_version = document.get("apiVersion")
    if api_version not in API_VERSIONS:
        problems.append(
            f"apiVersion: must be one of {', '.join(API_VERSIONS)}, got {api_version!r}"
        )
    if document.get("kind") != "Configuration":
        problems.append(f"kind: must be Configuration, got {document.get('kind')!r}")
    known = {"apiVersion", "kind", "featureGates", *PROCESS_SECTIONS}
    known |= {"waitForPodsReady", "fairSharing", "integrations", "manageJobsWithoutQueueName"}
    known |= {"admissionFairSharing", "decayedFairSharing", "budgets"}
    known |= {"managedJobsNamespaceSelector", "namespaceSelector"}
    for key in document:
        if key not in known:
            problems.append(f"{key}: not a Configuration field Phalanx knows; remove it")
    values: dict[str, Any] = {}
    _wait_for_pods_ready(document.get("waitForPodsReady"), values, problems)
    _fair_sharing(document.get("fairSharing"), values, problems)
    _admission_fair_sharing(document.get("admissionFairSharing"), values, problems)
    _decayed_fair_sharing(document.get("decayedFairSharing"), values, problems)
    _integrations(document.get("integrations"), values, problems)
    values["budgets"] = parse_budgets(document.get("budgets"), problems)
    other_gates = _feature_gates(document.get("featureGates"), values, problems)
    if document.get("manageJobsWithoutQueueName") not in (None, False):
        problems.append(
            "manageJobsWithoutQueueName: Phalanx manages only Jobs labelled "
            "kueue.x-k8s.io/queue-name; set it to false or remove it"
        )
    for name in ("managedJobsNamespaceSelector", "namespaceSelector"):
        if document.get(name) is not None:
            values["managed_jobs_namespace_selector"] = _label_selector(
                document[name], name, problems
            )
    if problems:
        raise ConfigFileError(source, problems)
    if not values.pop("admission_fair_sharing_gate", True):
        values.pop("admission_fair_sharing", None)
    ignored = tuple(k for k in PROCESS_SECTIONS if k in document) + other_gates
    return ConfigFile(ignored=ignored, **values)


def _feature_gates(raw: Any, values: dict[str, Any], problems: list[str]) -> tuple[str, ...]:
    """Kueue's ``featureGates`` map; returns the gates read past, as ``featureGates.Name``."""
    gates = _mapping(raw, "featureGates", problems)
    other: list[str] = []
    for name, enabled in gates.items():
        if not isinstance(enabled, bool):
            problems.append(f"featureGates.{name}: must be true or false, got {enabled!r}")
        elif name == "TASBalancedPlacement":
            values["tas_balanced_placement"] = enabled
        elif name == "AdmissionFairSharing":
            values["admission_fair_sharing_gate"] = enabled
        else:
            other.append(f"featureGates.{name}")
    return tuple(other)


def _mapping(value: Any, where: str, problems: list[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{where}: must be a mapping, got {type(value).__name__}")
        return {}
    return value


def _unknown(section: Mapping[str, Any], where: str, fields: set[str], problems: list[str]) -> None:
    for key in section:
        if key not in fields:
            problems.append(f"{where}.{key}: not supported by Phalanx; remove it")


def _boolean(value: Any, where: str, problems: list[str]) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    problems.append(f"{where}: must be true or false, got {value!r}")
    return None


def _seconds(value: Any, where: str, problems: list[str], *, duration: bool) -> float | None:
    if value is None:
        return None
    if duration:
        try:
            return parse_duration(value)
        except ValueError:
            problems.append(f"{where}: {value!r} is not a duration; use one such as 5m, 300s or 1h")
            return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(f"{where}: must be a whole number of seconds, 0 or more, got {value!r}")
        return None
    return float(value)


def _wait_for_pods_ready(raw: Any, values: dict[str, Any], problems: list[str]) -> None:
    where = "waitForPodsReady"
    section = _mapping(raw, where, problems)
    _unknown(section, where, {"enable", "timeout", "blockAdmission", "requeuingStrategy"}, problems)
    values["wait_for_pods_ready"] = _boolean(section.get("enable"), f"{where}.enable", problems)
    timeout = _seconds(section.get("timeout"), f"{where}.timeout", problems, duration=True)
    if timeout is not None and timeout <= 0:
        problems.append(f"{where}.timeout: must be above 0, got {section['timeout']!r}")
    values["pods_ready_timeout_seconds"] = timeout
    if section.get("blockAdmission") not in (None, False):
        problems.append(
            f"{where}.blockAdmission: Phalanx does not block admission while pods start; "
            "set it to false or remove it"
        )
    strategy_where = f"{where}.requeuingStrategy"
    strategy = _mapping(section.get("requeuingStrategy"), strategy_where, problems)
    _unknown(
        strategy,
        strategy_where,
        {"timestamp", "backoffLimitCount", "backoffBaseSeconds", "backoffMaxSeconds"},
        problems,
    )
    if strategy.get("timestamp") not in (None, "Eviction"):
        problems.append(
            f"{strategy_where}.timestamp: Phalanx requeues by eviction time; "
            f"use Eviction, got {strategy['timestamp']!r}"
        )
    for key, name in (
        ("backoffBaseSeconds", "backoff_base_seconds"),
        ("backoffMaxSeconds", "backoff_max_seconds"),
    ):
        values[name] = _seconds(
            strategy.get(key), f"{strategy_where}.{key}", problems, duration=False
        )
    limit = strategy.get("backoffLimitCount")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        problems.append(f"{strategy_where}.backoffLimitCount: must be 0 or more, got {limit!r}")
    else:
        values["backoff_limit_count"] = limit


def _fair_sharing(raw: Any, values: dict[str, Any], problems: list[str]) -> None:
    where = "fairSharing"
    if raw is None:
        return
    section = _mapping(raw, where, problems)
    _unknown(section, where, {"enable", "preemptionStrategies"}, problems)
    enabled = _boolean(section.get("enable"), f"{where}.enable", problems)
    strategies = section.get("preemptionStrategies")
    if strategies is None:
        chosen = FAIR_SHARING_STRATEGIES
    elif not isinstance(strategies, list) or not strategies:
        problems.append(f"{where}.preemptionStrategies: must be a non-empty list")
        chosen = FAIR_SHARING_STRATEGIES
    else:
        for index, strategy in enumerate(strategies):
            if strategy not in FAIR_SHARING_STRATEGIES:
                problems.append(
                    f"{where}.preemptionStrategies[{index}]: must be one of "
                    f"{', '.join(FAIR_SHARING_STRATEGIES)}, got {strategy!r}"
                )
        chosen = tuple(str(s) for s in strategies)
    values["fair_sharing"] = FairSharing(enabled=bool(enabled), preemption_strategies=chosen)


def _admission_fair_sharing(raw: Any, values: dict[str, Any], problems: list[str]) -> None:
    """Kueue's ``admissionFairSharing``, validated as Kueue's ``validateAdmissionFairSharing``:
    a half-life of 0 or more, a sampling interval above 0 (default 5m), weights of 0 or more."""
    found = _decay(raw, "admissionFairSharing", problems, weights=True)
    if found is not None:
        values["admission_fair_sharing"] = found


def _decayed_fair_sharing(raw: Any, values: dict[str, Any], problems: list[str]) -> None:
    """Phalanx's ``decayedFairSharing``: the decay of ``admissionFairSharing`` (same fields,
    same rules, without ``resourceWeights``: a dominant resource share compares each resource
    with its own quota), applied to the fair-sharing order between ClusterQueues; it changes
    how ``fairSharing`` orders, so it needs ``fairSharing.enable: true``."""
    where = "decayedFairSharing"
    found = _decay(raw, where, problems, weights=False)
    if found is None:
        return
    fair = values.get("fair_sharing")
    if fair is None or not fair.enabled:
        problems.append(
            f"{where}: orders ClusterQueues by fair sharing on decayed usage, so it needs "
            "fairSharing.enable: true; enable fair sharing or remove it"
        )
        return
    values["decayed_fair_sharing"] = found


def _decay(
    raw: Any, where: str, problems: list[str], *, weights: bool
) -> AdmissionFairSharing | None:
    """A decay section: ``usageHalfLifeTime`` (required, 0 or more), ``usageSamplingInterval``
    (above 0, default 5m) and, with ``weights``, ``resourceWeights`` (0 or more)."""
    if raw is None:
        return None
    section = _mapping(raw, where, problems)
    fields = {"usageHalfLifeTime", "usageSamplingInterval"}
    _unknown(section, where, fields | {"resourceWeights"} if weights else fields, problems)
    half_life = _signed_duration(
        section.get("usageHalfLifeTime"), f"{where}.usageHalfLifeTime", problems
    )
    if half_life is None and "usageHalfLifeTime" not in section:
        problems.append(f"{where}.usageHalfLifeTime: required, a duration such as 168h")
    elif half_life is not None and half_life < 0:
        problems.append(
            f"{where}.usageHalfLifeTime: must be 0 or more, got {section['usageHalfLifeTime']!r}"
        )
    interval = _signed_duration(
        section.get("usageSamplingInterval"), f"{where}.usageSamplingInterval", problems
    )
    if interval is not None and interval <= 0:
        got = section["usageSamplingInterval"]
        problems.append(f"{where}.usageSamplingInterval: must be above 0, got {got!r}")
    weights_where = f"{where}.resourceWeights"
    found: dict[str, float] = {}
    raw_weights = section.get("resourceWeights") if weights else None
    for name, weight in _mapping(raw_weights, weights_where, problems).items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            problems.append(f"{weights_where}.{name}: must be a number, got {weight!r}")
        elif weight < 0:
            problems.append(f"{weights_where}.{name}: must be 0 or more, got {weight!r}")
        else:
            found[str(name)] = float(weight)
    if half_life is None or half_life < 0 or (interval is not None and interval <= 0):
        return None
    return AdmissionFairSharing(
        usage_half_life_seconds=half_life,
        usage_sampling_interval_seconds=300.0 if interval is None else interval,
        resource_weights=found,
    )


def _signed_duration(value: Any, where: str, problems: list[str]) -> float | None:
    """A Go duration that may be negative (so that a negative one is refused as negative)."""
    if value is None:
        return None
    negative = isinstance(value, str) and value.startswith("-")
    try:
        seconds = parse_duration(value[1:] if negative else value)
    except ValueError:
        problems.append(f"{where}: {value!r} is not a duration; use one such as 5m, 300s or 168h")
        return None
    return -seconds if negative else seconds


def _integrations(raw: Any, values: dict[str, Any], problems: list[str]) -> None:
    where = "integrations"
    if raw is None:
        return
    section = _mapping(raw, where, problems)
    _unknown(section, where, {"frameworks"}, problems)
    frameworks = section.get("frameworks")
    if frameworks is None:
        return
    if not isinstance(frameworks, list):
        problems.append(f"{where}.frameworks: must be a list, got {type(frameworks).__name__}")
        return
    good = True
    for index, framework in enumerate(frameworks):
        if framework in FRAMEWORKS:
            continue
        good = False
        if framework in KUEUE_FRAMEWORKS:
            problems.append(
                f"{where}.frameworks[{index}]: Phalanx integrates {', '.join(FRAMEWORKS)} only, "
                f"got {framework!r}; remove it"
            )
        else:
            problems.append(
                f"{where}.frameworks[{index}]: {framework!r} is not one of Kueue's framework "
                f"names ({', '.join(KUEUE_FRAMEWORKS)})"
            )
    if good:
        values["frameworks"] = tuple(str(f) for f in dict.fromkeys(frameworks))


def _label_selector(raw: Any, where: str, problems: list[str]) -> Mapping[str, Any] | None:
    selector = _mapping(raw, where, problems)
    _unknown(selector, where, {"matchLabels", "matchExpressions"}, problems)
    labels = _mapping(selector.get("matchLabels"), f"{where}.matchLabels", problems)
    for key, value in labels.items():
        if not isinstance(value, str):
            problems.append(f"{where}.matchLabels[{key!r}]: must be a string, got {value!r}")
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        problems.append(f"{where}.matchExpressions: must be a list")
        return None
    for index, expression in enumerate(expressions):
        item = f"{where}.matchExpressions[{index}]"
        if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
            problems.append(f"{item}: must be a mapping with a key")
            continue
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            problems.append(
                f"{item}.operator: must be In, NotIn, Exists or DoesNotExist, got {operator!r}"
            )
        elif operator in ("In", "NotIn") and not values:
            problems.append(f"{item}.values: {operator} needs at least one value")
        elif operator in ("Exists", "DoesNotExist") and values:
            problems.append(f"{item}.values: {operator} takes no values")
    return dict(selector)
