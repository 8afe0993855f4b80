"""``phalanx dashboard``: the read-only web dashboard on a workstation.

It watches the cluster with the kubeconfig's credentials and serves the same pages as the
operator's ``--dashboard-port``. By default every request needs a bearer token, reviewed by
the API server (TokenReview, SubjectAccessReview per view): the kubeconfig's identity must
be allowed to create tokenreviews and subjectaccessreviews. ``--insecure-local`` serves
everything the kubeconfig's identity can read without a token, on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="serve the read-only web dashboard from a workstation",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--kubeconfig", help="the kubeconfig file (as kubectl finds it by default)")
    parser.add_argument("--context", help="the kubeconfig context to use")
    parser.add_argument("--port", type=int, default=8090, help="port to serve on (8090)")
    parser.add_argument("--listen", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    add_tls_arguments(parser, prefix="")
    parser.add_argument(
        "--insecure-local",
        action="store_true",
        help="no token needed: show what the kubeconfig's identity can read (127.0.0.1 only)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="the usage history store the operator writes (its --store: sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DB), for the Usage view; without it the view says so",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (INFO)")
    parser.set_defaults(func=run)


def add_tls_arguments(parser: argparse.ArgumentParser, *, prefix: str) -> None:
    parser.add_argument(
        f"--{prefix}cert-dir",
        type=Path,
        default=None,
        help="serve HTTPS with tls.crt and tls.key from this folder (needed to listen "
        "on an address other than loopback)",
    )


def tls_context(folder: Path | None, flag: str) -> ssl.SSLContext | None:
    """An HTTPS context from ``folder``/tls.crt and tls.key; ValueError naming ``flag``."""
    if folder is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"{flag} {folder}: cannot load tls.crt and tls.key: {error}") from error
    return context


def run(args: argparse.Namespace) -> int:
    from phalanx.operator import kubeconfig
    from phalanx.store import db

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    if not 0 < args.port < 65536:
        print(f"error: --port {args.port}: must be between 1 and 65535", file=sys.stderr)
        return 2
    try:
        auth = kubeconfig.load(args.kubeconfig, context=args.context)
        context = tls_context(args.cert_dir, "--cert-dir")
        if args.store:
            db.open_engine(args.store, create=False).dispose()  # a bad URL fails here
    except (kubeconfig.KubeconfigError, OSError, ValueError, db.StoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(args, auth, context))
    except KeyboardInterrupt:
        return 0
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


async def _serve(args: argparse.Namespace, auth: Any, context: ssl.SSLContext | None) -> int:
    from phalanx.dashboard.server import DashboardServer
    from phalanx.operator.kube import KubeApi

    api = KubeApi(auth)
    try:
        server = DashboardServer(
            api,
            listen=args.listen,
            port=args.port,
            insecure_local=args.insecure_local,
            ssl_context=context,
            store_url=args.store,
        )
        await server.start()
        scheme = "https" if context else "http"
        print(f"dashboard on {scheme}://{args.listen}:{args.port}/ (Ctrl-C stops it)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()
    finally:
        await api.close()
    return 0
