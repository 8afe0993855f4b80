"""The identity of the operator a benchmark starts on the local control plane.

An installed operator talks to the API server as its ServiceAccount, with a bound token
(``manifests/``, the Helm chart). The local control plane's admin kubeconfig holds a client
certificate instead, and kube-apiserver checks a client certificate's ECDSA signature chain on
every request, where a token is checked once and then found in its token cache (10 s). A
benchmark of the operator under the admin's certificate would measure an API-server cost no
installed operator has: in a baseline run that was 6.6 % of the API server's CPU, half of it
the operator's requests.

:func:`operator_kubeconfig` gives the benchmark's operator the installed identity's kind: a
ServiceAccount of its own (``kube-system/phalanx-bench-operator``, bound to ``cluster-admin``
because the benchmark also lets it install CRDs and webhook configurations), a token from the
TokenRequest API, and a kubeconfig beside the admin's that names the same cluster. The users of
the benchmark (its creates and finishes) keep the admin's certificate, as Kueue's runner keeps
envtest's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster.kubeconfig import write_private_yaml
from phalanx.operator.kube import ApiError, KubeApi, Resource

__all__ = ["OPERATOR_ACCOUNT", "TOKEN_SECONDS", "operator_kubeconfig"]

OPERATOR_ACCOUNT = ("kube-system", "phalanx-bench-operator")
TOKEN_SECONDS = 24 * 3600
"""A day: longer than any benchmark; each run asks for a fresh token."""

SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts")
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", namespaced=False
)


async def _create_or_keep(
    api: KubeApi, resource: Resource, body: dict[str, Any], *, namespace: str | None = None
) -> None:
    try:
        await api.create(resource, body, namespace=namespace)
    except ApiError as error:
        if error.status != 409:  # already there from an earlier run: keep it
            raise


async def operator_kubeconfig(api: KubeApi, admin: Path) -> Path:
    """Create (or keep) the benchmark operator's ServiceAccount and its binding, ask for a
    token, and write ``phalanx-bench-operator.yaml`` beside ``admin`` (same folder, so the
    operators started with it share the cluster's webhook endpoint): ``admin`` with its user
    replaced by the token. ``api`` is the admin's client."""
    namespace, name = OPERATOR_ACCOUNT
    await _create_or_keep(
        api,
        SERVICE_ACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        namespace=namespace,
    )
    await _create_or_keep(
        api,
        CLUSTER_ROLE_BINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    review = await api.request(
        "POST",
        SERVICE_ACCOUNTS.path(namespace=namespace, name=name) + "/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_SECONDS},
        },
    )
    token = (review.get("status") or {}).get("token")
    if not token:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} answered without a token")
    config = with_token(yaml.safe_load(admin.read_text()), token, name)
    return write_private_yaml(admin.parent / f"{name}.yaml", config)


def with_token(config: dict[str, Any], token: str, user: str) -> dict[str, Any]:
    """``config`` (a kubeconfig) whose current context authenticates as ``user`` by
    ``token``; its cluster entries (server, CA) unchanged."""
    current = config["current-context"]
    contexts = [dict(c) for c in config.get("contexts") or ()]
    for entry in contexts:
        if entry.get("name") == current:
            entry["context"] = {**entry["context"], "user": user}
            break
    else:
        raise ValueError(f"kubeconfig has no context named {current!r}")
    return {
        **config,
        "contexts": contexts,
        "users": [{"name": user, "user": {"token": token}}],
    }
