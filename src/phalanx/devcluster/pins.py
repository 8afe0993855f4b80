"""The pinned releases of the local control plane, and where their binaries are cached.

One Kubernetes release is pinned (``k8s.io/kubernetes``); its staging modules are the matching
``v0.X.Y`` releases, derived rather than written down twice. The cache folder's name carries a
short hash of the Go modules' go.mod/go.sum (and etcd's main), so editing a pin selects a new
folder and therefore a rebuild, while an unchanged checkout reuses what is there.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.35.4"
KWOK_VERSION = "v0.8.0"

# The binaries the control plane needs, in the order they are built.
K8S_BINARIES = ("kubectl", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
KWOK_BINARIES = ("kwok",)
ALL_BINARIES = K8S_BINARIES + KWOK_BINARIES

# Go package path for each binary, relative to the Go module that builds it.
BINARY_PACKAGES = {
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "./etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
}

# Files whose content defines what gets built; their hash is part of the cache key.
_KEY_FILES = (
    "devcluster/k8s/go.mod",
    "devcluster/k8s/go.sum",
    "devcluster/k8s/etcd/main.go",
    "devcluster/kwok/go.mod",
    "devcluster/kwok/go.sum",
)


class PinsError(RuntimeError):
    """The repository layout the devcluster needs is not where it should be."""


def staging_version(kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """``v1.35.4`` -> ``v0.35.4``: staging modules are released as v0.<minor>.<patch>."""
    major, _, rest = kubernetes_version.lstrip("v").partition(".")
    if major != "1" or not rest:
        raise PinsError(f"kubernetes version {kubernetes_version!r} is not of the form v1.X.Y")
    return f"v0.{rest}"


STAGING_VERSION = staging_version()


def repo_root() -> Path:
    """The Phalanx checkout holding ``devcluster/``.

    The devcluster builds from the repository's Go modules, so it needs a checkout: found from
    ``PHALANX_REPO``, else upwards from this file (editable install), else upwards from the cwd.
    """
    env = os.environ.get("PHALANX_REPO")
    candidates = [Path(env)] if env else []
    candidates += [*Path(__file__).resolve().parents, Path.cwd(), *Path.cwd().parents]
    for candidate in candidates:
        if (candidate / "devcluster" / "k8s" / "go.mod").is_file():
            return candidate
    raise PinsError(
        "cannot find devcluster/k8s/go.mod: run from a Phalanx checkout or set PHALANX_REPO"
    )


def cache_root() -> Path:
    """``$PHALANX_CACHE``, else ``~/.cache/phalanx``."""
    env = os.environ.get("PHALANX_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "phalanx"


def pins_hash(root: Path) -> str:
    """Short hash of the files that decide what gets built."""
    digest = hashlib.sha256()
    for rel in _KEY_FILES:
        path = root / rel
        if not path.is_file():
            raise PinsError(f"{rel} is missing from the checkout at {root}")
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:10]


@dataclass(frozen=True)
class BinaryCache:
    """Where one pinned set of binaries lives."""

    key: str
    bin_dir: Path

    def path(self, name: str) -> Path:
        return self.bin_dir / name

    def missing(self) -> tuple[str, ...]:
        return tuple(name for name in ALL_BINARIES if not os.access(self.path(name), os.X_OK))


def binary_cache(root: Path | None = None) -> BinaryCache:
    """The cache folder for the pins of the checkout at ``root`` (default: this checkout)."""
    root = root or repo_root()
    key = f"k8s-{KUBERNETES_VERSION}-kwok-{KWOK_VERSION}-{pins_hash(root)}"
    return BinaryCache(key=key, bin_dir=cache_root() / key / "bin")
