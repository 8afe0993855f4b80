"""``phalanx top`` (also ``kubectl phalanx top``): a live view of the queues and their usage.

Per ClusterQueue: its cohort, pending and admitted workloads, state (its stop policy when
stopped, else whether it is active), and for every
flavor and resource of its quota the usage against the nominal quota and what it borrows from
its cohort. With ``--localqueues``, the LocalQueues of ``-n NAMESPACE`` (the context's by
default) or of every namespace (``-A``), with their counts and usage. Everything comes from the
status the operator writes on the queues (read as ``list`` reads it), so it shows what
``kubectl get`` would, refreshed every ``--interval`` seconds (2) until Ctrl-C: on a terminal
each frame replaces the last (ANSI clear), otherwise frames follow one another. ``--once``
prints one frame and exits (for scripts); ``-o json`` prints the frame as JSON (one object per
line when refreshing into a pipe).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from phalanx.cli import kube_access, list_cmd
from phalanx.quotas.quantity import QuantityError, parse_quantity

CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, clear the screen: what ``watch`` does between frames."""
FATAL = (401, 403, 404)
"""API answers that another try will not change: the view stops on them, even when live."""
CQ_COLUMNS = (
    "CLUSTERQUEUE",
    "COHORT",
    "PENDING",
    "ADMITTED",
    "STATE",
    "FLAVOR",
    "RESOURCE",
    "USAGE/NOMINAL",
    "BORROWED",
)
LQ_COLUMNS = (
    "LOCALQUEUE",
    "CLUSTERQUEUE",
    "PENDING",
    "ADMITTED",
    "STATE",
    "FLAVOR",
    "RESOURCE",
    "USAGE",
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top",
        help="a live view of queues and their usage (refreshing, like kubectl top / watch)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "--localqueues", action="store_true", help="also the LocalQueues (of -n, or -A)"
    )
    parser.add_argument(
        "-n", "--namespace", help="with --localqueues: this namespace's (the context's)"
    )
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="with --localqueues: every namespace"
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between two frames (2)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    kube_access.add_connection_args(parser)
    parser.set_defaults(func=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, such as 2 or 0.5 (got {text!r})"
        )
    return value


def run(args: argparse.Namespace) -> int:
    if (args.namespace or args.all_namespaces) and not args.localqueues:
        print(
            "error: -n/--namespace and -A/--all-namespaces choose LocalQueues: add --localqueues"
            " (ClusterQueues are cluster-scoped, all of them are shown)",
            file=sys.stderr,
        )
        return 2
    if args.namespace and args.all_namespaces:
        print("error: -n/--namespace and -A/--all-namespaces: give one of them", file=sys.stderr)
        return 2
    auth = kube_access.connect(args)
    if auth is None:
        return 2
    namespace = None if args.all_namespaces else (args.namespace or auth.default_namespace)
    try:
        return asyncio.run(_show(args, auth=auth, namespace=namespace, out=sys.stdout))
    except KeyboardInterrupt:
        return 0


async def _show(args: argparse.Namespace, *, auth: Any, namespace: str | None, out: TextIO) -> int:
    """Read and print frames until Ctrl-C (or once); 1 on an API refusal."""
    from phalanx.operator.kube import TRANSIENT_ERRORS, ApiError, KubeApi

    tty = out.isatty()
    failures: tuple[type[BaseException], ...] = (ApiError, *TRANSIENT_ERRORS)
    api = KubeApi(auth)
    try:
        while True:
            try:
                current = await read_frame(api, namespace=namespace, local_queues=args.localqueues)
            except failures as error:
                message = f"error: {_message(error)}"
                if args.once or getattr(error, "status", 0) in FATAL:
                    print(message, file=sys.stderr)
                    return 1
                # A live view outlasts a restarting API server: say so and try again.
                body = f"{message} (trying again every {args.interval:g}s)\n"
            else:
                body = (
                    render_json(current, compact=not tty and not args.once)
                    if args.output == "json"
                    else render(current, all_namespaces=namespace is None)
                )
            out.write(present(body, args=args, tty=tty))
            out.flush()
            if args.once:
                return 0
            await asyncio.sleep(args.interval)
    finally:
        await api.close()


def _message(error: BaseException) -> str:
    """The API server's own message (``... is forbidden: User ... cannot list ...``)."""
    body = getattr(error, "body", None) or {}
    return str(body.get("message") or error)


def present(body: str, *, args: argparse.Namespace, tty: bool) -> str:
    """A frame as printed: alone with ``--once``; live, under a ``watch``-like title line,
    replacing the screen on a terminal, else after a blank line; JSON lines stay bare."""
    if args.once:
        return body
    if args.output == "json" and not tty:
        return body
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    scope = " --localqueues" if args.localqueues else ""
    title = f"Every {args.interval:g}s: phalanx top{scope}   {now}   (Ctrl-C to stop)\n\n"
    return f"{CLEAR}{title}{body}" if tty else f"{title}{body}\n"


# -- a frame --------------------------------------------------------------------------------------


async def read_frame(api: Any, *, namespace: str | None, local_queues: bool) -> dict[str, Any]:
    """The queues as the API has them now, as a frame (``frame``)."""
    cluster_queues = await list_cmd.list_kueue(api, "clusterqueues", None)
    locals_ = await list_cmd.list_kueue(api, "localqueues", namespace) if local_queues else None
    return frame(cluster_queues, locals_, now=dt.datetime.now(dt.UTC))


def frame(
    cluster_queues: Sequence[Mapping[str, Any]],
    local_queues: Sequence[Mapping[str, Any]] | None,
    *,
    now: dt.datetime,
) -> dict[str, Any]:
    """What one frame shows, as data (``-o json`` prints it): the ClusterQueues by name, and
    the LocalQueues by namespace and name when asked for (None: not asked)."""
    shown: dict[str, Any] = {
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "clusterQueues": [
            cluster_queue_view(q) for q in sorted(cluster_queues, key=lambda q: _name(q))
        ],
    }
    if local_queues is not None:
        shown["localQueues"] = [
            local_queue_view(q)
            for q in sorted(local_queues, key=lambda q: (_namespace(q), _name(q)))
        ]
    return shown


def cluster_queue_view(queue: Mapping[str, Any]) -> dict[str, Any]:
    """A ClusterQueue's counts and, per flavor and resource of its quota (in the spec's
    order), usage, nominal quota and borrowed amount, as quantities."""
    spec = queue.get("spec") or {}
    status = queue.get("status") or {}
    used = _usage(status)
    resources = []
    for group in spec.get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for resource in flavor.get("resources") or ():
                usage, borrowed = used.get((flavor.get("name"), resource.get("name")), ("0", "0"))
                resources.append(
                    {
                        "flavor": str(flavor.get("name") or ""),
                        "resource": str(resource.get("name") or ""),
                        "usage": usage,
                        "nominal": str(resource.get("nominalQuota", "0")),
                        "borrowed": borrowed,
                    }
                )
    return {
        "name": _name(queue),
        "cohort": str(spec.get("cohortName") or ""),
        **_counts(status),
        "stopPolicy": str(spec.get("stopPolicy") or "None"),
        "active": _active(status),
        "resources": resources,
    }


def local_queue_view(queue: Mapping[str, Any]) -> dict[str, Any]:
    """A LocalQueue's counts and its workloads' usage per flavor and resource."""
    spec = queue.get("spec") or {}
    status = queue.get("status") or {}
    return {
        "namespace": _namespace(queue),
        "name": _name(queue),
        "clusterQueue": str(spec.get("clusterQueue") or ""),
        **_counts(status),
        "stopPolicy": str(spec.get("stopPolicy") or "None"),
        "active": _active(status),
        "resources": [
            {"flavor": flavor, "resource": resource, "usage": usage}
            for (flavor, resource), (usage, _) in _usage(status).items()
        ],
    }


def _usage(status: Mapping[str, Any]) -> dict[tuple[str, str], tuple[str, str]]:
    """(flavor, resource) -> (total, borrowed) of ``status.flavorsUsage`` (Kueue's v1beta2)."""
    return {
        (str(flavor.get("name") or ""), str(resource.get("name") or "")): (
            str(resource.get("total", "0")),
            str(resource.get("borrowed", "0")),
        )
        for flavor in status.get("flavorsUsage") or ()
        for resource in flavor.get("resources") or ()
    }


def _active(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Active" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _counts(status: Mapping[str, Any]) -> dict[str, int]:
    return {
        key: int(status.get(key) or 0)
        for key in ("pendingWorkloads", "reservingWorkloads", "admittedWorkloads")
    }


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _namespace(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


# -- printing -------------------------------------------------------------------------------------


def render_json(shown: Mapping[str, Any], *, compact: bool) -> str:
    if compact:
        return json.dumps(shown, separators=(",", ":")) + "\n"
    return json.dumps(shown, indent=2) + "\n"


def render(shown: Mapping[str, Any], *, all_namespaces: bool) -> str:
    """The frame as kubectl-style tables: a row per flavor and resource of each queue, the
    queue's own columns on its first row only."""
    rows: list[list[str]] = []
    for queue in shown["clusterQueues"]:
        own = [
            queue["name"],
            queue["cohort"],
            str(queue["pendingWorkloads"]),
            str(queue["admittedWorkloads"]),
            state_of(queue),
        ]
        cells = [
            [r["flavor"], r["resource"], usage_of_nominal(r), r["borrowed"]]
            for r in queue["resources"]
        ] or [["", "", "", ""]]
        rows += [[*(own if i == 0 else [""] * len(own)), *c] for i, c in enumerate(cells)]
    text = list_cmd.table(CQ_COLUMNS, rows) if rows else "No ClusterQueues found\n"
    if "localQueues" not in shown:
        return text
    header = [*(("NAMESPACE",) if all_namespaces else ()), *LQ_COLUMNS]
    rows = []
    for queue in shown["localQueues"]:
        own = [
            *((queue["namespace"],) if all_namespaces else ()),
            queue["name"],
            queue["clusterQueue"],
            str(queue["pendingWorkloads"]),
            str(queue["admittedWorkloads"]),
            state_of(queue),
        ]
        cells = [[r["flavor"], r["resource"], r["usage"]] for r in queue["resources"]] or [
            ["", "", ""]
        ]
        rows += [[*(own if i == 0 else [""] * len(own)), *c] for i, c in enumerate(cells)]
    return text + "\n" + (list_cmd.table(header, rows) if rows else "No LocalQueues found\n")


def state_of(queue: Mapping[str, Any]) -> str:
    """The stop policy when the queue is stopped (``Hold``, ``HoldAndDrain``), else
    ``Active`` or ``Inactive`` as its ``Active`` condition says (a missing flavor, say)."""
    policy = str(queue["stopPolicy"])
    if policy != "None":
        return policy
    return "Active" if queue["active"] else "Inactive"


def usage_of_nominal(row: Mapping[str, str]) -> str:
    """``6/8 (75%)``; without the percentage when a quantity does not parse or nominal is 0."""
    shown = f"{row['usage']}/{row['nominal']}"
    try:
        usage = parse_quantity(row["usage"], resource=row["resource"])
        nominal = parse_quantity(row["nominal"], resource=row["resource"])
    except QuantityError:
        return shown
    return f"{shown} ({usage * 100 // nominal}%)" if nominal > 0 else shown
