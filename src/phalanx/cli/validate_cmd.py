"""``phalanx validate``: check Kueue manifests offline, as the API server and Phalanx would."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from phalanx.api.loader import Document, check_manifests


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check kueue.x-k8s.io/v1beta2 manifests offline",
        description="Check every object of the given multi-document YAML files against"
        " Phalanx's API: schema, defaults, and the cross-field rules the API server enforces."
        " Prints one line per error, FILE: KIND/NAME: field.path: message, and exits 1 if"
        " there is any.",
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest file to check; repeat for several, '-' reads standard input",
    )
    parser.add_argument(
        "--ignore-other-kinds",
        action="store_true",
        help="skip objects outside kueue.x-k8s.io (Namespaces, Jobs...) instead of failing",
    )
    parser.set_defaults(func=run)


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    return Path(name).read_text(encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    objects = skipped = errors = 0
    for name in args.filename:
        source = "<stdin>" if name == "-" else name
        try:
            text = _read(name)
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{source}: cannot read: {exc}")
            errors += 1
            continue
        documents = check_manifests(text, ignore_other_kinds=args.ignore_other_kinds)
        for document in documents:
            errors += _report(source, document)
            objects += 0 if document.skipped else 1
            skipped += 1 if document.skipped else 0
    if errors:
        print(f"{errors} error(s) in {len(args.filename)} file(s)", file=sys.stderr)
        return 1
    note = f", {skipped} other object(s) skipped" if skipped else ""
    print(f"OK: {objects} object(s) in {len(args.filename)} file(s) are valid{note}")
    return 0


def _report(source: str, document: Document) -> int:
    for error in document.errors:
        where = f"{error.path}: " if error.path else ""
        print(f"{source}: {document.label}: {where}{error.message}")
    return len(document.errors)
