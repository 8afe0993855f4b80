"""`phalanx validate`: exit codes and the FILE: KIND/NAME: field.path: message lines."""

from __future__ import annotations

import io

import yaml
from api_cases import MANIFESTS, manifest_files, minimal_cq

from phalanx.cli.main import main


def test_api_validate_accepts_valid_files_with_a_one_line_summary(capsys):
    files = [str(p) for p in manifest_files()]
    args = ["validate"] + [arg for f in files for arg in ("-f", f)]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"OK: 9 object(s) in {len(files)} file(s) are valid"]


def test_api_validate_prints_every_error_with_file_kind_name_and_path(tmp_path, capsys):
    bad_cq = minimal_cq(queueingStrategy="FIFO")
    bad_cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = 1
    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"podSets": [{"name": "w", "count": 1, "minCount": 2, "template": {}}]},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([bad_cq, wl]))
    good = MANIFESTS / "topology.yaml"
    assert main(["validate", "-f", str(good), "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"{path}: ClusterQueue/cq: spec.queueingStrategy: must be one of StrictFIFO,"
        " BestEffortFIFO; got 'FIFO'",
        f"{path}: Workload/train: spec.podSets[0].minCount: minCount must not exceed count",
    ]
    assert captured.err.strip() == "2 error(s) in 2 file(s)"


def test_api_validate_reports_the_cross_field_rule_when_the_schema_is_fine(tmp_path, capsys):
    cq = minimal_cq()
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = 1
    path = tmp_path / "cq.yaml"
    path.write_text(yaml.safe_dump(cq))
    assert main(["validate", "-f", str(path)]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        f"{path}: ClusterQueue/cq: spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit:"
        " borrowingLimit requires spec.cohortName"
    )


def test_api_validate_reads_stdin(monkeypatch, capsys):
    text = (MANIFESTS / "cohort.yaml").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["validate", "-f", "-"]) == 0
    assert capsys.readouterr().out.strip() == "OK: 2 object(s) in 1 file(s) are valid"
    monkeypatch.setattr("sys.stdin", io.StringIO("kind: Cohort\n"))
    assert main(["validate", "-f", "-"]) == 1
    assert capsys.readouterr().out.strip() == (
        "<stdin>: Cohort/<document 1>: apiVersion: required field is missing;"
        " use kueue.x-k8s.io/v1beta2"
    )


def test_api_validate_other_kinds_fail_unless_ignored(tmp_path, capsys):
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}
    path = tmp_path / "mixed.yaml"
    path.write_text(
        yaml.safe_dump_all([namespace, yaml.safe_load((MANIFESTS / "topology.yaml").read_text())])
    )
    assert main(["validate", "-f", str(path)]) == 1
    assert "Namespace/ml: apiVersion: 'v1' is not a Kueue object" in capsys.readouterr().out
    assert main(["validate", "--ignore-other-kinds", "-f", str(path)]) == 0
    assert capsys.readouterr().out.strip() == (
        "OK: 1 object(s) in 1 file(s) are valid, 1 other object(s) skipped"
    )


def test_api_validate_missing_file_is_an_error(tmp_path, capsys):
    assert main(["validate", "-f", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml: cannot read:" in capsys.readouterr().out
