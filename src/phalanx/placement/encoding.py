"""Kueue v1beta2 ``topologyAssignment``: the compressed slices encoding, both ways.

v1beta1 wrote ``levels`` + ``domains[{values, count}]``. v1beta2 (KEP-2724, "Since v1beta2")
splits the same list into ``slices`` of parallel lists so that assignments over tens of
thousands of nodes stay under etcd's object size limit::

    levels: [kubernetes.io/hostname]
    slices:
    - domainCount: 3
      valuesPerLevel:
      - individual: {prefix: node-b0-r2-n, roots: ["1", "4", "7"]}  # or: universal: <value>
      podCounts: {universal: 2}                         # or: {individual: [2, 1, 3]}

That is Kueue's wire form (``TopologyAssignmentSlice``, ``TopologyAssignmentSliceLevelValues``
in ``apis/kueue/v1beta2/workload_types.go``), which the Workload CRD accepts as is. Phalanx
writes one slice per pod set, compacted the way Kueue's default encoder does
(``singleCompactTopologyAssignmentEncoding``): a level whose values are all equal becomes
``universal``; otherwise the longest common prefix and suffix are lifted out
(non-overlapping) and only the remaining ``individual.roots`` are listed; equal pod counts
become ``podCounts.universal``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DomainCount", "decode_topology_assignment", "encode_topology_assignment"]

# (values at each assignment level, pods in that domain)
DomainCount = tuple[tuple[str, ...], int]


def encode_topology_assignment(
    levels: Sequence[str], domains: Sequence[DomainCount]
) -> dict[str, Any]:
    """Encode ``domains`` (in pod-index order) as a v1beta2 ``topologyAssignment`` dict."""
    slices: list[dict[str, Any]] = []
    if domains:
        values_per_level = [
            _compact_values([values[i] for values, _ in domains]) for i in range(len(levels))
        ]
        counts = [count for _, count in domains]
        piece: dict[str, Any] = {"domainCount": len(domains), "valuesPerLevel": values_per_level}
        if all(c == counts[0] for c in counts):
            piece["podCounts"] = {"universal": counts[0]}
        else:
            piece["podCounts"] = {"individual": counts}
        slices.append(piece)
    return {"levels": list(levels), "slices": slices}


def _compact_values(values: list[str]) -> dict[str, Any]:
    first = values[0]
    if all(v == first for v in values):
        return {"universal": first}
    prefix = _common_prefix(values)
    suffix = _common_prefix([v[::-1] for v in values])[::-1]
    shortest = min(len(v) for v in values)
    # "aba" and "ababa" share prefix "aba" and suffix "aba": the two must not overlap.
    if len(prefix) + len(suffix) > shortest:
        prefix = prefix[: shortest - len(suffix)]
    out: dict[str, Any] = {}
    if prefix:
        out["prefix"] = prefix
    if suffix:
        out["suffix"] = suffix
    out["roots"] = [v[len(prefix) : len(v) - len(suffix)] for v in values]
    return {"individual": out}


def _common_prefix(values: list[str]) -> str:
    low, high = min(values), max(values)
    n = 0
    while n < len(low) and low[n] == high[n]:
        n += 1
    return low[:n]


def decode_topology_assignment(
    assignment: Mapping[str, Any],
) -> tuple[tuple[str, ...], tuple[DomainCount, ...]]:
    """Inverse of :func:`encode_topology_assignment`; accepts any valid v1beta2 slices form
    (several slices, ``universal`` or ``individual`` prefix/suffix/roots values, ``universal``
    or ``individual`` pod counts).

    Raises ValueError naming the field when the structure is inconsistent.
    """
    levels = tuple(str(level) for level in assignment.get("levels", ()))
    if not levels:
        raise ValueError("topologyAssignment.levels: must list at least one level")
    out: list[DomainCount] = []
    for s, piece in enumerate(assignment.get("slices", ())):
        where = f"topologyAssignment.slices[{s}]"
        count = int(piece["domainCount"])
        per_level = piece.get("valuesPerLevel", ())
        if len(per_level) != len(levels):
            raise ValueError(
                f"{where}.valuesPerLevel: has {len(per_level)} entries for {len(levels)} levels"
            )
        columns = [
            _expand_values(v, count, f"{where}.valuesPerLevel[{i}]")
            for i, v in enumerate(per_level)
        ]
        counts = _expand_counts(piece, count, where)
        for d in range(count):
            out.append((tuple(column[d] for column in columns), counts[d]))
    return levels, tuple(out)


def _expand_values(values: Mapping[str, Any], count: int, where: str) -> list[str]:
    if ("universal" in values) == ("individual" in values):
        raise ValueError(f"{where}: exactly one of universal, individual must be set")
    if "universal" in values:
        return [str(values["universal"])] * count
    individual = values["individual"]
    roots = [str(r) for r in individual["roots"]]
    if len(roots) != count:
        raise ValueError(f"{where}.individual.roots: has {len(roots)} values, domainCount {count}")
    prefix = str(individual.get("prefix") or "")
    suffix = str(individual.get("suffix") or "")
    return [prefix + root + suffix for root in roots]


def _expand_counts(piece: Mapping[str, Any], count: int, where: str) -> list[int]:
    counts_field = piece.get("podCounts") or {}
    if ("universal" in counts_field) == ("individual" in counts_field):
        raise ValueError(f"{where}.podCounts: exactly one of universal, individual must be set")
    if "universal" in counts_field:
        return [int(counts_field["universal"])] * count
    counts = [int(c) for c in counts_field["individual"]]
    if len(counts) != count:
        raise ValueError(
            f"{where}.podCounts.individual: has {len(counts)} counts, domainCount {count}"
        )
    return counts
