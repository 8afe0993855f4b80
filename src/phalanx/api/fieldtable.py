"""The table of Kueue v1beta2 fields in docs/api.md, generated from the models.

Every field of the served kinds' schemas (as ``phalanx crds`` generates them) is one row:
*refused* when a rule rejects it (its message comes from :mod:`phalanx.api.unimplemented`),
*accepted, not acted on* when it is listed below, else *implemented*. Kueue fields that are
not in the schemas at all are listed below too, with what Phalanx does instead, and so are
Kueue's kinds that Phalanx does not serve. ``python -m phalanx.api.fieldtable`` prints the
table; a unit test keeps docs/api.md equal to it and checks that it covers every field of
Kueue's CRDs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.api.crds import generate_crd
from phalanx.api.kinds import KINDS
from phalanx.api.unimplemented import UNIMPLEMENTED_FIELDS

__all__ = [
    "ACCEPTED_NOT_ACTED_ON",
    "NOT_IN_SCHEMA",
    "UNSERVED_KINDS",
    "FieldRow",
    "field_rows",
    "render_table",
]

ACCEPTED_NOT_ACTED_ON: Mapping[tuple[str, str], str] = {
    ("LocalQueue", "status.fairSharing.weightedShare"): (
        "not computed: 0 beside admissionFairSharingStatus (Kueue computes none for a LocalQueue)"
    ),
    ("Cohort", "status.fairSharing"): "not written (Cohort status is not maintained)",
    ("Workload", "status.reclaimablePods"): "not written",
    ("Workload", "status.resourceRequests"): "not written",
    ("Workload", "status.admission.podSetAssignments[].delayedTopologyRequest"): (
        "not written: Phalanx places a gang when it admits it"
    ),
    ("Workload", "status.clusterName"): "not written (MultiKueue)",
    ("Workload", "status.nominatedClusterNames"): "not written (MultiKueue)",
    ("Workload", "status.unhealthyNodes"): "not written (failure recovery)",
    ("Workload", "status.preemptionGates"): "not written (preemption gates)",
}
"""Fields in the schema (so writing them works) that Phalanx does not act on or write; a
row's children share its verdict."""

_CHECK_TOLERATIONS = "status.admissionChecks[].podSetUpdates[].tolerations[]"
NOT_IN_SCHEMA: Mapping[tuple[str, str], str] = {
    **{
        ("Workload", f"{_CHECK_TOLERATIONS}.{name}"): (
            "kept as the check controller wrote it (a core/v1 Toleration, applied to the Job"
            " as written)"
        )
        for name in ("effect", "key", "operator", "tolerationSeconds", "value")
    },
}
"""Kueue fields with no place in Phalanx's schema, and what Phalanx has instead."""

UNSERVED_KINDS: Mapping[str, str] = {
    "MultiKueueCluster": "MultiKueue",
    "MultiKueueConfig": "MultiKueue",
}
"""Kueue kinds Phalanx has no CRD for: ``kubectl`` answers "no matches for kind"."""


@dataclass(frozen=True)
class FieldRow:
    kind: str
    path: str
    """Dotted, ``[]`` for list items; ``*`` for every field of an unserved kind."""
    verdict: str
    """``implemented``, ``accepted, not acted on``, ``refused``, ``differs`` or ``kind not
    served``."""
    note: str = ""


def _walk(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if schema.get("type") == "array" and "items" in schema:
        yield from _walk(schema["items"], path + "[]")
        return
    for name, sub in (schema.get("properties") or {}).items():
        child = f"{path}.{name}" if path else name
        yield child, sub
        if not (name == "template" and path.endswith("podSets[]")):
            yield from _walk(sub, child)


def _refusals() -> dict[tuple[str, str], str]:
    """(field name, the description its schema carries) of an unimplemented field -> its
    rule's message."""
    return {
        (entry.field, entry.schema()["description"]): entry.message
        for entry in UNIMPLEMENTED_FIELDS
    }


def _schema_rows(kind: str, schema: Mapping[str, Any]) -> Iterator[FieldRow]:
    refusals = _refusals()
    inherited: dict[str, FieldRow] = {}
    for path, sub in _walk(schema, ""):
        if path.split(".")[0] in ("apiVersion", "kind", "metadata"):
            continue
        parent = next((p for p in inherited if path.startswith(p + ".")), None)
        if parent is not None:
            row = FieldRow(kind, path, inherited[parent].verdict, inherited[parent].note)
        elif refusal := refusals.get((path.rsplit(".", 1)[-1], sub.get("description", ""))):
            row = FieldRow(kind, path, "refused", f"{refusal} (and every field under it)")
            inherited[path] = row
        elif (kind, path) in ACCEPTED_NOT_ACTED_ON:
            row = FieldRow(kind, path, "accepted, not acted on", ACCEPTED_NOT_ACTED_ON[kind, path])
            inherited[path] = row
        else:
            row = FieldRow(kind, path, "implemented")
        yield row


def field_rows() -> list[FieldRow]:
    rows: list[FieldRow] = []
    for info in KINDS:
        crd = generate_crd(info)
        (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
        rows.extend(_schema_rows(info.kind, version["schema"]["openAPIV3Schema"]))
    rows.extend(FieldRow(k, p, "differs", note) for (k, p), note in NOT_IN_SCHEMA.items())
    served = {info.kind for info in KINDS}
    rows.extend(
        FieldRow(kind, "*", "kind not served", feature)
        for kind, feature in UNSERVED_KINDS.items()
        if kind not in served  # a kind being added is listed field by field instead
    )
    return sorted(rows, key=lambda r: (r.kind, r.path))


def render_table() -> str:
    lines = ["| kind | field | Phalanx | note |", "|---|---|---|---|"]
    for row in field_rows():
        note = row.note.replace("|", "\\|")
        lines.append(f"| {row.kind} | `{row.path}` | {row.verdict} | {note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
