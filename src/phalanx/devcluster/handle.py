"""A running devcluster as a caller (tests, the demo) uses it: kubeconfig plus kubectl."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

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
