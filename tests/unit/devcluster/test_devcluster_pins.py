"""The binary cache is keyed by the pins: a changed go.mod selects another folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from phalanx.devcluster import pins

REPO = Path(__file__).resolve().parents[3]


def _copy_modules(dest: Path) -> Path:
    for sub in ("k8s", "kwok"):
        shutil.copytree(REPO / "devcluster" / sub, dest / "devcluster" / sub)
    return dest


def test_devcluster_staging_version_follows_the_kubernetes_pin() -> None:
    assert pins.staging_version("v1.35.4") == "v0.35.4"
    assert pins.STAGING_VERSION == "v0.35.4"
    with pytest.raises(pins.PinsError, match=r"v1\.X\.Y"):
        pins.staging_version("v2.0.0")


def test_devcluster_cache_key_changes_with_gomod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    root = _copy_modules(tmp_path / "repo")
    before = pins.binary_cache(root)
    assert before.bin_dir.parent.parent == tmp_path / "cache"
    assert before.key.startswith("k8s-v1.35.4-kwok-v0.8.0-")
    assert pins.binary_cache(root) == before  # stable for unchanged content
    gosum = root / "devcluster" / "kwok" / "go.sum"
    gosum.write_text(gosum.read_text() + "\n")
    assert pins.binary_cache(root).key != before.key


def test_devcluster_missing_lists_binaries_not_yet_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    cache = pins.binary_cache(_copy_modules(tmp_path / "repo"))
    assert cache.missing() == pins.ALL_BINARIES
    cache.bin_dir.mkdir(parents=True)
    kubectl = cache.path("kubectl")
    kubectl.write_text("#!/bin/sh\n")
    assert "kubectl" in cache.missing()  # not executable yet
    kubectl.chmod(0o755)
    assert "kubectl" not in cache.missing()


def test_devcluster_missing_checkout_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(pins.PinsError, match=r"devcluster/k8s/go\.mod is missing"):
        pins.pins_hash(tmp_path)
