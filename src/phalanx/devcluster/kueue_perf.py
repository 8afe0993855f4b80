"""Kueue's own scheduler-performance harness, built from its pinned Go module.

``devcluster/kueue-perf/go.mod`` requires ``sigs.k8s.io/kueue`` at :data:`KUEUE_VERSION`; its
``tools.go`` names the two programs of ``test/performance/scheduler`` that ``phalanx bench
compare`` runs: the runner (generates the scenario, plays the Workloads, records time to
admission) and minimalkueue (Kueue's core controllers and scheduler only). They are built
through the module proxy, once, into a cache folder keyed like an addon's (version and a hash of
that go.mod/go.sum), beside a copy of Kueue's CRDs (``config/components/crd/bases``), which the
runner installs into the envtest API server it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phalanx.devcluster import addons, build, pins
from phalanx.devcluster.locks import file_lock

__all__ = ["KUEUE_MODULE", "KUEUE_VERSION", "KueuePerfCache", "ensure_built", "perf_cache"]

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.19.2"
GOMOD_DIR = "devcluster/kueue-perf"
_PACKAGE = f"{KUEUE_MODULE}/test/performance/scheduler"
BINARIES = {
    "performance-scheduler-runner": f"{_PACKAGE}/runner",
    "minimalkueue": f"{_PACKAGE}/minimalkueue",
}
"""Binary name (as Kueue's Makefile names it) -> Go package."""
_CRD_FOLDER = "config/components/crd/bases"


@dataclass(frozen=True)
class KueuePerfCache:
    folder: Path

    @property
    def runner(self) -> Path:
        return self.folder / "bin" / "performance-scheduler-runner"

    @property
    def minimalkueue(self) -> Path:
        return self.folder / "bin" / "minimalkueue"

    @property
    def crd_dir(self) -> Path:
        return self.folder / "crds"

    def complete(self) -> bool:
        return (
            self.runner.is_file()
            and self.minimalkueue.is_file()
            and any(self.crd_dir.glob("*.yaml"))
        )


def perf_cache(root: Path | None = None) -> KueuePerfCache:
    cache = addons.module_cache("kueue-perf", KUEUE_VERSION, gomod_dir=GOMOD_DIR, root=root)
    return KueuePerfCache(folder=cache.folder)


def ensure_built(
    *, root: Path | None = None, progress: build.Progress = build._stderr_progress
) -> KueuePerfCache:
    """Build the runner and minimalkueue and copy Kueue's CRDs into the cache, unless there."""
    root = root or pins.repo_root()
    cache = perf_cache(root)
    if cache.complete():
        return cache
    cache.folder.mkdir(parents=True, exist_ok=True)
    with file_lock(
        cache.folder / "build.lock",
        on_wait=lambda: progress(f"waiting for another build into {cache.folder}"),
    ):
        if cache.complete():
            return cache
        go = build.find_go(progress=progress)
        module_dir = root / GOMOD_DIR
        outputs = {"performance-scheduler-runner": cache.runner, "minimalkueue": cache.minimalkueue}
        for index, (name, package) in enumerate(BINARIES.items(), start=1):
            out = outputs[name]
            if out.is_file():
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            progress(
                f"building {package}@{KUEUE_VERSION} into {out.parent}; a first build compiles"
                " client-go, controller-runtime and envtest: minutes"
            )
            build.build_one(
                go=go,
                root=root,
                name=name,
                out=out,
                progress=progress,
                label=f"[kueue-perf {index}/{len(BINARIES)}]",
                package=package,
                module_dir=module_dir,
            )
        addons.copy_module_files(
            go=go,
            module=KUEUE_MODULE,
            version=KUEUE_VERSION,
            module_dir=module_dir,
            folder=_CRD_FOLDER,
            glob="*.yaml",
            into=cache.crd_dir,
        )
    return cache
