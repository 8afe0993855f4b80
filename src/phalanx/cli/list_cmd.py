"""``phalanx list`` (also ``kubectl phalanx list``, the ``kubectl-phalanx`` plugin): the Kueue
objects as kueuectl lists them, with each pending Workload's position from the visibility API.

- ``list workload|wl [-n NS | -A] [-c CQ] [-q LQ] [--status ...]``: NAME, JOB TYPE, JOB NAME,
  LOCALQUEUE, CLUSTERQUEUE, STATUS, POSITION IN QUEUE, EXEC TIME, AGE (``-o wide`` adds the
  reason it waits). Positions are the LocalQueue's, read from
  ``visibility.kueue.x-k8s.io/v1beta2`` (the scheduler's live order, served by the operator); a
  LocalQueue whose positions cannot be read (no rights, no operator) shows ``-`` and says why
  once on stderr.
- ``list clusterqueue|cq``, ``list localqueue|lq [-n NS | -A]``: their status counts.
- ``list resourceflavor|rf``, ``list pods --for job/NAME|workload/NAME`` (see ``list_pods``).

Credentials as kubectl finds them (``--kubeconfig``, ``$KUBECONFIG``, in-cluster,
``~/.kube/config``; ``--context``); ``-o json|yaml`` prints a ``v1`` List of the objects.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from phalanx.cli import kube_access, list_pods

KINDS = {
    "workload": "workloads",
    "wl": "workloads",
    "clusterqueue": "clusterqueues",
    "cq": "clusterqueues",
    "localqueue": "localqueues",
    "lq": "localqueues",
    "resourceflavor": "resourceflavors",
    "rf": "resourceflavors",
    "pods": "pods",
    "po": "pods",
}
STATUSES = ("all", "pending", "quotareserved", "admitted", "finished")
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "list",
        help="list workloads (with queue positions), queues, flavors, a job's pods as kueuectl",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("kind", choices=sorted(KINDS), metavar="KIND", help=", ".join(KINDS))
    parser.add_argument("-n", "--namespace", help="the namespace (the context's by default)")
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace you may read"
    )
    parser.add_argument("-c", "--clusterqueue", help="workloads of this ClusterQueue only")
    parser.add_argument("-q", "--localqueue", help="workloads of this LocalQueue only")
    parser.add_argument(
        "--status", choices=STATUSES, default="all", help="workloads in this state only"
    )
    parser.add_argument("--for", dest="for_", metavar="job/NAME|workload/NAME", help="pods: whose")
    parser.add_argument(
        "-o", "--output", choices=("table", "wide", "json", "yaml"), default="table"
    )
    kube_access.add_connection_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if KINDS[args.kind] in ("clusterqueues", "resourceflavors") and (
        args.namespace or args.all_namespaces
    ):
        print(f"error: {KINDS[args.kind]} are cluster-scoped: drop -n/-A", file=sys.stderr)
        return 2
    if (KINDS[args.kind] == "pods") != bool(args.for_):
        print("error: --for job/NAME|workload/NAME goes with list pods (only)", file=sys.stderr)
        return 2
    if args.for_ and args.all_namespaces:
        print("error: --for names one Job or Workload: use -n, not -A", file=sys.stderr)
        return 2
    auth = kube_access.connect(args)
    if auth is None:
        return 2
    namespace = None if args.all_namespaces else (args.namespace or auth.default_namespace)
    return asyncio.run(_run(args, auth, namespace))


async def list_kueue(api: Any, plural: str, namespace: str | None) -> list[dict[str, Any]]:
    """Every object of a Kueue kind (``clusterqueues``, ``localqueues``, ...) in v1beta2, of
    ``namespace`` (None: every namespace; ignored for the cluster-scoped kinds). Raises the
    API's ``ApiError``."""
    from phalanx.operator.kube import Resource

    cluster_scoped = plural in ("clusterqueues", "resourceflavors")
    resource = Resource("kueue.x-k8s.io", "v1beta2", plural, namespaced=not cluster_scoped)
    items: list[dict[str, Any]] = await api.list_all(
        resource, namespace=None if cluster_scoped else namespace
    )
    return items


async def _run(args: argparse.Namespace, auth: Any, namespace: str | None) -> int:
    from phalanx.operator.kube import ApiError, KubeApi

    plural = KINDS[args.kind]
    api = KubeApi(auth)
    try:
        try:
            if plural == "pods":
                items = await list_pods.pods_for(api, args.for_, namespace or "default")
            else:
                items = await list_kueue(api, plural, namespace)
        except list_pods.ForError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        except ApiError as error:
            print(f"error: listing {plural}: {error}", file=sys.stderr)
            return 1
        now = dt.datetime.now(dt.UTC)
        if plural == "workloads":
            queues = await _local_queues(api, namespace)
            items = [w for w in items if _wanted(w, args, queues)]
            positions, problems = await _positions(api, items)
            for problem in problems:
                print(f"warning: {problem}", file=sys.stderr)
            rows = [workload_row(w, positions, queues, now=now) for w in items]
            header = list(WORKLOAD_COLUMNS)
            if args.output == "wide":
                header.append("REASON")
                rows = [[*r, waiting_reason(w)] for r, w in zip(rows, items, strict=True)]
        elif plural == "clusterqueues":
            header, rows = list(CQ_COLUMNS), [cluster_queue_row(q, now=now) for q in items]
        elif plural == "localqueues":
            header, rows = list(LQ_COLUMNS), [local_queue_row(q, now=now) for q in items]
        elif plural == "resourceflavors":
            header = list(list_pods.RF_COLUMNS)
            rows = [[*list_pods.resource_flavor_row(f), age_of(f, now)] for f in items]
        else:
            header = list(list_pods.POD_COLUMNS)
            rows = [[*list_pods.pod_row(p), age_of(p, now)] for p in items]
    finally:
        await api.close()
    if args.output in ("json", "yaml"):
        listing = {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}
        text = (
            json.dumps(listing, indent=2) + "\n"
            if args.output == "json"
            else yaml.safe_dump(listing, sort_keys=False)
        )
        print(text, end="")
        return 0
    if namespace is None:
        header.insert(0, "NAMESPACE")
        rows = [[i["metadata"].get("namespace", ""), *r] for r, i in zip(rows, items, strict=True)]
    print(table(header, rows), end="")
    return 0


# -- workloads ----------------------------------------------------------------------------------

WORKLOAD_COLUMNS = (
    "NAME",
    "JOB TYPE",
    "JOB NAME",
    "LOCALQUEUE",
    "CLUSTERQUEUE",
    "STATUS",
    "POSITION IN QUEUE",
    "EXEC TIME",
    "AGE",
)


def status_of(workload: Mapping[str, Any]) -> str:
    """kueuectl's STATUS: FINISHED, ADMITTED, QUOTARESERVED or PENDING."""
    true = {
        c.get("type")
        for c in (workload.get("status") or {}).get("conditions") or ()
        if c.get("status") == "True"
    }
    for kind, status in (
        ("Finished", "FINISHED"),
        ("Admitted", "ADMITTED"),
        ("QuotaReserved", "QUOTARESERVED"),
    ):
        if kind in true:
            return status
    return "PENDING"


def _wanted(
    workload: Mapping[str, Any], args: argparse.Namespace, queues: Mapping[tuple[str, str], str]
) -> bool:
    if args.localqueue and (workload.get("spec") or {}).get("queueName") != args.localqueue:
        return False
    if args.clusterqueue and cluster_queue_of(workload, queues) != args.clusterqueue:
        return False
    return bool(args.status == "all" or status_of(workload).lower() == args.status)


def cluster_queue_of(workload: Mapping[str, Any], queues: Mapping[tuple[str, str], str]) -> str:
    """The ClusterQueue it is admitted to, else its LocalQueue's (``queues``: (namespace,
    LocalQueue) -> ClusterQueue, as far as the caller may list LocalQueues)."""
    admitted = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
    if admitted:
        return str(admitted)
    namespace = (workload.get("metadata") or {}).get("namespace", "")
    return queues.get((namespace, (workload.get("spec") or {}).get("queueName") or ""), "")


async def _local_queues(api: Any, namespace: str | None) -> dict[tuple[str, str], str]:
    """(namespace, LocalQueue) -> ClusterQueue, or nothing when LocalQueues may not be listed
    (the pending Workloads' ClusterQueue column is then empty)."""
    from phalanx.operator.kube import ApiError

    try:
        queues = await list_kueue(api, "localqueues", namespace)
    except ApiError:
        return {}
    return {
        (q["metadata"].get("namespace", ""), q["metadata"].get("name", "")): str(
            (q.get("spec") or {}).get("clusterQueue") or ""
        )
        for q in queues
    }


async def _positions(
    api: Any, workloads: Sequence[Mapping[str, Any]]
) -> tuple[dict[tuple[str, str], int], list[str]]:
    """(namespace, name) -> position in its LocalQueue, for the pending ones, from the
    visibility API (one call per LocalQueue); and what could not be read."""
    from phalanx.operator.kube import ApiError

    queues = sorted(
        {
            (w["metadata"]["namespace"], (w.get("spec") or {}).get("queueName") or "")
            for w in workloads
            if status_of(w) == "PENDING" and (w.get("spec") or {}).get("queueName")
        }
    )
    found: dict[tuple[str, str], int] = {}
    problems: list[str] = []
    for namespace, queue in queues:
        path = f"{VISIBILITY}/namespaces/{namespace}/localqueues/{queue}/pendingworkloads"
        try:
            body = await api.request("GET", path, params={"limit": "100000"})
        except ApiError as error:
            problems.append(
                f"positions of LocalQueue {namespace}/{queue} not available ({error.status}: "
                f"{error}); the visibility API needs the operator running and the "
                "kueue-pending-workloads-lq-viewer-role"
            )
            continue
        for item in body.get("items") or ():
            metadata = item.get("metadata") or {}
            key = (metadata.get("namespace") or namespace, metadata.get("name") or "")
            found[key] = int(item.get("positionInLocalQueue", 0))
    return found, problems


def workload_row(
    workload: Mapping[str, Any],
    positions: Mapping[tuple[str, str], int],
    queues: Mapping[tuple[str, str], str],
    *,
    now: dt.datetime,
) -> list[str]:
    metadata = workload.get("metadata") or {}
    owners = list(metadata.get("ownerReferences") or ())
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    key = (metadata.get("namespace", ""), metadata.get("name", ""))
    state = status_of(workload)
    position = str(positions[key]) if key in positions else "-" if state == "PENDING" else ""
    admitted = _condition_time(workload, "Admitted") if state in ("ADMITTED", "FINISHED") else None
    finished = _condition_time(workload, "Finished") if state == "FINISHED" else None
    created = _parse(metadata.get("creationTimestamp"))
    return [
        metadata.get("name", ""),
        job_type(owner),
        owner.get("name", ""),
        (workload.get("spec") or {}).get("queueName", ""),
        cluster_queue_of(workload, queues),
        state,
        position,
        _age((finished or now) - admitted) if admitted else "",
        _age(now - created) if created else "",
    ]


def job_type(owner: Mapping[str, Any]) -> str:
    """``job.batch``, ``jobset.jobset.x-k8s.io``, ``pod``: the owner's kind as kubectl names
    a resource (lower-case kind, dot, API group; the core group has none)."""
    kind = str(owner.get("kind") or "").lower()
    api_version = str(owner.get("apiVersion") or "")
    group = api_version.split("/")[0] if "/" in api_version else ""
    return f"{kind}.{group}" if kind and group else kind


def waiting_reason(workload: Mapping[str, Any]) -> str:
    """Why it waits, as its ``QuotaReserved=False`` condition says."""
    for c in (workload.get("status") or {}).get("conditions") or ():
        if c.get("type") == "QuotaReserved" and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "")
    return ""


# -- queues -------------------------------------------------------------------------------------

CQ_COLUMNS = ("NAME", "COHORT", "PENDING WORKLOADS", "ADMITTED WORKLOADS", "ACTIVE", "AGE")
LQ_COLUMNS = ("NAME", "CLUSTERQUEUE", "PENDING WORKLOADS", "ADMITTED WORKLOADS", "AGE")


def cluster_queue_row(queue: Mapping[str, Any], *, now: dt.datetime) -> list[str]:
    status = queue.get("status") or {}
    active = any(
        c.get("type") == "Active" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    created = _parse((queue.get("metadata") or {}).get("creationTimestamp"))
    return [
        (queue.get("metadata") or {}).get("name", ""),
        str((queue.get("spec") or {}).get("cohortName") or ""),
        str(status.get("pendingWorkloads", 0)),
        str(status.get("admittedWorkloads", 0)),
        "true" if active else "false",
        _age(now - created) if created else "",
    ]


def local_queue_row(queue: Mapping[str, Any], *, now: dt.datetime) -> list[str]:
    status = queue.get("status") or {}
    created = _parse((queue.get("metadata") or {}).get("creationTimestamp"))
    return [
        (queue.get("metadata") or {}).get("name", ""),
        str((queue.get("spec") or {}).get("clusterQueue") or ""),
        str(status.get("pendingWorkloads", 0)),
        str(status.get("admittedWorkloads", 0)),
        _age(now - created) if created else "",
    ]


# -- formatting ---------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """kubectl's plain table: columns padded to their widest cell, three spaces apart."""
    if not rows:
        return "No resources found\n"
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines) + "\n"


def _parse(text: Any) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def _condition_time(workload: Mapping[str, Any], kind: str) -> dt.datetime | None:
    for c in (workload.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return _parse(c.get("lastTransitionTime"))
    return None


def age_of(obj: Mapping[str, Any], now: dt.datetime) -> str:
    created = _parse((obj.get("metadata") or {}).get("creationTimestamp"))
    return _age(now - created) if created else ""


def _age(delta: dt.timedelta) -> str:
    """kubectl's short durations: 45s, 12m, 3h4m, 5d."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest and hours < 8 else f"{hours}h"
    return f"{hours // 24}d"
