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
    for sub in (upgrade, downgrade, actions.choices["current"]):
        add_store_argument(sub)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from phalanx.store import db

    url = args.store or db.default_url()
    try:
        engine = db.open_engine(url)
        if args.action == "upgrade":
            db.upgrade(engine, args.revision)
        elif args.action == "downgrade":
            db.downgrade(engine, args.revision)
        print(f"revision={db.current_revision(engine) or 'base'} head={db.head_revision()}")
    except db.StoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the database's own error says what is wrong with it
        print(f"error: store {url!r}: {error}", file=sys.stderr)
        return 1
    return 0
