"""``phalanx store``: migrate the usage history store (the operator also migrates at start)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB (default: $PHALANX_STORE, "
        "else sqlite:///~/.local/state/phalanx/store.db)",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "store",
        help="migrate the usage history store (docs/store.md)",
        description="Apply or revert the store's schema migrations, or print its revision.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = actions.add_parser("upgrade", help="apply the migrations (to head by default)")
    upgrade.add_argument("revision", nargs="?", default="head")
    downgrade = actions.add_parser("downgrade", help="revert to REVISION (base: empty)")
    downgrade.add_argument("revision")
    actions.add_parser("current", help="print the store's revision and the shipped head")
    bench = actions.add_parser(
        "bench",
        help="fill a store with synthetic rows (REPLACING its contents) and time the reports",
    )
    bench.add_argument("--rows", type=int, default=1_000_000, help="lifecycle rows (1,000,000)")
    bench.add_argument(
        "--reuse", action="store_true", help="time the reports on the rows already there"
    )
    write = actions.add_parser(
        "bench-write",
        help="write a baseline-shaped run through the operator's history writer into an empty"
        " store and print the writer's CPU per Workload",
    )
    write.add_argument(
        "--workloads", type=int, default=15_000, help="Workloads, 1 to 15,000 (15,000)"
    )
    write.add_argument(
        "--onto-existing",
        action="store_true",
        help="write into a store that already holds history (on a copy of yours: the bench's"
        " Workloads stay in it), to measure what its size costs the writer",
    )
    write.add_argument(
        "--profile",
        metavar="FILE",
        default=None,
        help="save cProfile's statistics (CPU time; the writes then run on the event loop's"
        " thread) to FILE and print the top functions",
    )
    for sub in (upgrade, downgrade, actions.choices["current"], bench, write):
        add_store_argument(sub)
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
        if args.action == "bench-write":
            return _bench_write(
                url,
                workloads=args.workloads,
                profile=args.profile,
                onto_existing=args.onto_existing,
            )
        engine = db.open_engine(url)
        if args.action == "upgrade":
            db.upgrade(engine, args.revision)
        elif args.action == "downgrade":
            db.downgrade(engine, args.revision)
        elif args.action == "bench":
            return _bench(engine, rows=args.rows, reuse=args.reuse)
        print(f"revision={db.current_revision(engine) or 'base'} head={db.head_revision()}")
    except db.StoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the database's own error says what is wrong with it
        print(f"error: store {url!r}: {error}", file=sys.stderr)
        return 1
    return 0


def _bench(engine: Any, *, rows: int, reuse: bool) -> int:
    import json

    from phalanx.bench import store_rows
    from phalanx.store import db

    db.upgrade(engine)
    result: dict[str, Any] = {"backend": engine.dialect.name}
    if not reuse:
        written, seconds = store_rows.fill(engine, rows=rows)
        result |= {"rows": written, "fill_seconds": round(seconds, 1)}
    cpu: dict[str, float] = {}
    result["report_usage_since_30d_seconds"] = store_rows.measure(engine, cpu=cpu)
    result["report_usage_cpu_seconds"] = cpu
    print(json.dumps(result))
    return 0


def _bench_write(url: str, *, workloads: int, profile: str | None, onto_existing: bool) -> int:
    import json
    from pathlib import Path

    from phalanx.bench import store_write

    if not 1 <= workloads <= store_write.MAX_WORKLOADS:
        print(
            f"error: --workloads {workloads}: give 1 to {store_write.MAX_WORKLOADS:,}"
            " (the baseline scenario's size)",
            file=sys.stderr,
        )
        return 2
    saved = Path(profile) if profile else None
    result = store_write.run(url, workloads=workloads, profile=saved, onto_existing=onto_existing)
    print(json.dumps(result.to_json()))
    if saved is not None:
        print(store_write.top_of_profile(saved), file=sys.stderr)
    return 0
