"""crds/ in the repository is exactly what `phalanx crds` generates."""

from __future__ import annotations

from pathlib import Path

from phalanx.cli.main import main

REPO_CRDS = Path(__file__).resolve().parents[3] / "crds"


def test_api_crds_folder_matches_the_generator_byte_for_byte(tmp_path, capsys):
    assert main(["crds", "--output", str(tmp_path)]) == 0
    generated = {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir())}
    committed = {p.name: p.read_bytes() for p in sorted(REPO_CRDS.iterdir())}
    assert len(generated) == 10  # the nine kinds and the folder's Kustomization
    stale = sorted(
        name
        for name in generated.keys() | committed.keys()
        if generated.get(name) != committed.get(name)
    )
    assert not stale, (
        f"crds/ has drifted from the API models in {stale}: run `make crds` and commit crds/"
    )
    # The command lists what it wrote, one path per line.
    assert capsys.readouterr().out.split() == [
        *(str(tmp_path / name) for name in generated if name != "Kustomization"),
        str(tmp_path / "Kustomization"),
    ]


def test_api_crds_generation_is_deterministic(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    main(["crds", "--output", str(first)])
    main(["crds", "--output", str(second)])
    for path in first.iterdir():
        assert path.read_bytes() == (second / path.name).read_bytes()


def test_crds_v1beta1_off_writes_the_same_crds_with_v1beta1_not_served(tmp_path):
    import yaml

    served, off = tmp_path / "served", tmp_path / "off"
    assert main(["crds", "--output", str(served)]) == 0
    assert main(["crds", "--output", str(off), "--v1beta1", "off"]) == 0
    for path in sorted(served.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        other = yaml.safe_load((off / path.name).read_text())
        for version in other["spec"]["versions"]:
            assert version["served"] is (version["name"] == "v1beta2"), path.name
            version["served"] = True
        assert other == crd, path.name
