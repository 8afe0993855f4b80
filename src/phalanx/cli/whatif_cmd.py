"""``phalanx what-if -f job.yaml [-n NS] [-o text|json]`` (also ``kubectl phalanx what-if``):
what the scheduler would decide for a Job or Workload were it created now, creating nothing.

It posts the object to ``visibility.phalanx.kueue.x-k8s.io/v1alpha1`` ``whatifs``, served by the
operator: a dry run of its next cycle's decision for that one workload on the live books (the
same flavor assignment, victim search and topology placement the cycle uses). The answer names
the LocalQueue and ClusterQueue, the flavors, whether it would be admitted now, whom it would
preempt, where it would be placed, and its position if it would wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from phalanx.cli import kube_access

API = "/apis/visibility.phalanx.kueue.x-k8s.io/v1alpha1"
ROLE = "phalanx-whatif-creator-role"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "what-if",
        help="what the scheduler would decide for a Job or Workload, without creating it",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "-f", "--filename", required=True, help="the Job or Workload manifest (- for stdin)"
    )
    parser.add_argument(
        "-n",
        "--namespace",
        help="the namespace (default: the manifest's, else the context's)",
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    kube_access.add_connection_args(parser)
    parser.set_defaults(func=run)


def read_manifest(filename: str) -> dict[str, Any]:
    """The one object of ``filename``; raises ValueError saying what is wrong with it."""
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ValueError(f"{filename}: not YAML or JSON: {error}") from error
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"{filename}: holds {len(docs)} objects; give exactly one Job or Workload")
    return docs[0]


def run(args: argparse.Namespace) -> int:
    try:
        manifest = read_manifest(args.filename)
    except (OSError, ValueError) as error:
        print(f"error: -f {error}", file=sys.stderr)
        return 2
    auth = kube_access.connect(args)
    if auth is None:
        return 2
    given = (manifest.get("metadata") or {}).get("namespace")
    if args.namespace and given and given != args.namespace:
        print(
            f"error: the manifest's metadata.namespace is {given!r} but -n is"
            f" {args.namespace!r}: drop one",
            file=sys.stderr,
        )
        return 2
    namespace = args.namespace or given or auth.default_namespace
    return asyncio.run(_run(args, auth, namespace, manifest))


async def _run(args: argparse.Namespace, auth: Any, namespace: str, manifest: Any) -> int:
    from phalanx.operator.kube import ApiError, KubeApi

    api = KubeApi(auth)
    try:
        body = await api.request("POST", f"{API}/namespaces/{namespace}/whatifs", body=manifest)
    except ApiError as error:
        kind = manifest.get("kind", "object")
        what = f"what-if for {kind} {(manifest.get('metadata') or {}).get('name', '')}"
        print(kube_access.refusal(error, what=what.rstrip(), role=ROLE), file=sys.stderr)
        return 1
    finally:
        await api.close()
    if args.output == "json":
        print(json.dumps(body, indent=2))
    else:
        print((body.get("status") or {}).get("text", ""))
    return 0
