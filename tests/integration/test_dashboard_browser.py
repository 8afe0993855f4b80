"""The dashboard in a real headless Chromium against the local control plane, served by the
operator (``--dashboard-port``): counts and the topology map change without a reload when
Jobs are submitted; a pending Workload's page gives its reason; a user without rights on a
namespace does not see its Workloads; the usage view shows a LocalQueue's GPU-hours from the
operator's usage history store (its ``--store``) and its decayed usage under admission fair
sharing, and a user sees only its own namespace's series; a burst of Workloads keeps the page
live (the figures are printed and written to the test's folder; ``PHALANX_DASHBOARD_BURST``
sets its size).

Debian's ``chromium`` driven by Playwright (``executable_path=/usr/bin/chromium``; the
``dev`` extra installs playwright, ``.ci/run`` installs chromium). Without them the module is
skipped, except under CI (``CI=true``), where it fails. ``PHALANX_UPDATE_SCREENSHOTS=1``
writes the screenshots of docs/dashboard.md into docs/img/; otherwise nothing in the
repository is written.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from incluster_support import host_address
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    RACK,
    REPO,
    OperatorProcess,
    apply,
    cluster_queue,
    delete_cluster_objects,
    flavor,
    free_port,
    gpu_job,
    local_queue,
    node_pool,
    start_operator,
    topology,
    wait_for,
)
from visibility_support import routed_visibility

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"
POOL = "phx-dash"
CQ = "phx-dash-cq"
TOPOLOGY = "phx-dash-topology"
SCREENSHOTS = os.environ.get("PHALANX_UPDATE_SCREENSHOTS") == "1"
IMAGES = REPO / "docs" / "img"

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

_missing = [
    what
    for what, present in (
        ("playwright (pip install -e '.[dev]')", sync_playwright is not None),
        (f"chromium at {CHROMIUM} (apt-get install -y chromium)", os.path.exists(CHROMIUM)),
    )
    if not present
]
if _missing and os.environ.get("CI") == "true":
    raise RuntimeError(f"the dashboard browser test needs {', '.join(_missing)} under CI")
if _missing:
    pytest.skip(f"needs {', '.join(_missing)}", allow_module_level=True)


@pytest.fixture(scope="module")
def dashboard(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The operator serving the dashboard and the visibility API (routed through the API
    server, where the dashboard reads positions), and a pool of 2 racks x 4 nodes x 8 GPUs."""
    port = free_port()
    address = host_address()
    visibility_port = free_port(address)
    workdir = tmp_path_factory.mktemp("operator")
    # Admission fair sharing on (for the ClusterQueues that ask for it), sampled often.
    config = workdir / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "admissionFairSharing": {
                    "usageHalfLifeTime": "1h",
                    "usageSamplingInterval": "2s",
                },
            }
        )
    )
    op: OperatorProcess = start_operator(
        cluster,
        workdir,
        f"--dashboard-port={port}",
        f"--store=sqlite:///{workdir}/store.db",
        f"--config={config}",
        f"--visibility-port={visibility_port}",
        f"--visibility-listen={address}",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the dashboard answering", lambda: _status(url + "/") == 401, log=op.log_tail)
        with (
            routed_visibility(
                cluster,
                address=address,
                port=visibility_port,
                namespace="phx-dash-visibility",
                log=op.log_tail,
            ),
            node_pool(cluster, POOL, racks=2, hosts=4),
        ):
            apply(
                cluster,
                topology(TOPOLOGY),
                flavor(POOL, pool=POOL, topology_name=TOPOLOGY),
                cluster_queue(CQ, flavor_name=POOL, gpus=64, cohort="phx-dash-cohort"),
            )
            try:
                yield url
            finally:
                delete_cluster_objects(
                    cluster,
                    f"clusterqueue.kueue.x-k8s.io/{CQ}",
                    f"resourceflavor.kueue.x-k8s.io/{POOL}",
                    f"topology.kueue.x-k8s.io/{TOPOLOGY}",
                )
    finally:
        op.stop()


def _status(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def _token(cluster: ClusterHandle, namespace: str, account: str, role: dict[str, Any]) -> str:
    """A ServiceAccount's token, bound to ``role`` (a Role in ``namespace`` or a ClusterRole)."""
    cluster.kubectl_ok("create", "serviceaccount", account, "-n", namespace)
    kind = role["kind"]
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding" if kind == "Role" else "ClusterRoleBinding",
        "metadata": {"name": f"{namespace}-{account}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kind,
            "name": role["metadata"]["name"],
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    if kind == "Role":
        binding["metadata"]["namespace"] = namespace
        apply(cluster, role, binding, namespace=namespace)
    else:
        apply(cluster, role, binding)
    return cluster.kubectl_ok("create", "token", account, "-n", namespace).strip()


def _reader_role(name: str, *, cluster_wide: bool) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole" if cluster_wide else "Role",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["kueue.x-k8s.io"],
                "resources": ["workloads", "localqueues", "clusterqueues"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }


def _browser() -> Any:
    assert sync_playwright is not None
    manager = sync_playwright().start()
    browser = manager.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
    )
    return manager, browser


def _shot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / name), full_page=True)


def _count(page: Page, which: str) -> int:
    return int(page.locator(f'[data-count="{which}"] b').inner_text())


def _poll(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_live_counts_topology_and_pending_reason(
    cluster: ClusterHandle, dashboard: str, namespace: str
) -> None:
    admin = _token(
        cluster, namespace, "dash-admin", _reader_role("phx-dash-reader", cluster_wide=True)
    )
    apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=namespace)
    manager, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{dashboard}/?token={admin}")
        assert "token=" not in page.url, "the token stays in the address bar"
        page.wait_for_selector('[data-count="admitted"]')
        admitted_before = _count(page, "admitted")
        loads = page.evaluate("performance.getEntriesByType('navigation').length")

        # A gang of 4 x 8 GPUs in one rack: admitted, and its nodes fill on the map.
        apply(
            cluster, gpu_job("gang", queue="lq", pods=4, gpus=8, required=RACK), namespace=namespace
        )
        _poll("the admitted count to rise", lambda: _count(page, "admitted") > admitted_before)
        # The ClusterQueue's own count (its status, written by the operator) follows.
        admitted_cell = page.locator(f'tr[data-cq="{CQ}"] td[data-field="admitted"]')
        _poll("the ClusterQueue's admitted count", lambda: admitted_cell.inner_text() == "1")
        _shot(page, "dashboard-overview.png")

        page.evaluate("location.hash = 'topology'")
        gang_nodes = page.locator(f'.node[data-gangs*="{namespace}/"]')
        _poll("the gang's 4 nodes on the map", lambda: gang_nodes.count() == 4)
        for i in range(4):
            assert gang_nodes.nth(i).get_attribute("data-used") == "8"
        racks = {
            gang_nodes.nth(i).evaluate("n => n.closest('.rack').dataset.group") for i in range(4)
        }
        assert len(racks) == 1, f"the gang is drawn across racks {racks}"
        gang_name = gang_nodes.first.get_attribute("data-gangs")
        page.select_option("#gang", label=gang_name)
        _poll("its nodes highlighted", lambda: page.locator(".node.selected").count() == 4)
        _shot(page, "dashboard-topology.png")

        # 8 pods of 8 GPUs in one rack: no rack of 4 nodes holds it; it waits, and says why.
        apply(
            cluster, gpu_job("big", queue="lq", pods=8, gpus=8, required=RACK), namespace=namespace
        )
        page.evaluate("location.hash = 'pending'")
        row = page.locator(f'tr[data-wl^="{namespace}/"]')
        _poll("the big job pending", lambda: row.count() == 1)
        reason = _poll("its reason", lambda: row.first.locator("td.reason").inner_text().strip())
        assert "rack" in reason or "topology" in reason or "nvidia.com/gpu" in reason, reason
        # Its position is the visibility API's.
        listed = json.loads(
            cluster.kubectl_ok("get", "--raw", f"{VISIBILITY}/clusterqueues/{CQ}/pendingworkloads")
        )["items"]
        name = row.first.get_attribute("data-wl").split("/", 1)[1]
        position = next(
            str(i["positionInClusterQueue"]) for i in listed if i["metadata"]["name"] == name
        )
        _poll(
            f"the position {position} on the page",
            lambda: row.first.locator("td").first.inner_text() == position,
        )
        assert not page.locator("#pending p.muted").filter(has_text="positions").count()
        _shot(page, "dashboard-pending.png")
        row.first.locator("a.wl").click()
        page.wait_for_selector("#wl-reason")
        assert page.locator("#wl-state").inner_text() == "PENDING"
        assert page.locator("tr", has_text="position").locator("td").inner_text() == position
        assert page.locator("#wl-reason").inner_text().strip() == reason
        assert "created" in page.locator(".timeline").inner_text()
        _shot(page, "dashboard-workload.png")

        # Everything above arrived over the event stream: the page was never reloaded.
        assert page.evaluate("performance.getEntriesByType('navigation').length") == loads
        assert page.evaluate("window.phalanxUpdates.length") >= 2
    finally:
        browser.close()
        manager.stop()


def test_a_user_sees_only_the_namespaces_it_may_read(
    cluster: ClusterHandle, dashboard: str, namespace: str
) -> None:
    other = f"{namespace}-other"[:63]
    cluster.kubectl("delete", "namespace", other, "--ignore-not-found", "--wait=true")
    cluster.kubectl_ok("create", "namespace", other)
    try:
        for ns in (namespace, other):
            apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=ns)
            apply(
                cluster,
                gpu_job("hidden-or-not", queue="lq", pods=8, gpus=8, required=RACK),
                namespace=ns,
            )
        user = _token(cluster, other, "dash-user", _reader_role("dash-reader", cluster_wide=False))
        assert _status(f"{dashboard}/api/view") == 401
        assert _status(f"{dashboard}/api/view", "not-a-token") == 401

        def view() -> dict[str, Any]:
            request = urllib.request.Request(f"{dashboard}/api/view")
            request.add_header("Authorization", f"Bearer {user}")
            with urllib.request.urlopen(request, timeout=10) as response:
                return dict(json.loads(response.read()))

        seen = _poll(
            "the user's own pending Workload",
            lambda: (v := view())["pending"]["rows"] and v,
        )
        assert {r["namespace"] for r in seen["pending"]["rows"]} == {other}
        assert {q["namespace"] for q in seen["localQueues"]} == {other}
        assert seen["clusterQueues"] is None and seen["topology"] is None
        hidden = next(
            w["metadata"]["name"]
            for w in json.loads(
                cluster.kubectl_ok("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json")
            )["items"]
        )
        assert _status(f"{dashboard}/api/workloads/{namespace}/{hidden}", user) == 404

        manager, browser = _browser()
        try:
            page = browser.new_page()
            page.goto(f"{dashboard}/?token={user}#pending")
            page.wait_for_selector(f'tr[data-wl^="{other}/"]')
            assert page.locator(f'tr[data-wl^="{namespace}/"]').count() == 0
            page.evaluate("location.hash = 'overview'")
            page.wait_for_selector("#cohorts")
            assert "may not list ClusterQueues" in page.locator("#cohorts").inner_text()
            assert page.locator(f'tr[data-lq="{namespace}/lq"]').count() == 0
            assert page.locator(f'tr[data-lq="{other}/lq"]').count() == 1
        finally:
            browser.close()
            manager.stop()
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false")


def test_usage_over_time_and_fair_share_from_the_store(
    cluster: ClusterHandle, dashboard: str, namespace: str
) -> None:
    """Jobs run in two namespaces' LocalQueues of a ClusterQueue with admission fair sharing:
    the usage chart shows this namespace's LocalQueue non-zero (the store read again, the page
    not reloaded) and the fair-share view its decayed usage; a user of the other namespace
    sees only its own series."""
    other = f"{namespace}-use"[:63]
    afs = "phx-dash-afs"
    cluster.kubectl("delete", "namespace", other, "--ignore-not-found", "--wait=true")
    cluster.kubectl_ok("create", "namespace", other)
    queue = cluster_queue(afs, flavor_name=POOL, gpus=8)
    queue["spec"]["admissionScope"] = {"admissionMode": "UsageBasedAdmissionFairSharing"}
    apply(cluster, queue)
    admin = _token(
        cluster, namespace, "dash-usage", _reader_role("phx-dash-reader", cluster_wide=True)
    )
    try:
        for ns, gpus in ((namespace, 2), (other, 1)):
            apply(cluster, local_queue("team", cluster_queue_name=afs), namespace=ns)
            apply(cluster, gpu_job("used", queue="team", gpus=gpus), namespace=ns)
        user = _token(cluster, other, "dash-user", _reader_role("dash-reader", cluster_wide=False))
        manager, browser = _browser()
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{dashboard}/?token={admin}#usage")
            page.wait_for_selector("#usage-refresh")
            loads = page.evaluate("performance.getEntriesByType('navigation').length")
            mine = page.locator(f'tr[data-usage-group="{namespace}/team"]')

            def charted() -> bool:
                if mine.count() and float(mine.get_attribute("data-total") or 0) > 0:
                    return True
                page.click("#usage-refresh")  # the store is read again once the cache expires
                time.sleep(2)
                return False

            _poll("the LocalQueue's GPU-hours in the usage chart", charted, timeout=120)
            assert page.locator("#usage-chart rect").count() >= 1
            assert page.locator(f'tr[data-usage-group="{other}/team"]').count() == 1
            # The fair-share view: the operator's sampled decayed usage, pushed live.
            decayed = page.locator(f'tr[data-fair="{namespace}/team"] td:nth-child(4)')
            _poll(
                "its decayed usage in the fair-share view",
                lambda: decayed.count() == 1 and float(decayed.inner_text()) > 0,
                timeout=90,
            )
            assert page.locator(f'tr[data-fair="{other}/team"]').count() == 1
            _shot(page, "dashboard-usage.png")
            assert page.evaluate("performance.getEntriesByType('navigation').length") == loads

            # The other namespace's user: its own series only, and no ClusterQueue series.
            def usage_as_user(by: str) -> dict[str, Any]:
                request = urllib.request.Request(f"{dashboard}/api/usage?window=24h&by={by}")
                request.add_header("Authorization", f"Bearer {user}")
                with urllib.request.urlopen(request, timeout=30) as response:
                    return dict(json.loads(response.read()))

            seen = _poll(
                "the user's own series",
                lambda: (u := usage_as_user("localqueue"))["series"] and u,
                timeout=90,
            )
            assert [s["group"] for s in seen["series"]] == [f"{other}/team"]
            assert [s["group"] for s in usage_as_user("namespace")["series"]] == [other]
            assert usage_as_user("clusterqueue")["series"] == []
            theirs = browser.new_page()
            theirs.goto(f"{dashboard}/?token={user}#usage")
            theirs.wait_for_selector(f'tr[data-usage-group="{other}/team"]')
            assert theirs.locator(f'tr[data-usage-group^="{namespace}/"]').count() == 0
            theirs.wait_for_selector(f'tr[data-fair="{other}/team"]')
            assert theirs.locator(f'tr[data-fair^="{namespace}/"]').count() == 0
        finally:
            browser.close()
            manager.stop()
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false")
        cluster.kubectl("delete", "clusterqueue", afs, "--wait=false")


def _workload(name: str, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "c",
                                    "image": "example.invalid/x",
                                    "resources": {"requests": {"nvidia.com/gpu": "8"}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def test_a_burst_keeps_the_page_live(
    cluster: ClusterHandle, dashboard: str, namespace: str, tmp_path: Path
) -> None:
    """The figures (first paint before and after, largest gap between updates during the
    burst) are printed
    and kept in the test's folder; no timing is asserted (a shared machine), only that the
    page followed the burst to its end without a reload."""
    size = int(os.environ.get("PHALANX_DASHBOARD_BURST", "2000"))
    admin = _token(
        cluster, namespace, "dash-burst", _reader_role("phx-dash-reader", cluster_wide=True)
    )
    # A queue with no quota: every Workload of the burst stays pending (the cheapest case for
    # the operator, the largest pending list for the dashboard).
    apply(cluster, cluster_queue("phx-dash-burst", flavor_name=POOL, gpus=0))
    apply(cluster, local_queue("burst", cluster_queue_name="phx-dash-burst"), namespace=namespace)
    manager, browser = _browser()
    try:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.goto(f"{dashboard}/?token={admin}#pending")
        page.wait_for_selector("#pending")
        first_paint = page.evaluate(
            "performance.getEntriesByName('phalanx-first-render')[0].startTime"
        )
        # The search box narrows the list to this test's namespace (other tests' Workloads
        # may still be going away), on the server: the page keeps its connection live.
        page.fill("#search", f"{namespace}/")
        _poll("the filtered list", lambda: page.locator("#matched").inner_text() == "0 pending")
        page.evaluate("window.phalanxUpdates = []")
        started = time.monotonic()
        items = [_workload(f"burst-{i:05d}", "burst") for i in range(size)]
        for chunk in range(0, size, 500):
            body = {"apiVersion": "v1", "kind": "List", "items": items[chunk : chunk + 500]}
            cluster.kubectl_ok("create", "-n", namespace, "-f", "-", input=json.dumps(body))
        created = time.monotonic() - started
        try:
            _poll(
                f"{size} pending in the filtered list",
                lambda: page.locator("#matched").inner_text() == f"{size} pending",
                timeout=max(120.0, size / 20),
            )
        except AssertionError as error:
            raise AssertionError(
                f"{error}: the page shows {page.locator('#matched').inner_text()!r}, status "
                f"{page.locator('#status').inner_text()!r}, "
                f"{page.evaluate('window.phalanxUpdates.length')} updates"
            ) from error
        updates = page.evaluate("window.phalanxUpdates")
        # A page opened with the whole burst pending: its first paint.
        fresh = context.new_page()  # the same cookie
        fresh.goto(f"{dashboard}/#pending")
        fresh.wait_for_selector("#pending")
        loaded_paint = fresh.evaluate(
            "performance.getEntriesByName('phalanx-first-render')[0].startTime"
        )
        gaps = [b - a for a, b in itertools.pairwise(updates)]
        figures = {
            "workloads": size,
            "create_seconds": round(created, 1),
            "first_paint_ms": round(first_paint),
            "first_paint_with_burst_ms": round(loaded_paint),
            "updates": len(updates),
            "max_gap_ms": round(max(gaps)) if gaps else None,
            "median_gap_ms": round(sorted(gaps)[len(gaps) // 2]) if gaps else None,
        }
        (tmp_path / "figures.json").write_text(json.dumps(figures))
        print(f"\ndashboard burst figures: {json.dumps(figures)}")
        assert len(updates) >= 2, "the page did not follow the burst"
        if size > 500:
            assert "Showing 500 of" in page.locator("#pending").inner_text()
    finally:
        browser.close()
        manager.stop()
        cluster.kubectl("delete", "clusterqueue", "phx-dash-burst", "--wait=false")
