"""``phalanx explain WORKLOAD|workload/NAME|job/NAME [-n NS] [-o text|json]`` (also
``kubectl phalanx explain``): why a Workload is still pending, from the operator's live core.

It reads ``visibility.phalanx.kueue.x-k8s.io/v1alpha1`` ``workloads/{name}/explanation``, served
by the operator beside Kueue's visibility API: the explanation the scheduler computed in its
last cycle, per pod set, flavor and resource, who holds the quota it needs (borrowing
ClusterQueues named, with how much), its position, and what would let it in. ``job/NAME`` finds
the Job's Workload by Kueue's naming (the Job's name and UID).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from phalanx.cli import kube_access

API = "/apis/visibility.phalanx.kueue.x-k8s.io/v1alpha1"
ROLE = "phalanx-workload-explanation-viewer-role"
_WORKLOAD_KINDS = ("workload", "workloads", "wl", "workload.kueue.x-k8s.io")
_JOB_KINDS = ("job", "jobs", "job.batch")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why a Workload (or a Job's Workload) is pending, from the operator's live state",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("target", metavar="WORKLOAD|job/NAME", help="NAME, workload/NAME, job/NAME")
    parser.add_argument("-n", "--namespace", help="the namespace (the context's by default)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    kube_access.add_connection_args(parser)
    parser.set_defaults(func=run)


def parse_target(target: str) -> tuple[str, str]:
    """("workload" | "job", name); raises ValueError naming what is accepted."""
    kind, _, name = target.rpartition("/")
    kind = kind.lower()
    if not name:
        raise ValueError(f"{target!r}: give WORKLOAD, workload/NAME or job/NAME")
    if not kind or kind in _WORKLOAD_KINDS:
        return "workload", name
    if kind in _JOB_KINDS:
        return "job", name
    raise ValueError(f"{target!r}: kind {kind!r} is not supported: use workload/NAME or job/NAME")


def run(args: argparse.Namespace) -> int:
    try:
        kind, name = parse_target(args.target)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    auth = kube_access.connect(args)
    if auth is None:
        return 2
    namespace = args.namespace or auth.default_namespace
    return asyncio.run(_run(args, auth, namespace, kind, name))


async def _run(args: argparse.Namespace, auth: Any, namespace: str, kind: str, name: str) -> int:
    from phalanx.operator import jobs
    from phalanx.operator.kube import ApiError, KubeApi

    api = KubeApi(auth)
    try:
        if kind == "job":
            try:
                job = await api.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
            except ApiError as error:
                print(f"error: reading Job {namespace}/{name}: {error}", file=sys.stderr)
                return 1
            name = jobs.workload_name(name, job["metadata"]["uid"])
        path = f"{API}/namespaces/{namespace}/workloads/{name}/explanation"
        try:
            body = await api.request("GET", path)
        except ApiError as error:
            what = f"explaining Workload {namespace}/{name}"
            print(kube_access.refusal(error, what=what, role=ROLE), file=sys.stderr)
            return 1
    finally:
        await api.close()
    if args.output == "json":
        print(json.dumps(body, indent=2))
    else:
        print((body.get("status") or {}).get("text", ""))
    return 0
