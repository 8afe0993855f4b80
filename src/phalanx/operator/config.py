"""The operator's configuration: what ``phalanx operator`` flags and the manifests set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.admission.budgets import Budget
from phalanx.admission.fair_usage import AdmissionFairSharing
from phalanx.operator.leader import LeaderElectionConfig

__all__ = ["OperatorConfig", "WaitForPodsReady", "WebhookConfig"]


@dataclass(frozen=True)
class WebhookConfig:
    """Where the webhook server listens and how the API server reaches it.

    Default (local control plane): listen on 127.0.0.1 and let the API server call
    ``https://127.0.0.1:<port>``, with a CA made and kept in ``cert_dir``. In a cluster
    (manifests/), ``service`` names the Service in front of the pods and ``cert_dir`` holds the
    mounted certificate Secret.
    """

    enabled: bool = True
    listen_addr: str = "127.0.0.1"
    port: int = 9443
    url: str | None = None
    """Override of the URL the API server calls, e.g. ``https://127.0.0.1:9443``."""
    service: str | None = None
    """``namespace/name`` of a Service fronting the webhook (in-cluster deployments)."""
    cert_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "phalanx" / "webhook")
    configuration_name: str = "phalanx.kueue.x-k8s.io"
    timeout_seconds: int = 10
    """Every webhook's ``timeoutSeconds`` (1 to 10, as the manifests ship it)."""
    namespace_selector: Mapping[str, Any] | None = None
    """Every webhook's ``namespaceSelector``; ``None``: all namespaces but ``kube-system``
    (webhook_policy resolves the operator's own namespace for ``phalanx operator``)."""


@dataclass(frozen=True)
class WaitForPodsReady:
    """Kueue's ``waitForPodsReady``: evict and requeue a workload whose pods are not all ready
    within ``timeout_seconds`` of admission, with exponential requeue backoff."""

    enabled: bool = False
    timeout_seconds: float = 300.0
    backoff_base_seconds: float = 60.0
    backoff_max_seconds: float = 3600.0
    backoff_limit_count: int | None = None


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: Path | None = None
    context: str | None = None
    namespaces: tuple[str, ...] = ()
    """Namespaces whose Jobs/Workloads are managed; empty means cluster-wide."""
    metrics_port: int | None = 8443
    metrics_addr: str = "0.0.0.0"
    metrics_secure: bool = True
    """HTTPS, each scrape's token checked (TokenReview, SubjectAccessReview); off: plain HTTP
    without authentication, on loopback only (local runs and tests)."""
    metrics_cert_dir: Path | None = None
    """``tls.crt``/``tls.key`` for the metrics server (re-read when they change); default: the
    webhook's certificate folder."""
    metrics_auth_ttl: float = 30.0
    """How long a scrape token's review is reused (a refusal: a third of it, at most 10 s)."""
    visibility_port: int | None = None
    """Kueue's visibility API (``visibility.kueue.x-k8s.io``, an aggregated API behind the
    APIService) over HTTPS on this port; None: not served."""
    visibility_addr: str = "0.0.0.0"
    liveness_port: int | None = None
    """The probes' port (``/healthz``, ``/readyz``), plain HTTP."""
    health_addr: str = "0.0.0.0"
    cert_check_seconds: float = 60.0
    """How often certificates are checked: a self-managed one renewed when due, mounted ones
    re-read when their files change."""
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    wait_for_pods_ready: WaitForPodsReady = field(default_factory=WaitForPodsReady)
    manage_jobs: bool = True
    frameworks: tuple[str, ...] = ("batch/job",)
    """Kueue's ``integrations.frameworks`` (``--config``): the enabled integrations. A queued
    object of a kind left out is left alone, with an Event saying so."""
    status_flush_seconds: float = 1.0
    """ClusterQueue/LocalQueue status is written at most this often per queue."""
    pending_message_min_interval: float = 5.0
    """A pending Workload's explanation is rewritten at most this often (and only on change)."""
    pending_numbers_min_interval: float = 30.0
    """...and at most this often when only its numbers changed ("3 more needed" -> "2 more")."""
    pending_explanations_qps: float = 10.0
    pending_explanations_burst: int = 50
    """Pending explanations are written at most this fast across the operator (a token
    bucket; 0 qps: no limit), a Workload never explained before one whose explanation
    changed. Decisions (admit, evict, finish) are never limited."""
    routine_events_qps: float = 5.0
    routine_events_burst: int = 100
    """Events that record what the object's status already shows (``QuotaReserved``,
    ``Admitted``, ``CreatedWorkload``) are written at most this fast across the operator (a
    token bucket); a qps of 0: every one. Preemptions, evictions and warnings always are."""
    cycle_min_interval: float = 0.05
    """Coalescing window: events arriving within it share one scheduling cycle."""
    fair_sharing: bool = False
    """Kueue's ``fairSharing.enable``: order and preempt by the ClusterQueues' weighted share."""
    fair_sharing_strategies: tuple[str, ...] = (
        "LessThanOrEqualToFinalShare",
        "LessThanInitialShare",
    )
    """Kueue's ``fairSharing.preemptionStrategies``, in order."""
    managed_jobs_namespace_selector: Mapping[str, Any] | None = None
    """Kueue's ``managedJobsNamespaceSelector``, as read from ``--config`` (see configfile)."""
    admission_fair_sharing: AdmissionFairSharing | None = None
    """Kueue's ``admissionFairSharing`` (``--config``, with the ``AdmissionFairSharing`` gate
    on): ClusterQueues with ``UsageBasedAdmissionFairSharing`` serve their LocalQueues by
    decayed usage, kept in the LocalQueues' status (docs/scheduling.md)."""
    decayed_fair_sharing: AdmissionFairSharing | None = None
    """Phalanx's ``decayedFairSharing`` (``--config``, with ``fairSharing.enable``): fair
    sharing orders ClusterQueues by their decayed usage, kept in the ClusterQueues' status
    (docs/scheduling.md)."""
    budgets: tuple[Budget, ...] = ()
    """Phalanx's usage budgets (``budgets`` in ``--config``; docs/budgets.md)."""
    tas_balanced_placement: bool = False
    """Kueue's feature gate ``TASBalancedPlacement`` (``featureGates`` in ``--config``):
    preferred pod sets are spread evenly over the fewest domains (docs/placement.md)."""
    leader_election: LeaderElectionConfig | None = None
    """With leader election, only the replica holding the Lease schedules and writes."""
    store_url: str | None = None
    """The usage history store (``--store``; docs/store.md): the leader writes Workload
    lifecycle events there. None: nothing is recorded."""
    liveness_stall_seconds: float = 20.0
    """The liveness probe fails when this replica schedules (leader, or no leader election)
    and no scheduling cycle completed for this long; the loop completes one every couple of
    seconds even when idle. kopf caches a passing probe for 10 s, so a stall is reported
    within this plus 10 s."""
