"""``phalanx report``: usage per group over a window, and one Workload's timeline, read from
the usage history store the operator writes."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

from phalanx.cli.store_cmd import add_store_argument

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> dt.timedelta:
    """``30m``, ``12h``, ``7d``, ``2w``."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use a number and a unit s, m, h, d or w (7d)"
        )
    return dt.timedelta(seconds=float(match[1]) * _SECONDS[match[2]])


def plot_path(text: str) -> Path:
    """``--plot``'s file: a format matplotlib writes, in a folder that exists."""
    path = Path(text)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise argparse.ArgumentTypeError(f"{text!r}: name a .png, .svg or .pdf file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: folder {str(path.parent)!r} does not exist")
    return path


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="usage reports from the usage history store (docs/store.md)",
        description="Read the Workload lifecycle events the operator stored.",
    )
    kinds = parser.add_subparsers(dest="report", metavar="REPORT", required=True)
    usage = kinds.add_parser(
        "usage",
        help="resource-hours, admissions, wait p50/p95 and preemptions per group",
    )
    usage.add_argument("--since", type=duration, default=duration("7d"), help="window (7d)")
    usage.add_argument(
        "--by",
        choices=("namespace", "localqueue", "clusterqueue", "flavor"),
        default="clusterqueue",
    )
    usage.add_argument("--format", choices=("table", "csv", "json"), default="table")
    usage.add_argument(
        "--plot",
        type=plot_path,
        metavar="FILE",
        help="also draw the report into FILE (.png, .svg or .pdf): the main resource's hours "
        "per group over time and each group's waits (needs matplotlib: phalanx[plot])",
    )
    add_store_argument(usage)
    workload = kinds.add_parser("workload", help="one Workload's timeline")
    workload.add_argument("workload", metavar="NAMESPACE/NAME")
    workload.add_argument("--format", choices=("table", "json"), default="table")
    add_store_argument(workload)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from phalanx.store import db

    url = args.store or db.default_url()
    if url == "off":
        print(
            "error: the usage history store is off ($PHALANX_STORE=off); give --store URL",
            file=sys.stderr,
        )
        return 2
    try:
        engine = db.open_engine(url, create=False)
        if db.current_revision(engine) is None:
            print(
                f"error: store {url!r} is empty; the operator creates it (or run "
                "`phalanx store upgrade`)",
                file=sys.stderr,
            )
            return 1
        if args.report == "usage":
            print(_usage(engine, since=args.since, by=args.by, fmt=args.format), end="")
            if args.plot is not None:
                return _plot(engine, since=args.since, by=args.by, path=args.plot)
        else:
            namespace, _, name = args.workload.partition("/")
            if not name:
                print(f"error: {args.workload!r}: use NAMESPACE/NAME", file=sys.stderr)
                return 2
            print(_timeline(engine, namespace=namespace, name=name, fmt=args.format), end="")
    except db.StoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _usage(engine: Any, *, since: dt.timedelta, by: str, fmt: str) -> str:
    from phalanx.store import report

    until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    rows = report.usage(engine, since=until - since, until=until, by=by)
    resources = sorted({r for row in rows for r in row.resource_seconds})
    header = [by, "admissions", "preemptions", "wait_p50_s", "wait_p95_s"] + [
        _hours_column(r, "hours") for r in resources
    ]
    # Per ClusterQueue, its quota over the window: what share it used and what it borrowed.
    quota = (
        report.quota_use(engine, since=until - since, until=until) if by == "clusterqueue" else {}
    )
    quota_resources = sorted({r for per in quota.values() for r, u in per.items() if u.quota})
    for r in quota_resources:
        header += [_hours_column(r, "quota_hours"), f"{r}_quota_used_pct"]
        header += [_hours_column(r, "borrowed_hours")]
    records: list[list[Any]] = []
    for row in rows:
        hours = row.resource_hours()
        p50, p95 = row.wait_percentile(0.5), row.wait_percentile(0.95)
        records.append(
            [
                row.group,
                row.admissions,
                row.preemptions,
                None if p50 is None else round(p50, 1),
                None if p95 is None else round(p95, 1),
            ]
            + [round(hours.get(r, 0.0), 3) for r in resources]
            + _quota_cells(quota.get(row.group, {}), quota_resources)
        )
    if fmt == "json":
        return json.dumps([dict(zip(header, r, strict=True)) for r in records], indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(["" if v is None else v for v in r] for r in records)
        return out.getvalue()
    return _table(header, records)


def _hours_column(resource: str, what: str) -> str:
    from phalanx.store import report

    unit = report.resource_unit(resource)[0]
    return f"{resource}_{what}" + (f"_{unit}" if unit else "")


def _quota_cells(per_resource: dict[str, Any], resources: list[str]) -> list[Any]:
    """Quota hours, the percentage of it used, borrowed hours, per resource; None (shown as
    '-') where the store holds no quota of the ClusterQueue for the window."""
    from phalanx.store import report

    cells: list[Any] = []
    for r in resources:
        use = per_resource.get(r)
        scale = 3600 * report.resource_unit(r)[1]
        if use is None or use.quota <= 0:
            cells += [None, None, None if use is None else round(use.borrowed / scale, 3)]
            continue
        share = use.used_share
        cells += [
            round(use.quota / scale, 3),
            None if share is None else round(100 * share, 1),
            round(use.borrowed / scale, 3),
        ]
    return cells


def _plot(engine: Any, *, since: dt.timedelta, by: str, path: Path) -> int:
    from phalanx.store import plot

    until = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    data = plot.series(engine, since=until - since, until=until, by=by)
    try:
        plot.draw(data, path)
    except plot.PlotUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"plot: {path} ({data.label} per {by})", file=sys.stderr)
    return 0


def _timeline(engine: Any, *, namespace: str, name: str, fmt: str) -> str:
    from phalanx.quotas.quantity import format_quantity
    from phalanx.store import report

    entries = report.timeline(engine, namespace=namespace, name=name)
    if fmt == "json":
        return (
            json.dumps(
                [
                    {
                        "at": e.at.isoformat() + "Z",
                        "uid": e.uid,
                        "transition": e.transition,
                        "clusterQueue": e.cluster_queue,
                        "localQueue": e.local_queue,
                        "reason": e.reason,
                        "message": e.message,
                        "flavors": e.flavors,
                        "topology": e.topology,
                        "resources": [
                            {"podSet": p, "resource": r, "flavor": f, "amount": a}
                            for p, r, f, a in e.resources
                        ],
                    }
                    for e in entries
                ],
                indent=2,
            )
            + "\n"
        )
    if not entries:
        return f"no stored events for {namespace}/{name}\n"
    records = [
        [
            e.at.isoformat(timespec="seconds") + "Z",
            e.transition,
            e.cluster_queue or "",
            e.reason or "",
            ", ".join(
                f"{p}:{r}={format_quantity(a, resource=r)}@{f}" for p, r, f, a in e.resources
            ),
            (e.message or "")[:80],
        ]
        for e in entries
    ]
    uids = sorted({e.uid for e in entries})
    title = f"{namespace}/{name} uid={','.join(uids)}\n"
    return title + _table(
        ["time", "transition", "clusterQueue", "reason", "held", "message"], records
    )


def _table(header: list[str], records: list[list[Any]]) -> str:
    cells = [header] + [["-" if v is None else str(v) for v in r] for r in records]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in cells
    )
