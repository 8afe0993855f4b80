"""Minimal HTTPS calls to the devcluster's endpoints, with the cluster CA and a client cert.

The devcluster must not depend on the operator's Kubernetes client (layering), and it needs
only a handful of calls: health probes, listing nodes, creating and patching them, and one
ClusterRoleBinding. Plain ``urllib`` with mutual TLS does that.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.devcluster.pki import CertPair


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


@dataclass(frozen=True)
class Endpoint:
    """A base URL plus the TLS material to reach it (``ca``/``client`` unused for http)."""

    base_url: str
    ca: Path | None = None
    client: CertPair | None = None

    def _context(self) -> ssl.SSLContext | None:
        if not self.base_url.startswith("https://"):
            return None
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.client is not None:
            context.load_cert_chain(str(self.client.cert), str(self.client.key))
        return context

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 5.0,
    ) -> tuple[int, str]:
        """Return ``(status, text)``; HTTP errors are returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._context()) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """Like ``request`` but parse JSON and raise ``ApiError`` on a non-2xx status."""
        status, text = self.request(method, path, **kwargs)
        if not 200 <= status < 300:
            raise ApiError(status, text[:500])
        return json.loads(text) if text else None

    def probe(self, path: str, *, timeout: float = 2.0) -> tuple[bool, str]:
        """``(healthy, detail)`` for a health endpoint; connection errors are unhealthy."""
        try:
            status, text = self.request("GET", path, timeout=timeout)
        except (OSError, ssl.SSLError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        detail = text.strip().splitlines()[-1] if text.strip() else ""
        return status == 200, f"HTTP {status} {detail}"[:200]
