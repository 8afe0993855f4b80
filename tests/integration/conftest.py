"""Integration tests run against the real local control plane (``phalanx devcluster``).

The session fixture ``cluster`` builds the binaries if they are missing (minutes on a clean
machine: progress is printed past pytest's capture so a CI log shows it moving), starts the
cluster or reuses a healthy one, and yields a handle with the kubeconfig and a kubectl helper.
A cluster that cannot start fails every test that needs it, with each component's log tail;
nothing is skipped.

Teardown: ``PHALANX_TEST_DOWN=1`` stops the cluster at the end of the session, ``=0`` keeps it.
Unset, the cluster is stopped in CI (``CI`` set) and when this session started it from an
empty state folder, and kept when the session reused one a developer had running.
``PHALANX_TEST_STATE_DIR`` selects the state folder (default: the devcluster's default).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The fault suite's cluster fixture is defined once, here: imported into each test module it
# would be a separate session fixture per module, and the second would wait forever on the
# lock the first holds until the session ends.
from faults_support import fault_cluster  # noqa: F401

from phalanx.devcluster import cluster as devcluster
from phalanx.devcluster.handle import ClusterHandle

_TRUE = {"1", "true", "yes", "on"}


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.strip().lower() in _TRUE


@contextlib.contextmanager
def _uncaptured(request: pytest.FixtureRequest) -> Iterator[None]:
    """Let build/start progress reach the terminal (and the CI log) as it happens."""
    capman: Any = request.config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


def state_dir_for_tests() -> Path:
    env = os.environ.get("PHALANX_TEST_STATE_DIR")
    return Path(env) if env else devcluster.default_state_dir()


@pytest.fixture(scope="session", autouse=True)
def _session_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every operator a test starts records its history in this session's own store (the
    operator's default is one file in the user's home, shared by every run): an explicit
    ``$PHALANX_STORE`` or a test's own ``--store`` still wins."""
    if os.environ.get("PHALANX_STORE"):
        yield
        return
    path = tmp_path_factory.mktemp("store") / "store.db"
    os.environ["PHALANX_STORE"] = f"sqlite:///{path}"
    try:
        yield
    finally:
        os.environ.pop("PHALANX_STORE", None)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[ClusterHandle]:
    state_dir = state_dir_for_tests()
    fresh = not (state_dir / "state.json").exists()
    down_flag = _env_flag("PHALANX_TEST_DOWN")
    tear_down = down_flag if down_flag is not None else bool(_env_flag("CI")) or fresh
    try:
        with _uncaptured(request):
            status = devcluster.up(state_dir=state_dir)
    except Exception as exc:
        pytest.fail(
            f"the devcluster could not start ({type(exc).__name__}): {exc}\n\n"
            + devcluster.log_tails(state_dir),
            pytrace=False,
        )
    if not status.healthy or status.server is None:
        pytest.fail(
            f"the devcluster is not healthy: {status}\n\n" + devcluster.log_tails(state_dir),
            pytrace=False,
        )
    yield ClusterHandle.from_status(status)
    if tear_down:
        with _uncaptured(request):
            sys.stderr.write(f"\n[devcluster] stopping the test cluster in {state_dir}\n")
            devcluster.down(state_dir=state_dir)


@pytest.fixture(scope="session")
def kube_api_client(cluster: ClusterHandle) -> Iterator[Any]:
    """A ``kubernetes`` python client ApiClient authenticated as the cluster admin."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(cluster: ClusterHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    base = request.node.name.lower().replace("_", "-")
    name = "t-" + "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true")
    cluster.kubectl_ok("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")
