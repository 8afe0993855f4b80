"""A running devcluster as a caller (tests, the demo) uses it: kubeconfig plus kubectl."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster import cluster, pins


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message holds the command and its stderr."""


@dataclass(frozen=True)
class ClusterHandle:
    state_dir: Path
    kubeconfig: Path
    server: str
    kubectl_path: Path

    @classmethod
    def from_status(cls, status: cluster.ClusterStatus) -> ClusterHandle:
        if status.server is None:
            raise cluster.DevclusterError(f"no devcluster recorded in {status.state_dir}")
        return cls(
            state_dir=status.state_dir,
            kubeconfig=status.kubeconfig,
            server=status.server,
            kubectl_path=pins.binary_cache().path("kubectl"),
        )

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 120.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster (as admin unless another
        ``kubeconfig`` is given); never raises on a non-zero exit."""
        return subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def kubectl_ok(self, *args: str, input: str | None = None, timeout: float = 120.0) -> str:
        """Run kubectl, raise ``KubectlError`` unless it succeeds; return its stdout."""
        proc = self.kubectl(*args, input=input, timeout=timeout)
        if proc.returncode != 0:
            raise KubectlError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout

    def apply_crds(self, texts: Iterable[str]) -> list[str]:
        """Server-side apply CRD documents (YAML texts), wait until they are Established, and
        return their names.

        A CRD whose conversion webhook an operator on this machine points at its loopback URL
        keeps that client config: the generated CRDs name the in-cluster Service instead, and a
        client config with both a url and a service is invalid (the whole apply would fail).
        """
        docs = [d for text in texts for d in yaml.safe_load_all(text) if d]
        names = [str(d["metadata"]["name"]) for d in docs]
        live = json.loads(
            self.kubectl_ok("get", "crd", *names, "--ignore-not-found", "-o", "json") or "{}"
        )
        by_name = {item["metadata"]["name"]: item for item in live.get("items") or ()}
        for doc in docs:
            keep_conversion_url(doc, by_name.get(doc["metadata"]["name"]))
        self.kubectl_ok(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            input=yaml.safe_dump_all(docs, sort_keys=False),
        )
        self.kubectl_ok(
            "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]
        )
        return names


def keep_conversion_url(doc: dict[str, Any], live: dict[str, Any] | None) -> None:
    """Give ``doc`` (a CRD to apply) the loopback conversion client config ``live`` has, if
    any: an operator beside the cluster set it, and applying the Service form would both be
    invalid (url and service) and re-initialize the CRD's storage for nothing."""
    wanted = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook")
    current = (((live or {}).get("spec") or {}).get("conversion") or {}).get("webhook") or {}
    if wanted and "url" in (current.get("clientConfig") or {}):
        wanted["clientConfig"] = dict(current["clientConfig"])
