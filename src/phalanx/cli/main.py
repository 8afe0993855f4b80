"""The ``phalanx`` command: one subcommand per module of ``phalanx.cli``.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed namespace and returning the exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from phalanx import __version__
from phalanx.cli import (
    bench_cmd,
    completion_cmd,
    crds_cmd,
    dashboard_cmd,
    demo_cmd,
    devcluster_cmd,
    explain_cmd,
    list_cmd,
    operator_cmd,
    plugin_cmd,
    report_cmd,
    simulate_cmd,
    store_cmd,
    top_cmd,
    validate_cmd,
    whatif_cmd,
)

# Subcommand modules, in the order `phalanx --help` lists them.
_COMMANDS = (
    bench_cmd,
    crds_cmd,
    devcluster_cmd,
    operator_cmd,
    demo_cmd,
    validate_cmd,
    list_cmd,
    explain_cmd,
    whatif_cmd,
    top_cmd,
    plugin_cmd,
    completion_cmd,
    dashboard_cmd,
    report_cmd,
    store_cmd,
    simulate_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Kueue-compatible gang admission and topology-aware placement.",
    )
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == [completion_cmd.COMMAND]:
        # The shell completion scripts' hidden entry point: candidates, one per line.
        print("\n".join(completion_cmd.complete(build_parser(), words[1:])))
        return 0
    args = build_parser().parse_args(words)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
