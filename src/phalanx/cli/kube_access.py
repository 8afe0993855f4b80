"""What the user-facing verbs share: finding credentials as kubectl does and reporting the
API's refusals in words.

``--kubeconfig`` and ``--context`` as kubectl takes them; without them ``$KUBECONFIG``, the
in-cluster ServiceAccount, then ``~/.kube/config``; the namespace is ``-n`` or the context's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_connection_args", "connect", "refusal"]


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="the kubeconfig file (as kubectl finds it by default)")
    parser.add_argument("--context", help="the kubeconfig context to use")


def connect(args: argparse.Namespace) -> Any | None:
    """The credentials ``args`` name (an ``operator.kubeconfig`` auth), or None after saying
    on stderr why they cannot be loaded."""
    from phalanx.operator import kubeconfig

    try:
        return kubeconfig.load(args.kubeconfig, context=args.context)
    except (kubeconfig.KubeconfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return None


def refusal(error: Any, *, what: str, role: str) -> str:
    """One line for an ``ApiError`` from the operator's aggregated API, saying what to do."""
    status = getattr(error, "status", 0)
    if status == 403:
        return f"error: {what}: forbidden ({error}); ask for the ClusterRole {role} (a RoleBinding)"
    if status == 503:
        return (
            f"error: {what}: the operator cannot answer now ({error}); it answers once its"
            " scheduling replica has synced: retry"
        )
    if status == 404 and "the server could not find the requested resource" in str(error):
        return (
            f"error: {what}: the API server does not serve it ({error}); install Phalanx's"
            " APIService v1alpha1.visibility.phalanx.kueue.x-k8s.io (manifests/controller)"
        )
    return f"error: {what}: {error}"
