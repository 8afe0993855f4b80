"""Credentials for talking to one Kubernetes API server: a kubeconfig file or in-cluster.

Phalanx has two API clients in one process: kopf's (for the admin kinds) and its own lean
aiohttp client (for the informer and writes). Both must use the same credentials, so they
are resolved once here into a frozen :class:`ClusterAuth` and handed to each.

Supported: client certificates and bearer tokens, inline (``*-data``) or as files, and the
in-cluster service account (whose token file is re-read because kubelet rotates it).
Exec/auth-provider plugins are not supported; the error says so.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ClusterAuth", "KubeconfigError", "in_cluster", "load", "load_kubeconfig"]

_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TOKEN_REREAD_SECONDS = 60.0


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the entry and what to do."""


@dataclass(frozen=True)
class ClusterAuth:
    """Everything needed to open an authenticated connection to one API server."""

    server: str
    ca_data: bytes | None = None
    insecure_skip_tls_verify: bool = False
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    default_namespace: str = "default"
    _token_cache: list[Any] = field(default_factory=list, compare=False, repr=False)

    def bearer_token(self) -> str | None:
        """The current token; a token file is re-read at most once a minute (rotation)."""
        if self.token_file is None:
            return self.token
        now = time.monotonic()
        if self._token_cache and now - self._token_cache[0] < _TOKEN_REREAD_SECONDS:
            token: str = self._token_cache[1]
            return token
        token = Path(self.token_file).read_text().strip()
        self._token_cache[:] = [now, token]
        return token

    def headers(self) -> dict[str, str]:
        token = self.bearer_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        """An SSL context for aiohttp (``False`` disables verification, as the kubeconfig asks)."""
        if not self.server.startswith("https"):
            return False
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH)
        if self.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None:
            context.load_verify_locations(cadata=self.ca_data.decode("ascii"))
        if self.client_cert_data is not None and self.client_key_data is not None:
            # The ssl module loads key pairs only from files; keep them on disk for the call only.
            with tempfile.TemporaryDirectory(prefix="phalanx-tls-") as tmp:
                cert = Path(tmp) / "client.crt"
                key = Path(tmp) / "client.key"
                cert.write_bytes(self.client_cert_data)
                key.write_bytes(self.client_key_data)
                key.chmod(0o600)
                context.load_cert_chain(str(cert), str(key))
        return context


def load(
    kubeconfig: str | os.PathLike[str] | None = None, *, context: str | None = None
) -> ClusterAuth:
    """Resolve credentials the way kubectl does: explicit path, ``$KUBECONFIG``, in-cluster,
    then ``~/.kube/config``."""
    if kubeconfig is not None:
        return load_kubeconfig(kubeconfig, context=context)
    env = os.environ.get("KUBECONFIG")
    if env:
        return load_kubeconfig(env.split(os.pathsep)[0], context=context)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (_SA_DIR / "token").exists():
        return in_cluster()
    return load_kubeconfig(Path.home() / ".kube" / "config", context=context)


def in_cluster() -> ClusterAuth:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    namespace_file = _SA_DIR / "namespace"
    return ClusterAuth(
        server=f"https://{host}:{port}",
        ca_data=(_SA_DIR / "ca.crt").read_bytes(),
        token_file=str(_SA_DIR / "token"),
        default_namespace=(
            namespace_file.read_text().strip() if namespace_file.exists() else "default"
        ),
    )


def load_kubeconfig(path: str | os.PathLike[str], *, context: str | None = None) -> ClusterAuth:
    path = Path(path).expanduser()
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise KubeconfigError(f"kubeconfig {path}: cannot read it ({error})") from error
    base = path.parent
    context_name = context or config.get("current-context")
    if not context_name:
        raise KubeconfigError(f"kubeconfig {path}: no current-context; pass --context")
    ctx = _named(config, "contexts", context_name, path)["context"]
    cluster = _named(config, "clusters", ctx["cluster"], path)["cluster"]
    user = _named(config, "users", ctx["user"], path).get("user") or {}
    if "exec" in user or "auth-provider" in user:
        raise KubeconfigError(
            f"kubeconfig {path}: users[{ctx['user']}] uses an exec/auth-provider plugin, which "
            "Phalanx does not run; use a client certificate or a token"
        )
    return ClusterAuth(
        server=str(cluster["server"]).rstrip("/"),
        ca_data=_data_or_file(cluster, "certificate-authority", base),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_data=_data_or_file(user, "client-certificate", base),
        client_key_data=_data_or_file(user, "client-key", base),
        token=user.get("token"),
        token_file=str(base / user["tokenFile"]) if user.get("tokenFile") else None,
        default_namespace=ctx.get("namespace") or "default",
    )


def _named(config: dict[str, Any], section: str, name: str, path: Path) -> dict[str, Any]:
    for entry in config.get(section) or ():
        if entry.get("name") == name:
            return dict(entry)
    raise KubeconfigError(f"kubeconfig {path}: {section} has no entry named {name!r}")


def _data_or_file(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(str(data))
    file = entry.get(key)
    if file:
        return (base / str(file)).read_bytes()
    return None
