"""The image of manifests/operator/Dockerfile builds with a daemonless builder (buildah, chroot
isolation, vfs storage: no container engine, no user namespaces needed) and its entrypoint
runs as the manifests run it: user 10001 on a read-only root with /tmp writable, first
``phalanx operator --help``, then against the local control plane (ready, webhooks registered
with the manifests' settings, a clean exit).

Part of ``make test`` wherever buildah and debootstrap are installed (``.ci/run`` installs
them: ``apt-get install -y buildah debootstrap``); about 4 minutes on the 2-core machine (a
Debian base made with debootstrap, about 1.5 min the first time, cached by buildah
afterwards; the image about 1.5 min). ``PHALANX_IMAGE_TEST=0`` leaves it out of a local run
(docs/install.md, "The image"). The base is made from Debian's packages because container
registries cannot be reached from the development machines; the Dockerfile's default base is
the pinned python image of Docker Hub.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_fixtures import *  # noqa: F403  (the kueue_crds fixture)
from operator_fixtures import free_port, wait_for

from phalanx.devcluster.handle import ClusterHandle

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("PHALANX_IMAGE_TEST") == "0",
        reason="PHALANX_IMAGE_TEST=0 leaves the image build (~4 min) out",
    ),
    pytest.mark.skipif(
        not (shutil.which("buildah") and shutil.which("debootstrap"))
        and os.environ.get("CI") != "true",
        reason="needs buildah and debootstrap (apt-get install -y buildah debootstrap; "
        ".ci/run installs them)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
BASE = "localhost/phalanx-base:bookworm"
IMAGE = "localhost/phalanx:test"
MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PATH = "/opt/phalanx/bin:/usr/bin:/bin"


def buildah(*args: str, timeout: float = 900) -> str:
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot", "STORAGE_DRIVER": "vfs"}
    proc = subprocess.run(
        ["buildah", "--storage-driver", "vfs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, f"buildah {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip()


def _ensure_base() -> None:
    """A Debian bookworm root with python3.11 and venv, as ``FROM scratch`` + debootstrap."""
    if subprocess.run(["buildah", "--storage-driver", "vfs", "inspect", BASE]).returncode == 0:
        return
    container = buildah("from", "scratch")
    try:
        root = buildah("mount", container)
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv",
                "bookworm",
                root,
                MIRROR,
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (Path(root) / cache).glob("*"):
                if path.is_file():
                    path.unlink()
        buildah("config", "--env", "PATH=/usr/local/bin:/usr/bin:/bin", container)
        buildah("commit", container, BASE)
    finally:
        buildah("rm", container)


@pytest.fixture(scope="module")
def image() -> str:
    _ensure_base()
    args = ["build", "--isolation", "chroot", "--build-arg", f"PYTHON_IMAGE={BASE}"]
    if CA_BUNDLE.exists():  # this network re-signs TLS: pip in the build needs its CA
        args += ["--secret", f"id=pip-ca,src={CA_BUNDLE}"]
    buildah(*args, "-f", "manifests/operator/Dockerfile", "-t", IMAGE, str(REPO))
    return IMAGE


@pytest.fixture(scope="module")
def root(image: str) -> Iterator[Path]:
    """The image's filesystem mounted read-only with a tmpfs on /tmp, as the manifests'
    securityContext and emptyDir give it."""
    container = buildah("from", image)
    mounted = Path(buildah("mount", container))
    read_only = Path(tempfile.mkdtemp(prefix="phalanx-image-"))
    steps = [
        ["mount", "--bind", str(mounted), str(read_only)],
        ["mount", "-o", "remount,ro,bind", str(read_only)],
        ["mount", "-t", "tmpfs", "tmpfs", str(read_only / "tmp")],
    ]
    done = 0
    try:
        for step in steps:
            subprocess.run(step, check=True)
            done += 1
        yield read_only
    finally:
        if done >= 3:
            subprocess.run(["umount", str(read_only / "tmp")], check=False)
        if done >= 1:
            subprocess.run(["umount", str(read_only)], check=False)
        read_only.rmdir()
        buildah("rm", container)


def _config(image: str) -> dict[str, object]:
    return dict(json.loads(buildah("inspect", image))["OCIv1"]["config"])


def _as_the_pod(root: Path, *argv: str) -> list[str]:
    """``argv`` run in the image as user 10001 with the image's environment."""
    return [
        "chroot",
        "--userspec=10001:10001",
        str(root),
        "/usr/bin/env",
        "-i",
        f"PATH={PATH}",
        "HOME=/tmp",
        "PYTHONDONTWRITEBYTECODE=1",
        *argv,
    ]


def test_the_image_runs_as_10001_with_the_phalanx_entrypoint(image: str, root: Path) -> None:
    config = _config(image)
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["phalanx"]
    assert f"PATH={PATH.split(':')[0]}" in " ".join(str(e) for e in config["Env"])  # type: ignore[union-attr]
    help_text = subprocess.run(
        _as_the_pod(root, "phalanx", "operator", "--help"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--webhook-timeout-seconds" in help_text and "--metrics-secure" in help_text


def test_the_image_runs_the_operator_on_the_local_control_plane(
    cluster: ClusterHandle, kueue_crds: Path, root: Path
) -> None:
    shutil.copy(cluster.kubeconfig, root / "tmp" / "kubeconfig")
    os.chmod(root / "tmp" / "kubeconfig", 0o644)
    health = free_port()
    log = root / "tmp" / "operator.log"
    argv = _as_the_pod(
        root,
        "phalanx",
        "operator",
        "--kubeconfig=/tmp/kubeconfig",
        "--no-leader-elect",
        f"--webhook-port={free_port()}",
        "--webhook-cert-dir=/tmp/certs",
        "--metrics-port=0",
        f"--health-probe-port={health}",
        "--health-probe-listen=127.0.0.1",
    )
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _ready(health):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        webhooks = wait_for(
            "the operator's webhooks",
            lambda: _webhooks(cluster),
            timeout=60,
            log=lambda: log.read_text(errors="replace")[-3000:],
        )
        for webhook in webhooks:
            assert webhook["timeoutSeconds"] == 10
            assert webhook["failurePolicy"] == "Fail"
            expression = webhook["namespaceSelector"]["matchExpressions"][0]
            assert expression["values"] == ["kube-system"]  # beside the cluster: no namespace
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, log.read_text(errors="replace")[-3000:]


def _webhooks(cluster: ClusterHandle) -> list[dict[str, object]]:
    proc = cluster.kubectl(
        "get", "mutatingwebhookconfiguration", "phalanx.kueue.x-k8s.io", "-o", "json"
    )
    return list(json.loads(proc.stdout).get("webhooks") or []) if proc.returncode == 0 else []


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
