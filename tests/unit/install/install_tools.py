"""kubectl (kustomize) and helm for the install tests, built into ~/.cache/phalanx if missing:
kubectl with the local control plane's binaries, helm from its Go module."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster.build import ensure_binaries
from phalanx.devcluster.helm import ensure_helm

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = REPO / "manifests"
CHART = REPO / "charts" / "phalanx"
COMPONENTS = ("servicemonitor", "networkpolicy", "cert-manager")


def kubectl() -> Path:
    return ensure_binaries().path("kubectl")


def helm() -> Path:
    return ensure_helm()


def run(*cmd: str | Path, cwd: Path = REPO) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stderr}"
    return proc.stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(folder: Path, *, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of ``folder`` with some of manifests/components added (through a
    scratch kustomization naming them by relative paths: kustomize refuses absolute ones)."""
    if not components:
        return objects(run(kubectl(), "kustomize", folder))
    scratch = Path(tempfile.mkdtemp(prefix="phalanx-kustomize-"))
    try:
        up = os.path.relpath(folder, scratch)
        parts = [os.path.relpath(MANIFESTS / "components" / c, scratch) for c in components]
        (scratch / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [up], "components": parts})
        )
        return objects(run(kubectl(), "kustomize", scratch))
    finally:
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


def helm_template(*values: str, namespace: str = "phalanx-system") -> list[dict[str, Any]]:
    args = [helm(), "template", "phalanx", CHART, "--namespace", namespace, "--include-crds"]
    for value in values:
        args += ["--set", value]
    return objects(run(*args))
