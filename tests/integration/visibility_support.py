"""Kueue's visibility API routed to an operator running on this host: the APIService points
at a selector-less Service whose EndpointSlice names the host's address and the operator's
``--visibility-port`` (the API server refuses loopback addresses there)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator

from operator_fixtures import apply, is_true, wait_for

from phalanx.devcluster.handle import ClusterHandle

__all__ = ["APISERVICE", "routed_visibility"]

APISERVICE = "v1beta2.visibility.kueue.x-k8s.io"


@contextlib.contextmanager
def routed_visibility(
    cluster: ClusterHandle,
    *,
    address: str,
    port: int,
    namespace: str,
    log: Callable[[], str] | None = None,
) -> Iterator[None]:
    """The APIService Available for the block; removed after it (first: an unavailable
    aggregated API stalls namespace deletion), with ``namespace`` that holds its Service."""
    cluster.kubectl("create", "namespace", namespace)
    try:
        apply(
            cluster,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "phalanx-visibility", "namespace": namespace},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "phalanx-visibility-host",
                    "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": "phalanx-visibility"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": "visibility.kueue.x-k8s.io",
                    "version": "v1beta2",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "insecureSkipTLSVerify": True,
                    "service": {"name": "phalanx-visibility", "namespace": namespace, "port": 443},
                },
            },
        )
        wait_for(
            "the APIService Available",
            lambda: is_true(
                json.loads(cluster.kubectl_ok("get", "apiservice", APISERVICE, "-o", "json")),
                "Available",
            ),
            timeout=60,
            log=log,
        )
        yield
    finally:
        cluster.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
