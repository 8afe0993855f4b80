"""kueuectl's verbs in ``phalanx`` (also ``kubectl phalanx``, the ``kubectl-phalanx`` plugin).

- ``create clusterqueue|cq NAME [--cohort --queuing-strategy --namespace-selector
  --reclaim-within-cohort --preemption-within-cluster-queue --nominal-quota --borrowing-limit
  --lending-limit]``, ``create localqueue|lq NAME -c CQ [-i/--ignore-unknown-cq]``,
  ``create resourceflavor|rf NAME [--node-labels --node-taints --tolerations]``; each with
  ``--dry-run=client|server`` and ``-o yaml|json``.
- ``stop clusterqueue|localqueue NAME [--keep-already-running]``: ``spec.stopPolicy``
  HoldAndDrain (Hold with the flag); ``resume`` sets it to None. ``stop|resume workload NAME``:
  ``spec.active`` false|true.
- ``delete workload NAME... | --all [-A] [--yes]``: deletes each Workload's owners (its Job; the
  Workload goes with it), after a confirmation unless ``--yes``; a Workload without an owner
  itself.
- ``version``: this plugin's version and the operator's image (its Deployment in
  ``--operator-namespace``, labelled ``app.kubernetes.io/name=phalanx``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from phalanx import __version__
from phalanx.cli import plugin_specs
from phalanx.cli.plugin_client import (
    ALIASES,
    KINDS,
    PluginError,
    add_connection_flags,
    add_output_flags,
    api_message,
    create,
    dry_run_params,
    get,
    merge_patch,
    name_line,
    print_result,
    run_with_api,
)
from phalanx.operator.kube import ApiError, KubeApi, Resource

OPERATOR_NAMESPACE = "phalanx-system"
OPERATOR_SELECTOR = "app.kubernetes.io/name=phalanx"
OPERATOR_CONTAINER = "operator"
DEPLOYMENTS = Resource("apps", "v1", "deployments")


def register(subparsers: Any) -> None:
    _register_create(subparsers)
    for verb, kinds in (
        ("stop", "clusterqueue|localqueue|workload"),
        ("resume", "clusterqueue|localqueue|workload"),
    ):
        parser = subparsers.add_parser(verb, help=f"{verb} a {kinds} (as kueuectl {verb})")
        parser.add_argument(
            "kind", choices=("clusterqueue", "cq", "localqueue", "lq", "workload", "wl")
        )
        parser.add_argument("name")
        if verb == "stop":
            parser.add_argument(
                "--keep-already-running",
                action="store_true",
                help="queues: hold new admissions but let admitted workloads run (Hold)",
            )
        add_connection_flags(parser, namespaced=True)
        add_output_flags(parser)
        parser.set_defaults(func=run_stop_resume, stop=verb == "stop")

    delete = subparsers.add_parser(
        "delete", help="delete workloads and their jobs (as kueuectl delete workload)"
    )
    delete.add_argument("kind", choices=("workload", "wl"))
    delete.add_argument("names", nargs="*", metavar="NAME")
    delete.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    delete.add_argument("--all", action="store_true", help="every Workload of the namespace")
    delete.add_argument(
        "-A", "--all-namespaces", action="store_true", help="with --all: of every namespace"
    )
    add_connection_flags(delete, namespaced=True)
    delete.add_argument("--dry-run", choices=("none", "client", "server"), default="none")
    delete.set_defaults(func=run_delete)

    version = subparsers.add_parser(
        "version", help="this plugin's version and the operator's image"
    )
    version.add_argument(
        "--operator-namespace",
        default=OPERATOR_NAMESPACE,
        help=f"where the operator's Deployment is ({OPERATOR_NAMESPACE})",
    )
    add_connection_flags(version, namespaced=False)
    version.set_defaults(func=run_version)


# -- create -------------------------------------------------------------------------------------


def _register_create(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "create", help="create a clusterqueue, localqueue or resourceflavor (as kueuectl)"
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)

    cq = kinds.add_parser("clusterqueue", aliases=["cq"], help="create a ClusterQueue")
    cq.add_argument("name")
    cq.add_argument("--cohort", help="the cohort this ClusterQueue belongs to")
    cq.add_argument("--queuing-strategy", help="BestEffortFIFO (default) or StrictFIFO")
    cq.add_argument(
        "--namespace-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="labels of the namespaces that may submit (every namespace by default)",
    )
    cq.add_argument("--reclaim-within-cohort", help="Never (default), LowerPriority or Any")
    cq.add_argument(
        "--preemption-within-cluster-queue",
        help="Never (default), LowerPriority or LowerOrNewerEqualPriority",
    )
    for flag in plugin_specs.QUOTA_FLAGS:
        cq.add_argument(
            f"--{flag}",
            action="append",
            default=[],
            metavar="FLAVOR:RESOURCE=QTY;...,...",
            help=f"the {flag.replace('-', ' ')} per flavor, e.g. 'alpha:cpu=9;memory=36Gi'",
        )

    lq = kinds.add_parser("localqueue", aliases=["lq"], help="create a LocalQueue")
    lq.add_argument("name")
    lq.add_argument("-c", "--clusterqueue", help="the ClusterQueue it submits to (required)")
    lq.add_argument(
        "-i",
        "--ignore-unknown-cq",
        action="store_true",
        help="create it even if the ClusterQueue does not exist",
    )

    rf = kinds.add_parser("resourceflavor", aliases=["rf"], help="create a ResourceFlavor")
    rf.add_argument("name")
    rf.add_argument("--node-labels", action="append", default=[], metavar="KEY=VALUE,...")
    rf.add_argument("--node-taints", action="append", default=[], metavar="KEY[=VALUE]:EFFECT,...")
    rf.add_argument(
        "--tolerations", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]|:EFFECT,..."
    )
    for sub in (cq, lq, rf):
        add_connection_flags(sub, namespaced=sub is lq)
        add_output_flags(sub)
        sub.set_defaults(func=run_create)


def build(args: argparse.Namespace, namespace: str) -> dict[str, Any]:
    """The object ``create`` sends for these flags (FlagError for a wrong one)."""
    kind = ALIASES.get(args.kind, args.kind)
    if kind == "clusterqueue":
        return plugin_specs.cluster_queue(
            args.name,
            cohort=args.cohort,
            queuing_strategy=args.queuing_strategy,
            namespace_selector=args.namespace_selector,
            reclaim_within_cohort=args.reclaim_within_cohort,
            preemption_within_cluster_queue=args.preemption_within_cluster_queue,
            nominal_quota=args.nominal_quota,
            borrowing_limit=args.borrowing_limit,
            lending_limit=args.lending_limit,
        )
    if kind == "localqueue":
        return plugin_specs.local_queue(
            args.name, namespace=namespace, cluster_queue=args.clusterqueue or ""
        )
    return plugin_specs.resource_flavor(
        args.name,
        node_labels=args.node_labels,
        node_taints=args.node_taints,
        tolerations=args.tolerations,
    )


def run_create(args: argparse.Namespace) -> int:
    kind = ALIASES.get(args.kind, args.kind)
    try:
        build(args, "")  # the flags' errors before any credential is needed
    except plugin_specs.FlagError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    async def body(api: KubeApi, namespace: str) -> int:
        obj = build(args, namespace)
        if kind == "localqueue" and not args.ignore_unknown_cq:
            await get(api, "clusterqueue", obj["spec"]["clusterQueue"], None)
        created = await create(api, kind, obj, dry_run=args.dry_run)
        print_result(created, output=args.output, operation="created", dry_run=args.dry_run)
        return 0

    return run_with_api(args, body)


# -- stop / resume ------------------------------------------------------------------------------


def run_stop_resume(args: argparse.Namespace) -> int:
    kind = ALIASES.get(args.kind, args.kind)
    if kind == "workload":
        if getattr(args, "keep_already_running", False):
            print("error: --keep-already-running is for queues, not workloads", file=sys.stderr)
            return 2
        patch: dict[str, Any] = {"spec": {"active": not args.stop}}
        operation = "stopped" if args.stop else "resumed"
    else:
        policy = plugin_specs.stop_policy(
            stop=args.stop, keep_already_running=getattr(args, "keep_already_running", False)
        )
        patch = {"spec": {"stopPolicy": policy}}
        # kueuectl prints a stopped or resumed queue without an operation word.
        operation = ""

    async def body(api: KubeApi, namespace: str) -> int:
        obj = await merge_patch(api, kind, args.name, namespace, patch, dry_run=args.dry_run)
        print_result(obj, output=args.output, operation=operation, dry_run=args.dry_run)
        return 0

    return run_with_api(args, body)


# -- delete -------------------------------------------------------------------------------------


def run_delete(args: argparse.Namespace) -> int:
    if not args.all and not args.names:
        print("error: name the workloads to delete, or give --all", file=sys.stderr)
        return 2
    if args.all and args.names:
        print("error: --all deletes every workload: give no NAME with it", file=sys.stderr)
        return 2
    if args.all_namespaces and not args.all:
        print("error: -A/--all-namespaces needs --all, not names", file=sys.stderr)
        return 2

    async def body(api: KubeApi, namespace: str) -> int:
        workloads, missing = await _workloads_to_delete(api, args, namespace)
        owned = {
            _key(w): [await _owner(api, ref, w["metadata"]["namespace"]) for ref in _owners(w)]
            for w in workloads
        }
        if args.dry_run == "none" and not args.yes and any(owned.values()):
            if args.all:
                message = (
                    "This operation will also delete the jobs associated with these workloads.\n"
                )
            else:
                message = "This operation will also delete:\n" + "".join(
                    f"  - {', '.join(shown for shown, _ in resources)} associated with the "
                    f"{key} workload\n"
                    for key, resources in owned.items()
                    if resources
                )
            print(message + "Do you want to proceed (y/n)? ", end="", flush=True)
            answer = sys.stdin.readline().strip()
            if answer.lower() != "y":
                print("Deletion is canceled")
                return 0
        for workload in workloads:
            ns = workload["metadata"]["namespace"]
            resources = owned[_key(workload)]
            for shown, path in resources:
                await _delete(api, path, args.dry_run)
                print(f"{shown} deleted{_suffix(args.dry_run)}")
            if not resources:
                path = KINDS["workload"].path(namespace=ns, name=workload["metadata"]["name"])
                await _delete(api, path, args.dry_run)
                print(name_line(workload, operation="deleted", dry_run=args.dry_run))
        return 1 if missing else 0

    return run_with_api(args, body)


def _key(workload: dict[str, Any]) -> str:
    return f"{workload['metadata']['namespace']}/{workload['metadata']['name']}"


def _owners(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(workload["metadata"].get("ownerReferences") or ())


def _suffix(dry_run: str) -> str:
    return {"client": " (client dry run)", "server": " (server dry run)"}.get(dry_run, "")


async def _workloads_to_delete(
    api: KubeApi, args: argparse.Namespace, namespace: str
) -> tuple[list[dict[str, Any]], int]:
    """The Workloads to delete and how many of those named do not exist."""
    if args.all:
        scope = None if args.all_namespaces else namespace
        try:
            return await api.list_all(KINDS["workload"], namespace=scope), 0
        except ApiError as error:
            raise PluginError(str(error.body.get("message") or error)) from None
    found = []
    for name in args.names:
        try:
            found.append(await api.get(KINDS["workload"], name, namespace=namespace))
        except ApiError as error:
            if not error.not_found:
                raise PluginError(str(error.body.get("message") or error)) from None
            # As kueuectl, a missing one is reported and the others are still deleted; the
            # exit code (1) says one was missing.
            print(f"error: {api_message(error, kind='workload', name=name)}", file=sys.stderr)
    return found, len(args.names) - len(found)


async def _owner(api: KubeApi, ref: dict[str, Any], namespace: str) -> tuple[str, str]:
    """An owner reference as kueuectl shows it (``jobs.batch/NAME``) and its URL path, its
    plural read from the API's discovery."""
    api_version, kind, name = str(ref["apiVersion"]), str(ref["kind"]), str(ref["name"])
    group, _, version = api_version.rpartition("/")
    root = f"/apis/{api_version}" if group else f"/api/{version}"
    try:
        listing = await api.request("GET", root)
    except ApiError as error:
        raise PluginError(f"the owner {kind} {name}: {error}") from None
    for resource in listing.get("resources") or ():
        plural = str(resource.get("name", ""))
        if resource.get("kind") == kind and "/" not in plural:
            shown = f"{plural}.{group}/{name}" if group else f"{plural}/{name}"
            return shown, f"{root}/namespaces/{namespace}/{plural}/{name}"
    raise PluginError(f"the API serves no {kind} in {api_version} (owner {name})")


async def _delete(api: KubeApi, path: str, dry_run: str) -> None:
    if dry_run == "client":
        return
    body: dict[str, Any] = {"propagationPolicy": "Background"}
    if dry_run == "server":
        body["dryRun"] = ["All"]
    try:
        await api.request("DELETE", path, params=dry_run_params(dry_run), body=body)
    except ApiError as error:
        if not error.not_found:
            raise PluginError(str(error.body.get("message") or error)) from None


# -- version ------------------------------------------------------------------------------------


def run_version(args: argparse.Namespace) -> int:
    print(f"Client Version: {__version__}")

    async def body(api: KubeApi, _namespace: str) -> int:
        try:
            deployments = await api.list_all(
                DEPLOYMENTS, namespace=args.operator_namespace, label_selector=OPERATOR_SELECTOR
            )
        except ApiError as error:
            if error.not_found:
                return 0
            raise PluginError(str(error.body.get("message") or error)) from None
        for deployment in deployments:
            containers = deployment["spec"]["template"]["spec"].get("containers") or ()
            for container in containers:
                if container.get("name") == OPERATOR_CONTAINER:
                    print(f"Phalanx Operator Image: {container.get('image', '')}")
                    return 0
        return 0

    return run_with_api(args, body)
