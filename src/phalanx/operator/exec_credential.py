"""kubeconfig ``exec`` plugins: run the command, read the ExecCredential it prints.

This is how EKS (``aws eks get-token``), GKE (``gke-gcloud-auth-plugin``), AKS (``kubelogin``)
and OIDC helpers hand out credentials. The protocol is client-go's
(``client.authentication.k8s.io/v1`` and ``v1beta1``): the plugin gets the request in
``$KUBERNETES_EXEC_INFO`` and prints an ExecCredential whose ``status`` holds a bearer token or
a client certificate, with an optional ``expirationTimestamp``. The caller caches it until
then, or until the API server answers 401 (see :class:`phalanx.operator.kubeconfig.ClusterAuth`).

Phalanx runs as a daemon: a plugin never gets a terminal. One whose ``interactiveMode`` is
``Always`` is refused with a message; ``IfAvailable`` is told it is not interactive.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["API_VERSIONS", "ExecCredential", "ExecPlugin", "ExecPluginError", "run_exec_plugin"]

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")

# client-go sets no timeout; a plugin that hangs would hang the operator's login for good.
_TIMEOUT_SECONDS = 120.0


class ExecPluginError(ValueError):
    """The plugin cannot be run or printed no usable credential; the message says which user,
    what went wrong and what to do."""


@dataclass(frozen=True)
class ExecPlugin:
    """One kubeconfig ``users[].user.exec`` entry, with what the plugin may be told."""

    user: str
    command: str
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    interactive_mode: str = "IfAvailable"
    install_hint: str | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    cluster: Mapping[str, Any] | None = None
    """``spec.cluster`` of the request, when the entry sets ``provideClusterInfo``."""

    @classmethod
    def from_kubeconfig(
        cls,
        entry: Mapping[str, Any],
        *,
        user: str,
        base_dir: Path,
        cluster: Mapping[str, Any],
    ) -> ExecPlugin:
        where = f"users[{user}].exec"
        api_version = str(entry.get("apiVersion") or "")
        if api_version not in API_VERSIONS:
            raise ExecPluginError(
                f"{where}: apiVersion {api_version!r} is not supported; use one of "
                f"{', '.join(API_VERSIONS)}"
            )
        command = entry.get("command")
        if not command:
            raise ExecPluginError(f"{where}: command is empty")
        mode = entry.get("interactiveMode")
        if mode is None:
            if api_version.endswith("/v1"):
                # kubectl refuses the same entry: v1 made the field required.
                raise ExecPluginError(
                    f"{where}: interactiveMode must be set for {api_version} "
                    "(Never, IfAvailable or Always)"
                )
            mode = "IfAvailable"
        if mode not in ("Never", "IfAvailable", "Always"):
            raise ExecPluginError(
                f"{where}: interactiveMode {mode!r} is not Never, IfAvailable or Always"
            )
        if mode == "Always":
            raise ExecPluginError(
                f"{where}: interactiveMode Always needs a terminal, which Phalanx never has; "
                "use a plugin mode that works without one (Never or IfAvailable)"
            )
        env = tuple((str(e["name"]), str(e["value"])) for e in entry.get("env") or ())
        return cls(
            user=user,
            command=str(command),
            api_version=api_version,
            args=tuple(str(a) for a in entry.get("args") or ()),
            env=env,
            interactive_mode=str(mode),
            install_hint=entry.get("installHint"),
            base_dir=base_dir,
            cluster=_cluster_info(cluster) if entry.get("provideClusterInfo") else None,
        )

    def executable(self) -> str:
        """A command with a path separator is relative to the kubeconfig's folder (kubectl's
        rule); a bare name is looked up on ``$PATH``."""
        if os.sep in self.command or (os.altsep and os.altsep in self.command):
            return str(self.base_dir / self.command)
        found = shutil.which(self.command)
        if found is None:
            hint = f" {self.install_hint.strip()}" if self.install_hint else ""
            raise ExecPluginError(
                f"users[{self.user}].exec: command {self.command!r} not found on $PATH.{hint}"
            )
        return found


@dataclass(frozen=True)
class ExecCredential:
    """What a plugin printed: a token, or a client certificate and key (PEM)."""

    token: str | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None
    expiration: datetime.datetime | None = None
    """UTC; ``None``: valid until the API server refuses it."""

    def expired(self, now: datetime.datetime) -> bool:
        return self.expiration is not None and now >= self.expiration


def run_exec_plugin(plugin: ExecPlugin) -> ExecCredential:
    """Run the plugin once (blocking) and parse its ExecCredential."""
    request: dict[str, Any] = {
        "apiVersion": plugin.api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }
    if plugin.cluster is not None:
        request["spec"]["cluster"] = dict(plugin.cluster)
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(request)}
    where = f"users[{plugin.user}].exec ({plugin.command})"
    try:
        done = subprocess.run(
            [plugin.executable(), *plugin.args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError as error:
        hint = f" {plugin.install_hint.strip()}" if plugin.install_hint else ""
        raise ExecPluginError(f"{where}: cannot run it ({error}).{hint}") from error
    except subprocess.TimeoutExpired as error:
        raise ExecPluginError(
            f"{where}: no answer within {_TIMEOUT_SECONDS:g} s; a plugin that waits for "
            "input cannot work without a terminal"
        ) from error
    if done.returncode != 0:
        stderr = done.stderr.decode(errors="replace").strip()[-2000:]
        raise ExecPluginError(f"{where}: exited with code {done.returncode}: {stderr}")
    return parse_exec_credential(done.stdout, plugin=plugin)


def parse_exec_credential(output: bytes, *, plugin: ExecPlugin) -> ExecCredential:
    where = f"users[{plugin.user}].exec ({plugin.command})"
    try:
        document = json.loads(output)
    except ValueError as error:
        raise ExecPluginError(f"{where}: printed something that is not JSON ({error})") from error
    if not isinstance(document, dict) or document.get("kind") != "ExecCredential":
        raise ExecPluginError(f"{where}: printed no ExecCredential")
    if document.get("apiVersion") != plugin.api_version:
        raise ExecPluginError(
            f"{where}: printed apiVersion {document.get('apiVersion')!r}, but the kubeconfig "
            f"asks for {plugin.api_version!r}; make them the same"
        )
    status = document.get("status") or {}
    token = status.get("token") or None
    cert = status.get("clientCertificateData")
    key = status.get("clientKeyData")
    if bool(cert) != bool(key):
        raise ExecPluginError(
            f"{where}: status has one of clientCertificateData and clientKeyData; both are needed"
        )
    if not token and not cert:
        raise ExecPluginError(f"{where}: status has neither a token nor a client certificate")
    expiration = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expiration = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError as error:
            raise ExecPluginError(
                f"{where}: expirationTimestamp {stamp!r} is not an RFC 3339 time"
            ) from error
        if expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=datetime.UTC)
    return ExecCredential(
        token=str(token) if token else None,
        client_cert_data=str(cert).encode() if cert else None,
        client_key_data=str(key).encode() if key else None,
        expiration=expiration,
    )


def _cluster_info(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """``spec.cluster`` as client-go builds it from the kubeconfig's cluster entry."""
    info: dict[str, Any] = {"server": cluster.get("server")}
    # The loader has already read a certificate-authority file into the -data form.
    ca = cluster.get("certificate-authority-data")
    if ca:
        info["certificate-authority-data"] = str(ca)
    for key, out in (("tls-server-name", "tls-server-name"), ("proxy-url", "proxy-url")):
        if cluster.get(key):
            info[out] = cluster[key]
    if cluster.get("insecure-skip-tls-verify"):
        info["insecure-skip-tls-verify"] = True
    for extension in cluster.get("extensions") or ():
        if extension.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = extension.get("extension")
    return info
