"""Kueue's scheduler-performance harness build: its cache folder is keyed like an addon's (by
devcluster/kueue-perf's go.mod/go.sum), and the checkout pins the version the build names."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.devcluster import addons, kueue_perf, pins


def test_the_cache_folder_is_keyed_by_the_harness_go_mod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    module = tmp_path / "repo" / "devcluster" / "kueue-perf"
    module.mkdir(parents=True)
    (module / "go.mod").write_text("module x\nrequire sigs.k8s.io/kueue v0.19.2\n")
    (module / "go.sum").write_text("a v1 h1:x\n")
    first = kueue_perf.perf_cache(tmp_path / "repo")
    assert first.folder.parent == tmp_path / "cache"
    assert first.folder.name.startswith("kueue-perf-v0.19.2-")
    assert not first.complete()
    (module / "go.sum").write_text("a v2 h1:y\n")
    assert kueue_perf.perf_cache(tmp_path / "repo").folder != first.folder


def test_a_checkout_without_the_harness_module_says_which_file_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(addons.AddonError, match=r"devcluster/kueue-perf/go.mod is missing"):
        kueue_perf.perf_cache(tmp_path / "repo")


def test_the_checkout_pins_kueue_at_the_version_the_build_names() -> None:
    module = pins.repo_root() / "devcluster" / "kueue-perf"
    assert f"sigs.k8s.io/kueue {kueue_perf.KUEUE_VERSION}\n" in (module / "go.mod").read_text()
    tools = (module / "tools.go").read_text()
    for package in kueue_perf.BINARIES.values():
        assert f'"{package}"' in tools
