"""Kubeconfig files for the devcluster's identities.

Certificates are embedded (``*-data``) rather than referenced by path, so a kubeconfig can be
copied elsewhere and still work while the cluster runs.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster.pki import CertPair

CLUSTER_NAME = "phalanx-dev"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render_kubeconfig(*, server: str, ca_cert: Path, client: CertPair, user: str) -> dict[str, Any]:
    context = f"{user}@{CLUSTER_NAME}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": context,
    }


def write_kubeconfig(
    path: Path, *, server: str, ca_cert: Path, client: CertPair, user: str
) -> Path:
    """Write a kubeconfig (mode 0600: it holds a private key) and return its path."""
    doc = render_kubeconfig(server=server, ca_cert=ca_cert, client=client, user=user)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_private_yaml(path, doc)


def write_private_yaml(path: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to ``path`` readable by its owner alone (it holds a key or a token):
    created with mode 0600 beside it, then renamed over it, so no reader ever sees the
    secret under a looser mode or the file half written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # an earlier crash's leftover keeps the mode it had
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(doc, handle, sort_keys=False)
    os.replace(tmp, path)
    return path
