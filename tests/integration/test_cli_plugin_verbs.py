"""The kubectl plugin's verbs on the local control plane, against the running operator: queues and
a flavor created with the plugin admit a Job; stop/resume of a ClusterQueue and of a Workload;
delete workload with its Job; top (a Job's usage while admitted, returned once it finished; the
live view refreshing until Ctrl-C); version; completion."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    POOL_LABEL,
    OperatorProcess,
    apply,
    condition,
    delete_cluster_objects,
    get,
    get_list,
    gpu_job,
    is_true,
    node_pool,
    wait_for,
    workload_of,
)

from phalanx import __version__
from phalanx.cli import top_cmd
from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

PLUGIN = Path(sys.executable).with_name("kubectl-phalanx")
POOL = "phx-plugin"
CQ = "phx-plugin-cq"


def plugin(
    cluster: ClusterHandle, *argv: str, stdin: str = "", expect: int = 0
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(PLUGIN), *argv, f"--kubeconfig={cluster.kubeconfig}"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == expect, f"{argv}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def plugin_queues(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[None]:
    """The flavor and ClusterQueue, created by the plugin, over one 8-GPU KWOK node."""
    with node_pool(cluster, POOL, racks=1, hosts=1):
        try:
            out = plugin(
                cluster, "create", "resourceflavor", POOL,
                f"--node-labels={POOL_LABEL}={POOL}",
                f"--tolerations={POOL_LABEL}={POOL}:NoSchedule",
            ).stdout  # fmt: skip
            assert out == f"resourceflavor.kueue.x-k8s.io/{POOL} created\n"
            out = plugin(
                cluster, "create", "cq", CQ, f"--nominal-quota={POOL}:cpu=8;nvidia.com/gpu=8"
            ).stdout
            assert out == f"clusterqueue.kueue.x-k8s.io/{CQ} created\n"
            yield
        finally:
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{CQ}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )


def _admitted(cluster: ClusterHandle, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return bool(wl and is_true(wl, "Admitted"))


def test_created_queues_admit_and_stop_resume_delete_act_on_them(
    cluster: ClusterHandle,
    phalanx_operator: OperatorProcess,
    plugin_queues: None,
    namespace: str,
) -> None:
    log = phalanx_operator.log_tail
    quota = f"--nominal-quota={POOL}:cpu=8;nvidia.com/gpu=8"
    spec = plugin(cluster, "create", "cq", CQ, quota, "-o", "yaml", "--dry-run=client")
    assert "nominalQuota: '8'" in spec.stdout
    exists = plugin(cluster, "create", "cq", CQ, expect=1)
    assert exists.stderr == f'error: clusterqueues.kueue.x-k8s.io "{CQ}" already exists\n'
    missing = plugin(cluster, "create", "lq", "lq", "-n", namespace, "-c", "nope", expect=1)
    assert missing.stderr == "error: clusterqueue nope not found\n"
    out = plugin(cluster, "create", "localqueue", "lq", "-n", namespace, "-c", CQ).stdout
    assert out == "localqueue.kueue.x-k8s.io/lq created\n"
    assert get(cluster, "localqueues.kueue.x-k8s.io", "lq", namespace)["spec"]["clusterQueue"] == CQ

    # Admitted through the plugin's objects, its pods listed by the plugin.
    apply(cluster, gpu_job("first", queue="lq", gpus=8), namespace=namespace)
    wait_for("first admitted", lambda: _admitted(cluster, namespace, "first"), log=log)
    wl = workload_of(cluster, namespace, "first")
    assert wl is not None
    name = wl["metadata"]["name"]
    pods = wait_for(
        "first's pod in list pods",
        lambda: (
            (t := plugin(cluster, "list", "pods", "-n", namespace, "--for", "job/first").stdout)
            and "first-0-" in t
            and t
        ),
        log=log,
    )
    assert pods.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    by_workload = plugin(cluster, "list", "pods", "-n", namespace, "--for", f"workload/{name}")
    assert by_workload.stdout.splitlines()[1].split()[0] == pods.splitlines()[1].split()[0]
    flavors = plugin(cluster, "list", "rf").stdout
    assert f"{POOL}   {POOL_LABEL}={POOL}" in flavors

    # stop workload: deactivated and evicted, its Job suspended; resume: admitted again.
    out = plugin(cluster, "stop", "workload", name, "-n", namespace).stdout
    assert out == f"workload.kueue.x-k8s.io/{name} stopped\n"
    wait_for(
        "first evicted and suspended",
        lambda: (
            not _admitted(cluster, namespace, "first")
            and get(cluster, "job", "first", namespace)["spec"].get("suspend") is True
        ),
        log=log,
    )
    out = plugin(cluster, "resume", "workload", name, "-n", namespace).stdout
    assert out == f"workload.kueue.x-k8s.io/{name} resumed\n"
    wait_for("first admitted again", lambda: _admitted(cluster, namespace, "first"), log=log)

    # delete workload: asks first ("n" keeps it), --yes deletes its Job and so the Workload.
    kept = plugin(cluster, "delete", "workload", name, "-n", namespace, stdin="n\n")
    assert f"  - jobs.batch/first associated with the {namespace}/{name} workload" in kept.stdout
    assert kept.stdout.endswith("Deletion is canceled\n")
    assert get(cluster, "job", "first", namespace)
    out = plugin(cluster, "delete", "workload", name, "-n", namespace, "--yes").stdout
    assert out == "jobs.batch/first deleted\n"
    wait_for(
        "the Job and its Workload gone",
        lambda: (
            not get_list(cluster, "jobs", namespace)
            and not get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
        ),
        log=log,
    )

    # stop clusterqueue holds new admissions (the Job waits, told why); resume admits it.
    assert plugin(cluster, "stop", "cq", CQ).stdout == f"clusterqueue.kueue.x-k8s.io/{CQ}\n"
    assert get(cluster, "clusterqueues.kueue.x-k8s.io", CQ)["spec"]["stopPolicy"] == "HoldAndDrain"
    apply(cluster, gpu_job("second", queue="lq", gpus=8), namespace=namespace)
    waiting = wait_for(
        "second told the ClusterQueue is stopped",
        lambda: (
            (w := workload_of(cluster, namespace, "second"))
            and (c := condition(w, "QuotaReserved"))
            and "is stopped" in c.get("message", "")
            and w
        ),
        log=log,
    )
    assert not is_true(waiting, "QuotaReserved")
    plugin(cluster, "resume", "cq", CQ)
    assert get(cluster, "clusterqueues.kueue.x-k8s.io", CQ)["spec"]["stopPolicy"] == "None"
    wait_for("second admitted", lambda: _admitted(cluster, namespace, "second"), log=log)

    # The same for a LocalQueue, once second's quota is free again.
    plugin(cluster, "delete", "workload", "--all", "-n", namespace, "--yes")
    out = plugin(cluster, "stop", "lq", "lq", "-n", namespace).stdout
    assert out == "localqueue.kueue.x-k8s.io/lq\n"
    apply(cluster, gpu_job("third", queue="lq", gpus=8), namespace=namespace)
    wait_for(
        "third told the LocalQueue is stopped",
        lambda: (
            (w := workload_of(cluster, namespace, "third"))
            and (c := condition(w, "QuotaReserved"))
            and "LocalQueue lq is stopped" in c.get("message", "")
        ),
        log=log,
    )
    plugin(cluster, "resume", "localqueue", "lq", "-n", namespace)
    wait_for("third admitted", lambda: _admitted(cluster, namespace, "third"), log=log)

    missing = plugin(cluster, "stop", "clusterqueue", "nope", expect=1)
    assert missing.stderr == "error: clusterqueue nope not found\n"
    missing = plugin(cluster, "delete", "workload", "nope", "-n", namespace, "--yes", expect=1)
    assert missing.stderr == "error: workload nope not found\n"


def _top(cluster: ClusterHandle, *argv: str) -> dict[str, Any]:
    return dict(json.loads(plugin(cluster, "top", "--once", "-o", "json", *argv).stdout))


def _cq_in(frame: dict[str, Any]) -> dict[str, Any]:
    return next(q for q in frame["clusterQueues"] if q["name"] == CQ)


def test_top_shows_a_jobs_usage_and_its_return(
    cluster: ClusterHandle,
    phalanx_operator: OperatorProcess,
    plugin_queues: None,
    namespace: str,
) -> None:
    log = phalanx_operator.log_tail
    # An earlier test's Jobs leave with their namespace: start from an idle ClusterQueue.
    wait_for("the ClusterQueue idle", lambda: _cq_in(_top(cluster))["admittedWorkloads"] == 0)
    plugin(cluster, "create", "localqueue", "lq", "-n", namespace, "-c", CQ)
    apply(cluster, gpu_job("topped", queue="lq", gpus=6, run_seconds="30"), namespace=namespace)
    wait_for("topped admitted", lambda: _admitted(cluster, namespace, "topped"), log=log)

    def using(gpus: str, admitted: int) -> dict[str, Any] | None:
        frame = _top(cluster, "--localqueues", "-n", namespace)
        queue = _cq_in(frame)
        usage = {r["resource"]: r for r in queue["resources"]}
        ok = usage["nvidia.com/gpu"]["usage"] == gpus and queue["admittedWorkloads"] == admitted
        return frame if ok else None

    frame = wait_for("top showing the Job's 6 GPUs", lambda: using("6", 1), log=log)
    queue = _cq_in(frame)
    assert {(r["resource"], r["nominal"], r["borrowed"]) for r in queue["resources"]} == {
        ("cpu", "8", "0"),
        ("nvidia.com/gpu", "8", "0"),
    }
    assert (queue["stopPolicy"], queue["active"]) == ("None", True)
    (lq,) = frame["localQueues"]
    assert (lq["namespace"], lq["name"], lq["clusterQueue"]) == (namespace, "lq", CQ)
    assert lq["admittedWorkloads"] == 1
    assert {r["resource"]: r["usage"] for r in lq["resources"]}["nvidia.com/gpu"] == "6"
    table = plugin(cluster, "top", "--once", "--localqueues", "-n", namespace).stdout
    print(table)  # the user guide's example output
    row = next(line.split() for line in table.splitlines() if line.startswith(CQ))
    assert row[:4] == [CQ, "0", "1", "Active"]  # no cohort: that column is blank
    assert "6/8 (75%)" in table

    # The Job runs 30 s and finishes: its quota returns.
    wait_for(
        "topped finished",
        lambda: is_true(workload_of(cluster, namespace, "topped") or {}, "Finished"),
        timeout=120,
        log=log,
    )
    wait_for("top showing the GPUs back", lambda: using("0", 0), log=log)
    print(plugin(cluster, "top", "--once", "--localqueues", "-n", namespace).stdout)


def _as_from_a_terminal() -> None:
    """Ctrl-C reaches a ``top`` started from a terminal. A test run started in the background
    by a non-interactive shell (``make test &``) has SIGINT ignored, and a child would inherit
    that: give the child the default disposition, as a terminal's foreground job has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_top_refreshes_until_interrupted(cluster: ClusterHandle, kueue_crds: Path) -> None:
    """Into a pipe: a title line per frame, no terminal escapes; Ctrl-C ends it quietly."""
    proc = subprocess.Popen(
        [str(PLUGIN), "top", "--interval", "0.5", f"--kubeconfig={cluster.kubeconfig}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    titles = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            assert "\x1b" not in line
            titles += line.startswith("Every 0.5s: phalanx top   ")
            if titles == 2:
                break
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert titles == 2
    assert proc.returncode == 0, err


def test_top_redraws_a_terminal(cluster: ClusterHandle, kueue_crds: Path) -> None:
    """On a terminal (a pseudo-terminal here) each frame clears the screen first."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [str(PLUGIN), "top", "--interval", "0.5", f"--kubeconfig={cluster.kubeconfig}"],
        stdout=follower,
        stderr=subprocess.PIPE,
        preexec_fn=_as_from_a_terminal,
    )
    os.close(follower)
    seen = b""
    try:
        while seen.count(top_cmd.CLEAR.encode()) < 2:
            seen += os.read(leader, 4096)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        os.close(leader)
    frames = seen.decode().split(top_cmd.CLEAR)
    assert frames[0] == ""  # nothing before the first clear
    assert frames[1].startswith("Every 0.5s: phalanx top   ")
    assert "CLUSTERQUEUE" in frames[1] or "No ClusterQueues found" in frames[1]
    assert proc.returncode == 0


def test_version_reads_the_operator_deployment(
    cluster: ClusterHandle, kueue_crds: Path, namespace: str
) -> None:
    alone = plugin(cluster, "version", f"--operator-namespace={namespace}").stdout
    assert alone == f"Client Version: {__version__}\n"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "phalanx", "labels": {"app.kubernetes.io/name": "phalanx"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "phalanx"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "phalanx"}},
                "spec": {"containers": [{"name": "operator", "image": "phalanx:0.1.0"}]},
            },
        },
    }
    apply(cluster, deployment, namespace=namespace)
    out = plugin(cluster, "version", f"--operator-namespace={namespace}").stdout
    assert out == f"Client Version: {__version__}\nPhalanx Operator Image: phalanx:0.1.0\n"


def test_bash_completion_parses_and_completes_from_the_api(
    cluster: ClusterHandle, namespace: str, tmp_path: Path
) -> None:
    script = tmp_path / "phalanx.bash"
    bash = subprocess.run([str(PLUGIN), "completion", "bash"], capture_output=True, text=True)
    script.write_text(bash.stdout)
    assert "complete -o default -F _phalanx_complete" in bash.stdout
    subprocess.run(["bash", "-n", str(script)], check=True)
    words = subprocess.run(
        [str(PLUGIN), "__complete", f"--kubeconfig={cluster.kubeconfig}", "list", "-n", "t-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert namespace in words
    # `kubectl phalanx <TAB>`: kubectl runs kubectl_complete-phalanx and reads cobra's answer.
    env = {
        **os.environ,
        "PATH": f"{PLUGIN.parent}{os.pathsep}{os.environ['PATH']}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    answer = subprocess.run(
        [str(cluster.kubectl_path), "__complete", "phalanx", "list", "-n", "t-"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    assert namespace in answer
    assert answer[-1] == ":4"


def test_without_rights_the_api_servers_message_is_printed(
    cluster: ClusterHandle, kueue_crds: Path, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl_ok("create", "serviceaccount", "-n", namespace, "nobody")
    token = cluster.kubectl_ok("create", "token", "-n", namespace, "nobody").strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "nobody", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "nobody"
    kubeconfig = tmp_path / "nobody.yaml"
    kubeconfig.write_text(yaml.safe_dump(config))
    user = f"system:serviceaccount:{namespace}:nobody"
    for argv, verb in (
        (["top", "--once"], "list"),
        (["top", "--once", "--localqueues", "-n", namespace], "list"),
        (["create", "rf", "f"], "create"),
        (["stop", "cq", "any"], "get"),
        (["stop", "workload", "w", "-n", namespace], "get"),
    ):
        proc = subprocess.run(
            [str(PLUGIN), *argv, f"--kubeconfig={kubeconfig}"], capture_output=True, text=True
        )
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("error: "), proc.stderr
        assert f'is forbidden: User "{user}" cannot {verb} resource' in proc.stderr, proc.stderr
