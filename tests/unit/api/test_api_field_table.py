"""docs/api.md's table of Kueue v1beta2 fields: it is the table generated from the models,
and it places every field of Kueue's CRDs (implemented, accepted and not acted on, refused
with its message, differs, or its kind not served)."""

from __future__ import annotations

from pathlib import Path

from kueue_v1beta2_fields import KUEUE_V1BETA2_FIELDS

from phalanx.api.fieldtable import field_rows, render_table

DOC = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()


def test_every_kueue_field_has_a_row() -> None:
    rows = {(r.kind, r.path): r for r in field_rows()}
    missing = []
    for kind, paths in KUEUE_V1BETA2_FIELDS.items():
        if (kind, "*") in rows:
            continue
        for path in paths:
            if (kind, path) in rows:
                continue
            # A refused field is refused whole, and an accepted one may keep free-form
            # content: their own fields need no row.
            ancestors = [path[:i].removesuffix("[]") for i, ch in enumerate(path) if ch == "."]
            if any(
                (row := rows.get((kind, a)))
                and row.verdict in ("refused", "accepted, not acted on")
                for a in ancestors
            ):
                continue
            missing.append(f"{kind} {path}")
    assert not missing, (
        "Kueue fields with no row in the field table (add them to the models, or say in"
        f" phalanx.api.fieldtable what Phalanx does instead): {missing}"
    )


def test_the_refused_rows_give_the_message_the_api_server_gives() -> None:
    refused = [r for r in field_rows() if r.verdict == "refused"]
    assert refused
    for row in refused:
        field = row.path.rsplit(".", 1)[-1]
        assert row.note.startswith(f"{field} (") and "does not implement" in row.note


def test_docs_carry_the_generated_table() -> None:
    assert render_table() in DOC, (
        "docs/api.md's field table is stale: paste `python -m phalanx.api.fieldtable`"
    )


def test_status_fields_kueue_tools_write_are_accepted() -> None:
    """Kueue's performance runner patches accumulatedPastExecutionTimeSeconds; the API server
    refused it ("field not declared in schema") and so did ``phalanx validate``."""
    from phalanx.api import parse_object

    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": 1, "template": {}}]},
        "status": {
            "accumulatedPastExecutionTimeSeconds": 42,
            "schedulingStats": {
                "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]
            },
            "clusterName": "worker-1",
        },
    }
    parsed = parse_object(workload)
    assert parsed.status is not None  # type: ignore[attr-defined]
    assert parsed.status.accumulated_past_execution_time_seconds == 42  # type: ignore[attr-defined]
