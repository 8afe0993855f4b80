"""``budgets:`` in ``phalanx operator --config``: Phalanx's usage budgets (Kueue has none).

A list beside Kueue's Configuration fields, each item one budget::

    budgets:
    - localQueue: team-a/main          # or clusterQueue: research (exactly one of the two)
      resource: nvidia.com/gpu         # any resource name
      resourceHours: 400               # the limit per window, in resource-hours (0 or more)
      period: 168h                     # a Go duration, above 0
      periodStart: "2026-11-30T00:00:00Z"   # optional RFC 3339 anchor; default the Unix epoch
      whenExceeded: Wait               # or Preemptible (default Wait)

Windows are ``period`` long, aligned to ``periodStart`` (before or after it alike). Problems are
reported as ``budgets[2].period: ...``; a second budget for the same scope and resource is
refused. ``whenExceeded``: ``Wait`` (the default; workloads wait for the window to reset) or
``Preemptible`` (admitted, but first in line to be preempted; ``phalanx.admission.budgets``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from phalanx.admission.budgets import Budget, ScopeKind, WhenExceeded

__all__ = ["parse_budgets"]

_FIELDS = {"localQueue", "clusterQueue", "resource", "resourceHours", "period", "periodStart"}
_FIELDS |= {"whenExceeded"}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def parse_budgets(raw: Any, problems: list[str]) -> tuple[Budget, ...]:
    """The budgets of ``raw`` (the ``budgets`` value); each problem appended to ``problems``."""
    from phalanx.operator.configfile import parse_duration

    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(f"budgets: must be a list of budgets, got {type(raw).__name__}")
        return ()
    found: list[Budget] = []
    seen: dict[tuple[ScopeKind, str, str], int] = {}
    for index, item in enumerate(raw):
        where = f"budgets[{index}]"
        before = len(problems)
        if not isinstance(item, Mapping):
            problems.append(f"{where}: must be a mapping, got {type(item).__name__}")
            continue
        for key in item:
            if key not in _FIELDS:
                problems.append(f"{where}.{key}: not a budget field; remove it")
        kind, scope = _scope(item, where, problems)
        resource = item.get("resource")
        if not isinstance(resource, str) or not resource:
            problems.append(f"{where}.resource: required, a resource name such as nvidia.com/gpu")
        hours = item.get("resourceHours")
        if isinstance(hours, bool) or not isinstance(hours, int | float) or hours < 0:
            problems.append(f"{where}.resourceHours: required, a number 0 or more, got {hours!r}")
        period_ms = 0
        try:
            period = item.get("period")
            period_ms = round(parse_duration(period if isinstance(period, str) else "") * 1000)
        except ValueError:
            problems.append(
                f"{where}.period: required, a duration such as 168h or 24h,"
                f" got {item.get('period')!r}"
            )
        else:
            if period_ms <= 0:
                problems.append(f"{where}.period: must be above 0, got {item.get('period')!r}")
        anchor_ms = _anchor(item.get("periodStart"), f"{where}.periodStart", problems)
        mode = item.get("whenExceeded", WhenExceeded.WAIT.value)
        modes = [m.value for m in WhenExceeded]
        if mode not in modes:
            problems.append(
                f"{where}.whenExceeded: must be one of {', '.join(modes)}, got {mode!r}"
            )
        if len(problems) > before or kind is None:
            continue
        assert isinstance(resource, str) and isinstance(hours, int | float)
        other = seen.setdefault((kind, scope, resource), index)
        if other != index:
            problems.append(
                f"{where}: budgets[{other}] already limits {resource} of {kind.value} {scope};"
                " keep one"
            )
            continue
        found.append(
            Budget(
                kind,
                scope,
                resource=resource,
                resource_hours=float(hours),
                period_ms=period_ms,
                anchor_ms=anchor_ms,
                when_exceeded=WhenExceeded(mode),
            )
        )
    return tuple(found)


def _scope(
    item: Mapping[str, Any], where: str, problems: list[str]
) -> tuple[ScopeKind | None, str]:
    local, cluster = item.get("localQueue"), item.get("clusterQueue")
    if (local is None) == (cluster is None):
        problems.append(f"{where}: set exactly one of localQueue (namespace/name) or clusterQueue")
        return None, ""
    if cluster is not None:
        if not isinstance(cluster, str) or not _NAME.match(cluster):
            problems.append(f"{where}.clusterQueue: must be a ClusterQueue name, got {cluster!r}")
            return None, ""
        return ScopeKind.CLUSTER_QUEUE, cluster
    namespace, _, name = local.partition("/") if isinstance(local, str) else ("", "", "")
    if not (_NAME.match(namespace) and _NAME.match(name)):
        problems.append(
            f"{where}.localQueue: must be namespace/name of a LocalQueue, got {local!r}"
        )
        return None, ""
    return ScopeKind.LOCAL_QUEUE, f"{namespace}/{name}"


def _anchor(value: Any, where: str, problems: list[str]) -> int:
    """``periodStart`` in ms since the epoch (0 when absent). YAML may have parsed it already."""
    if value is None:
        return 0
    when: dt.datetime | None = value if isinstance(value, dt.datetime) else None
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError:
            when = None
    if when is None or when.tzinfo is None:
        problems.append(
            f"{where}: must be an RFC 3339 time with a zone, such as 2026-11-30T00:00:00Z,"
            f" got {value!r}"
        )
        return 0
    return (when - _EPOCH) // dt.timedelta(milliseconds=1)
