"""Credentials for talking to one Kubernetes API server: a kubeconfig or in-cluster.

Phalanx has two API clients in one process: kopf's (for the webhooks' configurations and
login) and its own lean aiohttp client (informers and writes). Both must use the same
credentials, so they are resolved once here into a :class:`ClusterAuth` and handed to each.

Supported, as kubectl does: client certificates and bearer tokens, inline (``*-data``) or as
files; ``tokenFile`` (re-read, since whoever writes it rotates it); ``exec`` plugins
(:mod:`phalanx.operator.exec_credential`: EKS, GKE, AKS, OIDC helpers), whose credential is
cached until its ``expirationTimestamp`` or until the API server answers 401; several files in
``$KUBECONFIG`` (merged, the first to name an entry wins); and the in-cluster service account
(token re-read, as kubelet rotates it). The legacy ``auth-provider`` entries are refused with
a message, as current kubectl does.

The in-cluster folder is ``/var/run/secrets/kubernetes.io/serviceaccount``;
``$PHALANX_SERVICE_ACCOUNT_DIR`` replaces it (tests, or a token projected elsewhere).

The ``kubernetes`` package's loader is not used: it serves its own synchronous client (its
``Configuration`` points at temporary certificate files), and re-running a plugin after a 401
is not part of its public API.
"""

from __future__ import annotations

import base64
import datetime
import os
import ssl
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phalanx.operator.exec_credential import (
    ExecCredential,
    ExecPlugin,
    ExecPluginError,
    run_exec_plugin,
)

__all__ = [
    "SERVICE_ACCOUNT_DIR_ENV",
    "ClusterAuth",
    "KubeconfigError",
    "in_cluster",
    "in_cluster_available",
    "load",
    "load_kubeconfig",
    "service_account_dir",
]

SERVICE_ACCOUNT_DIR_ENV = "PHALANX_SERVICE_ACCOUNT_DIR"
_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# client-go re-reads a token file once a minute (CachedFileTokenSource).
_TOKEN_REREAD_SECONDS = 60.0


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the entry and what to do."""


class _Credentials:
    """The mutable part of a :class:`ClusterAuth`: what was read or run, and when.

    Shared by threads (kopf runs its login handler in a worker thread; the operator refreshes
    exec credentials in one), so every access holds the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.file_token: str | None = None
        self.file_read_at: float | None = None
        self.exec: ExecCredential | None = None
        self.execs = 0
        self.contexts: weakref.WeakSet[ssl.SSLContext] = weakref.WeakSet()


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
    exec_plugin: ExecPlugin | None = None
    default_namespace: str = "default"
    _state: _Credentials = field(default_factory=_Credentials, compare=False, repr=False)

    # -- the current credential --------------------------------------------------------------------

    def bearer_token(self) -> str | None:
        """The token to send now: a token file is re-read at most once a minute, an exec
        plugin is run when there is no cached credential or it has expired (blocking: call
        :meth:`refresh` from a thread first when :meth:`refresh_due`)."""
        if self.exec_plugin is not None:
            return self._exec_credential().token
        if self.token_file is None:
            return self.token
        with self._state.lock:
            state = self._state
            now = time.monotonic()
            if state.file_read_at is None or now - state.file_read_at >= _TOKEN_REREAD_SECONDS:
                state.file_token = self._read_token_file()
                state.file_read_at = now
            return state.file_token

    def client_certificate(self) -> tuple[bytes, bytes] | None:
        """The client certificate and key (PEM) to present, from the kubeconfig or the plugin."""
        if self.exec_plugin is not None:
            cred = self._exec_credential()
            if cred.client_cert_data and cred.client_key_data:
                return cred.client_cert_data, cred.client_key_data
        if self.client_cert_data is not None and self.client_key_data is not None:
            return self.client_cert_data, self.client_key_data
        return None

    def headers(self) -> dict[str, str]:
        token = self.bearer_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def expiration(self) -> datetime.datetime | None:
        """When the cached exec credential expires (UTC), if it says."""
        cred = self._state.exec
        return cred.expiration if cred is not None else None

    @property
    def exec_runs(self) -> int:
        """How often the exec plugin ran (for logs and tests)."""
        return self._state.execs

    def refresh_due(self) -> bool:
        """Whether the next :meth:`bearer_token` would run the plugin."""
        if self.exec_plugin is None:
            return False
        cred = self._state.exec
        return cred is None or cred.expired(_utcnow())

    def refresh(self) -> None:
        """Run the plugin now if its credential is missing or expired (blocking)."""
        if self.exec_plugin is not None:
            self._exec_credential()

    def invalidate(self, token: str | None) -> bool:
        """The API server answered 401 to a request carrying ``token``: forget it, so that the
        next request runs the plugin again or re-reads the token file (client-go does both).
        Returns whether there is anything new to try."""
        with self._state.lock:
            state = self._state
            if self.exec_plugin is not None:
                cred = state.exec
                if cred is not None and (token is None or cred.token == token):
                    state.exec = None
                return True
            if self.token_file is not None:
                state.file_read_at = None
                return True
        return False

    def _exec_credential(self) -> ExecCredential:
        assert self.exec_plugin is not None
        with self._state.lock:
            state = self._state
            if state.exec is None or state.exec.expired(_utcnow()):
                cred = run_exec_plugin(self.exec_plugin)
                state.execs += 1
                state.exec = cred
                if cred.client_cert_data and cred.client_key_data:
                    # Connections opened from now on present the new certificate.
                    for context in list(state.contexts):
                        _load_cert_chain(context, cred.client_cert_data, cred.client_key_data)
            return state.exec

    def _read_token_file(self) -> str:
        assert self.token_file is not None
        try:
            return Path(self.token_file).read_text().strip()
        except OSError as error:
            raise KubeconfigError(
                f"token file {self.token_file}: cannot read it ({error})"
            ) from error

    # -- TLS ---------------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext | bool:
        """An SSL context for aiohttp (``False`` disables verification, as the kubeconfig asks).

        A client certificate from an exec plugin is reloaded into this context whenever the
        plugin runs again, so a long-lived connection pool keeps working."""
        if not self.server.startswith("https"):
            return False
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH)
        if self.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None:
            context.load_verify_locations(cadata=self.ca_data.decode("ascii"))
        pair = self.client_certificate()
        if pair is not None:
            _load_cert_chain(context, *pair)
        if self.exec_plugin is not None:
            self._state.contexts.add(context)
        return context


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # The ssl module loads key pairs only from files; keep them on disk for the call only.
    with tempfile.TemporaryDirectory(prefix="phalanx-tls-") as tmp:
        cert_file = Path(tmp) / "client.crt"
        key_file = Path(tmp) / "client.key"
        key_file.touch(mode=0o600)
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        context.load_cert_chain(str(cert_file), str(key_file))


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# -- resolving -------------------------------------------------------------------------------------


def service_account_dir() -> Path:
    """The in-cluster credentials' folder (``$PHALANX_SERVICE_ACCOUNT_DIR`` overrides it)."""
    override = os.environ.get(SERVICE_ACCOUNT_DIR_ENV)
    return Path(override) if override else _SA_DIR


def in_cluster_available() -> bool:
    """Whether this process runs with in-cluster credentials: ``$KUBERNETES_SERVICE_HOST``
    set and a service-account token mounted."""
    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and (service_account_dir() / "token").exists()
    )


def load(
    kubeconfig: str | os.PathLike[str] | None = None, *, context: str | None = None
) -> ClusterAuth:
    """Resolve credentials the way kubectl does: explicit path, ``$KUBECONFIG``, in-cluster,
    then ``~/.kube/config``."""
    if kubeconfig is not None:
        return load_kubeconfig(kubeconfig, context=context)
    env = os.environ.get("KUBECONFIG")
    if env:
        paths = [p for p in env.split(os.pathsep) if p]
        return load_kubeconfig(*paths, context=context)
    if in_cluster_available():
        return in_cluster()
    return load_kubeconfig(Path.home() / ".kube" / "config", context=context)


def in_cluster() -> ClusterAuth:
    """The pod's service account: ``$KUBERNETES_SERVICE_HOST``/``_PORT``, and the token, CA and
    namespace files kubelet mounts (the token is re-read: kubelet rotates it)."""
    directory = service_account_dir()
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise KubeconfigError(
            "in-cluster credentials: $KUBERNETES_SERVICE_HOST is not set; "
            "pass --kubeconfig or set $KUBECONFIG"
        )
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        ca_data = (directory / "ca.crt").read_bytes()
    except OSError as error:
        raise KubeconfigError(
            f"in-cluster credentials: cannot read {directory / 'ca.crt'} ({error}); is the "
            "service-account token mounted (automountServiceAccountToken)?"
        ) from error
    namespace_file = directory / "namespace"
    return ClusterAuth(
        server=f"https://{host}:{port}",
        ca_data=ca_data,
        token_file=str(directory / "token"),
        default_namespace=(
            namespace_file.read_text().strip() if namespace_file.exists() else "default"
        ),
    )


def load_kubeconfig(*paths: str | os.PathLike[str], context: str | None = None) -> ClusterAuth:
    """One context of a kubeconfig; with several files, merged as kubectl merges
    ``$KUBECONFIG`` (the first file to set a value or name an entry wins)."""
    files = [Path(p).expanduser() for p in paths]
    merged = _merge(files)
    shown = ", ".join(str(f) for f in files)
    context_name = context or merged.current_context
    if not context_name:
        raise KubeconfigError(f"kubeconfig {shown}: no current-context; pass --context")
    ctx, _ = merged.find("contexts", context_name, shown)
    ctx = ctx.get("context") or {}
    cluster_entry, cluster_base = merged.find("clusters", ctx.get("cluster"), shown)
    cluster = dict(cluster_entry.get("cluster") or {})
    user_name = ctx.get("user")
    user_entry, user_base = merged.find("users", user_name, shown)
    user = user_entry.get("user") or {}
    where = f"kubeconfig {shown}: users[{user_name}]"
    if "auth-provider" in user:
        raise KubeconfigError(
            f"{where} uses an auth-provider, which kubectl no longer runs either; use the "
            "provider's exec plugin (e.g. gke-gcloud-auth-plugin, kubelogin)"
        )
    if user.get("username") or user.get("password"):
        raise KubeconfigError(f"{where} uses basic auth, which Phalanx does not send")
    if not cluster.get("server"):
        raise KubeconfigError(f"kubeconfig {shown}: clusters[{ctx.get('cluster')}] has no server")
    ca_data = _data_or_file(cluster, "certificate-authority", cluster_base)
    exec_plugin = None
    if user.get("exec"):
        exec_cluster = dict(cluster)
        if ca_data is not None:
            exec_cluster["certificate-authority-data"] = base64.b64encode(ca_data).decode()
        try:
            exec_plugin = ExecPlugin.from_kubeconfig(
                user["exec"], user=str(user_name), base_dir=user_base, cluster=exec_cluster
            )
        except ExecPluginError as error:
            raise KubeconfigError(f"kubeconfig {shown}: {error}") from error
    token_file = user.get("tokenFile")
    return ClusterAuth(
        server=str(cluster["server"]).rstrip("/"),
        ca_data=ca_data,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_data=_data_or_file(user, "client-certificate", user_base),
        client_key_data=_data_or_file(user, "client-key", user_base),
        token=user.get("token") or None,
        # kubectl: a static token wins over tokenFile.
        token_file=str(user_base / token_file) if token_file and not user.get("token") else None,
        exec_plugin=exec_plugin,
        default_namespace=ctx.get("namespace") or "default",
    )


@dataclass
class _Merged:
    current_context: str | None = None
    entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = field(default_factory=dict)

    def find(self, section: str, name: Any, shown: str) -> tuple[dict[str, Any], Path]:
        found = self.entries.get(section, {}).get(str(name))
        if found is None:
            raise KubeconfigError(f"kubeconfig {shown}: {section} has no entry named {name!r}")
        return found


def _merge(files: list[Path]) -> _Merged:
    merged = _Merged()
    readable = 0
    for path in files:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            if len(files) > 1:
                continue  # kubectl skips missing files in $KUBECONFIG
            raise KubeconfigError(f"kubeconfig {path}: no such file") from None
        except (OSError, yaml.YAMLError) as error:
            raise KubeconfigError(f"kubeconfig {path}: cannot read it ({error})") from error
        readable += 1
        merged.current_context = merged.current_context or config.get("current-context")
        for section in ("contexts", "clusters", "users"):
            named = merged.entries.setdefault(section, {})
            for entry in config.get(section) or ():
                # Relative paths in an entry are relative to the file that holds it.
                named.setdefault(str(entry.get("name")), (dict(entry), path.parent))
    if not readable:
        raise KubeconfigError(f"kubeconfig {', '.join(map(str, files))}: none of them exists")
    return merged


def _data_or_file(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(str(data))
    file = entry.get(key)
    if file:
        try:
            return (base / str(file)).read_bytes()
        except OSError as error:
            raise KubeconfigError(f"kubeconfig: {key} {file}: cannot read it ({error})") from error
    return None
