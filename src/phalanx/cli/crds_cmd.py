"""``phalanx crds``: write the CustomResourceDefinitions of the served kinds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from phalanx.api.crds import write_crds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "crds",
        help="write the CRDs (apiextensions.k8s.io/v1) of the seven Kueue v1beta2 kinds",
        description="Generate one CustomResourceDefinition file per kind from Phalanx's API"
        " models. The repository's crds/ folder is exactly this output (make crds).",
    )
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder to write kueue.x-k8s.io_<plural>.yaml files into (created if missing)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for path in write_crds(args.output):
        print(path)
    return 0
