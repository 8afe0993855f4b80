"""``phalanx operator``: run the operator against a cluster."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.admission.fair_usage import AdmissionFairSharing
    from phalanx.operator import configfile as configfile_types
    from phalanx.operator.config import WaitForPodsReady
    from phalanx.operator.configfile import ConfigFile

__all__ = [
    "SERVICE_ACCOUNT_TOKEN",
    "leader_election_default",
    "leader_election_enabled",
    "register",
    "wait_for_pods_ready",
]

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
"""The token kubelet mounts into a pod; ``phalanx.operator.kubeconfig.load`` looks for it too."""
SERVICE_ACCOUNT_DIR_ENV = "PHALANX_SERVICE_ACCOUNT_DIR"
"""Replaces the token's folder, as in ``phalanx.operator.kubeconfig``."""


def _boolean(value: str) -> bool:
    """``--flag=true|false`` as controller-runtime's flags read (Kueue's manifests use them)."""
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not true or false")


def leader_election_default(
    env: Mapping[str, str],
    token_path: Path | None = None,
    *,
    kubeconfig: Path | None = None,
) -> bool:
    """Whether leader election is on when neither ``--leader-elect`` nor ``--no-leader-elect``
    is given: on exactly when the operator runs in a pod on its service account, i.e. when
    the credentials come from the in-cluster config (no ``--kubeconfig``, no ``$KUBECONFIG``,
    ``$KUBERNETES_SERVICE_HOST`` set and the token file present), as in the manifests.
    A deployment there may have several replicas (a rolling update always has two for a
    while); only one of them may schedule. Run from a workstation, one process is the rule.
    """
    if kubeconfig is not None or env.get("KUBECONFIG"):
        return False
    if token_path is None:
        folder = env.get(SERVICE_ACCOUNT_DIR_ENV)
        token_path = Path(folder) / "token" if folder else SERVICE_ACCOUNT_TOKEN
    token = token_path
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and token.exists()


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "operator",
        help="run the Phalanx operator against a cluster",
        description=(
            "Run the operator: queue and admit Jobs and Workloads against ClusterQueue quotas, "
            "place gangs by topology, serve the webhooks and Prometheus metrics. Credentials "
            "come from --kubeconfig, $KUBECONFIG, the in-cluster service account or "
            "~/.kube/config, in that order."
        ),
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a Kueue Configuration (config.kueue.x-k8s.io): waitForPodsReady, fairSharing, "
        "integrations, managedJobsNamespaceSelector (the phalanx-config ConfigMap of the "
        "manifests); flags given explicitly win over it",
    )
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context (default: current-context)")
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        metavar="NS",
        help="manage Jobs/Workloads only in this namespace (repeatable; default: all)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8443,
        help="port of /metrics, HTTPS with token authentication; 0 disables (8443)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="ADDRESS",
        help="address of the metrics server (0.0.0.0; 127.0.0.1 with --metrics-secure=false)",
    )
    parser.add_argument(
        "--metrics-secure",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="serve /metrics over HTTPS to callers whose token may get /metrics (TokenReview, "
        "SubjectAccessReview); false: plain HTTP without authentication, loopback only (true)",
    )
    parser.add_argument(
        "--metrics-cert-dir",
        type=Path,
        metavar="DIR",
        help="tls.crt and tls.key for /metrics, re-read when they change (default: the "
        "webhook certificate)",
    )
    parser.add_argument(
        "--metrics-auth-cache-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="reuse a scrape token's review for this long (30)",
    )
    parser.add_argument(
        "--visibility-port",
        type=int,
        default=0,
        help="port of Kueue's visibility API (visibility.kueue.x-k8s.io/v1beta2, aggregated "
        "behind an APIService; HTTPS, callers authenticated by the API server's front-proxy "
        "certificate); 0: off (off; the manifests use Kueue's 8082)",
    )
    parser.add_argument(
        "--visibility-listen",
        metavar="ADDRESS",
        default="0.0.0.0",
        help="address of the visibility API server (0.0.0.0)",
    )
    parser.add_argument(
        "--dashboard-port",
        type=int,
        default=0,
        help="port of the read-only web dashboard (bearer tokens reviewed by the API server; "
        "docs/dashboard.md); 0: off (off)",
    )
    parser.add_argument(
        "--dashboard-listen",
        metavar="ADDRESS",
        default="127.0.0.1",
        help="address of the dashboard (127.0.0.1: reach it with kubectl port-forward; "
        "another address needs --dashboard-cert-dir)",
    )
    parser.add_argument(
        "--dashboard-cert-dir",
        type=Path,
        default=None,
        help="serve the dashboard over HTTPS with tls.crt and tls.key from this folder",
    )
    parser.add_argument(
        "--health-probe-port",
        "--liveness-port",
        dest="liveness_port",
        type=int,
        default=0,
        help="plain-HTTP port of /healthz and /readyz (off)",
    )
    parser.add_argument(
        "--health-probe-listen", default="0.0.0.0", metavar="ADDRESS", help="(0.0.0.0)"
    )
    parser.add_argument(
        "--cert-check-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="how often self-managed certificates are renewed when due and mounted ones "
        "re-read (60)",
    )
    parser.add_argument(
        "--liveness-stall-seconds",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="/healthz fails when the scheduling replica completed no cycle for this long (20)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="usage history store: sqlite:///PATH or postgresql://USER@HOST:PORT/DB, or off "
        "(default: $PHALANX_STORE, else sqlite:///~/.local/state/phalanx/store.db); "
        "docs/store.md",
    )
    parser.add_argument(
        "--webhook-port", type=int, default=9443, help="port of the webhook server (9443)"
    )
    parser.add_argument(
        "--webhook-listen", default="127.0.0.1", help="address the webhook server binds"
    )
    parser.add_argument(
        "--webhook-url",
        help="URL the API server uses to call the webhooks (default: https://LISTEN:PORT)",
    )
    parser.add_argument(
        "--webhook-service",
        metavar="NAMESPACE/NAME",
        help="advertise the webhooks through this Service (in-cluster deployments)",
    )
    parser.add_argument(
        "--webhook-cert-dir",
        type=Path,
        help="folder with ca.crt, tls.crt, tls.key (made there if absent; "
        "default ~/.cache/phalanx/webhook)",
    )
    parser.add_argument(
        "--make-webhook-certs",
        action="store_true",
        help="write a CA and serving certificate for the webhook (for --webhook-service, or "
        "--webhook-url/--webhook-listen) into --webhook-cert-dir, then exit",
    )
    parser.add_argument(
        "--webhook-timeout-seconds",
        type=_webhook_timeout,
        default=10,
        metavar="S",
        help="timeoutSeconds of every webhook, 1 to 10 (10); the webhooks fail closed and "
        "leave out kube-system and the operator's namespace (or the --config file's "
        "managedJobsNamespaceSelector)",
    )
    parser.add_argument(
        "--no-webhooks", action="store_true", help="serve no webhooks (Jobs are not suspended)"
    )
    parser.add_argument(
        "--wait-for-pods-ready",
        type=float,
        metavar="SECONDS",
        default=None,
        help="evict and requeue admitted workloads whose pods are not ready in time; "
        "0 turns it off (off)",
    )
    parser.add_argument(
        "--requeue-backoff-base",
        type=float,
        metavar="SECONDS",
        default=None,
        help="first requeue delay after a PodsReady timeout; doubles each time (60)",
    )
    parser.add_argument(
        "--routine-events-qps",
        type=_events_qps,
        metavar="QPS",
        default=5.0,
        help="Events the object's status already records (QuotaReserved, Admitted,"
        " CreatedWorkload) are written at most this fast; 0: all of them. Preemption,"
        " eviction and warning Events are always written (5)",
    )
    parser.add_argument(
        "--routine-events-burst",
        type=_events_burst,
        metavar="N",
        default=100,
        help="how many routine Events may be written at once before --routine-events-qps"
        " applies (100)",
    )
    parser.add_argument(
        "--pending-explanations-qps",
        type=_explanations_qps,
        metavar="QPS",
        default=10.0,
        help="pending explanations (a waiting Workload's QuotaReserved=False message) are"
        " written at most this fast across the operator, a Workload never explained first;"
        " 0: no limit. Admissions, evictions and finishes are never limited (10)",
    )
    parser.add_argument(
        "--pending-explanations-burst",
        type=_explanations_burst,
        metavar="N",
        default=50,
        help="how many pending explanations may be written at once before"
        " --pending-explanations-qps applies (50)",
    )
    election = parser.add_argument_group(
        "leader election",
        "With leader election, replicas share a coordination.k8s.io Lease and only its holder"
        " schedules; every replica serves the webhooks. It is on by default when the operator"
        " runs in a pod on its service account (in-cluster credentials: no --kubeconfig or"
        " $KUBECONFIG, $KUBERNETES_SERVICE_HOST set, service-account token mounted), off"
        " otherwise.",
    )
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="enable (--no-leader-elect: disable) leader election "
        "(default: on in a pod, off elsewhere)",
    )
    election.add_argument(
        "--leader-elect-namespace",
        metavar="NS",
        help="namespace of the Lease (default: $POD_NAMESPACE, the pod's, else kube-system)",
    )
    election.add_argument(
        "--leader-elect-lease-name",
        default="phalanx-scheduler",
        metavar="NAME",
        help="(%(default)s)",
    )
    election.add_argument(
        "--leader-elect-identity",
        metavar="ID",
        help="this replica's name, unique among live replicas (default: <hostname>_<8 hex>)",
    )
    election.add_argument(
        "--leader-elect-lease-duration", type=float, default=15.0, metavar="S", help="(15)"
    )
    election.add_argument(
        "--leader-elect-renew-deadline", type=float, default=10.0, metavar="S", help="(10)"
    )
    election.add_argument(
        "--leader-elect-retry-period", type=float, default=2.0, metavar="S", help="(2)"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (INFO)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: kopf is heavy, and other subcommands should not pay for it.
    from phalanx.operator import configfile
    from phalanx.operator.app import run as run_operator
    from phalanx.operator.config import OperatorConfig, WebhookConfig
    from phalanx.operator.configfile import ConfigFile

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    settings = ConfigFile()
    if args.config is not None:
        try:
            settings = configfile.load(args.config)
        except configfile.ConfigFileError as error:
            print(f"error: --config: {error}", file=sys.stderr)
            return 2
        logging.getLogger(__name__).info(
            "event=config_loaded path=%s set_by_flags_instead=%s",
            args.config,
            ",".join(settings.ignored) or "-",
        )
    webhook = WebhookConfig(
        enabled=not args.no_webhooks,
        listen_addr=args.webhook_listen,
        port=args.webhook_port,
        url=args.webhook_url,
        service=args.webhook_service,
        timeout_seconds=args.webhook_timeout_seconds,
        namespace_selector=webhook_namespace_selector(args, settings),
        **({"cert_dir": args.webhook_cert_dir} if args.webhook_cert_dir else {}),
    )
    if args.make_webhook_certs:
        from phalanx.operator.webhooks import webhook_server

        server = webhook_server(webhook)
        print(f"wrote {server.cafile}, {server.certfile}, {server.pkeyfile}")
        return 0
    leader_election = None
    if leader_election_enabled(args):
        from phalanx.operator.leader import (
            LeaderElectionConfig,
            LeaderElectionError,
            default_identity,
            default_namespace,
        )

        try:
            leader_election = LeaderElectionConfig(
                lease_name=args.leader_elect_lease_name,
                namespace=args.leader_elect_namespace or default_namespace(),
                identity=args.leader_elect_identity or default_identity(),
                lease_duration=args.leader_elect_lease_duration,
                renew_deadline=args.leader_elect_renew_deadline,
                retry_period=args.leader_elect_retry_period,
            )
        except LeaderElectionError as error:
            print(f"error: --leader-elect-*: {error}", file=sys.stderr)
            return 2
    config = OperatorConfig(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespaces=tuple(args.namespaces),
        metrics_port=args.metrics_port or None,
        metrics_addr=args.metrics_listen or ("0.0.0.0" if args.metrics_secure else "127.0.0.1"),
        metrics_secure=args.metrics_secure,
        metrics_cert_dir=args.metrics_cert_dir,
        metrics_auth_ttl=args.metrics_auth_cache_seconds,
        visibility_port=args.visibility_port or None,
        visibility_addr=args.visibility_listen,
        liveness_port=args.liveness_port or None,
        health_addr=args.health_probe_listen,
        cert_check_seconds=args.cert_check_seconds,
        routine_events_qps=args.routine_events_qps,
        routine_events_burst=args.routine_events_burst,
        pending_explanations_qps=args.pending_explanations_qps,
        pending_explanations_burst=args.pending_explanations_burst,
        liveness_stall_seconds=args.liveness_stall_seconds,
        store_url=_store_url(args.store),
        webhook=webhook,
        wait_for_pods_ready=wait_for_pods_ready(args, settings),
        fair_sharing=bool(settings.fair_sharing and settings.fair_sharing.enabled),
        managed_jobs_namespace_selector=settings.managed_jobs_namespace_selector,
        tas_balanced_placement=bool(settings.tas_balanced_placement),
        admission_fair_sharing=_admission_fair_sharing(settings.admission_fair_sharing),
        decayed_fair_sharing=_admission_fair_sharing(settings.decayed_fair_sharing),
        budgets=settings.budgets,
        **({"frameworks": settings.frameworks} if settings.frameworks is not None else {}),
        leader_election=leader_election,
        **(
            {"fair_sharing_strategies": settings.fair_sharing.preemption_strategies}
            if settings.fair_sharing
            else {}
        ),
    )
    sidecars = []
    if args.dashboard_port:
        sidecar = dashboard_sidecar(args)
        if sidecar is None:
            return 2
        sidecars.append(sidecar)
    return run_operator(config, sidecars=sidecars)


def dashboard_sidecar(args: argparse.Namespace) -> Any:
    """``--dashboard-port``: the dashboard started on the operator's API client (every
    replica serves it: it reads the API server, not the leader's memory)."""
    from phalanx.cli.dashboard_cmd import tls_context
    from phalanx.dashboard.server import start_dashboard

    if not 0 < args.dashboard_port < 65536:
        print(f"error: --dashboard-port {args.dashboard_port}: must be 1-65535", file=sys.stderr)
        return None
    try:
        context = tls_context(args.dashboard_cert_dir, "--dashboard-cert-dir")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    if context is None and args.dashboard_listen not in ("127.0.0.1", "::1", "localhost"):
        print(
            f"error: --dashboard-listen {args.dashboard_listen}: bearer tokens must not travel "
            "plain; keep 127.0.0.1 (kubectl port-forward reaches it) or give --dashboard-cert-dir",
            file=sys.stderr,
        )
        return None

    async def start(api: Any) -> Any:
        return await start_dashboard(
            api,
            listen=args.dashboard_listen,
            port=args.dashboard_port,
            ssl_context=context,
            store_url=_store_url(args.store),
        )

    return start


def _admission_fair_sharing(
    section: configfile_types.AdmissionFairSharing | None,
) -> AdmissionFairSharing | None:
    """``--config``'s ``admissionFairSharing`` (or ``decayedFairSharing``) in the core's
    terms (milliseconds)."""
    from phalanx.admission.fair_usage import AdmissionFairSharing

    if section is None:
        return None
    return AdmissionFairSharing(
        usage_half_life_ms=round(section.usage_half_life_seconds * 1000),
        usage_sampling_interval_ms=round(section.usage_sampling_interval_seconds * 1000),
        resource_weights=dict(section.resource_weights),
    )


def _store_url(value: str | None) -> str | None:
    from phalanx.store.db import default_url

    url = value or default_url()  # $PHALANX_STORE may say off too (the manifests' default)
    return None if url == "off" else url


def _webhook_timeout(value: str) -> int:
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of seconds") from None
    if not 1 <= seconds <= 10:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 10 (seconds)")
    return seconds


def _qps(noun: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            qps = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a number of {noun} per second"
            ) from None
        if not qps >= 0 or qps == float("inf"):
            raise argparse.ArgumentTypeError(
                f"{value} is not a rate: give {noun} per second >= 0 (0: no limit)"
            )
        return qps

    return parse


def _burst(noun: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            burst = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of {noun}") from None
        if burst < 1:
            raise argparse.ArgumentTypeError(f"{value} is below 1: give at least 1 of {noun}")
        return burst

    return parse


_events_qps = _qps("Events")
_events_burst = _burst("Events")
_explanations_qps = _qps("explanations")
_explanations_burst = _burst("explanations")


def webhook_namespace_selector(args: argparse.Namespace, settings: ConfigFile) -> dict[str, Any]:
    """The webhooks' namespaceSelector: the ``--config`` file's managedJobsNamespaceSelector
    (the manifests and the chart ship the same selector in both places), else every
    namespace but kube-system and the one the operator runs in (none beside the cluster)."""
    from phalanx.operator.kubeconfig import service_account_dir
    from phalanx.operator.webhook_policy import default_namespace_selector, operator_namespace

    if settings.managed_jobs_namespace_selector is not None:
        return dict(settings.managed_jobs_namespace_selector)
    own = operator_namespace(
        env=os.environ, service_account_dir=service_account_dir(), service=args.webhook_service
    )
    return default_namespace_selector(own)


def wait_for_pods_ready(args: argparse.Namespace, settings: ConfigFile) -> WaitForPodsReady:
    """Kueue's ``waitForPodsReady``: a flag given on the command line, else the ``--config``
    file, else the default (off; 300 s timeout; backoff 60 s doubling up to 3600 s)."""
    from phalanx.operator.config import WaitForPodsReady

    default = WaitForPodsReady()
    enabled = (
        default.enabled if settings.wait_for_pods_ready is None else settings.wait_for_pods_ready
    )
    timeout = settings.pods_ready_timeout_seconds or default.timeout_seconds
    if args.wait_for_pods_ready is not None:
        enabled = args.wait_for_pods_ready > 0
        timeout = args.wait_for_pods_ready or timeout
    base = settings.backoff_base_seconds
    if args.requeue_backoff_base is not None:
        base = args.requeue_backoff_base
    return WaitForPodsReady(
        enabled=enabled,
        timeout_seconds=timeout,
        backoff_base_seconds=default.backoff_base_seconds if base is None else base,
        backoff_max_seconds=(
            default.backoff_max_seconds
            if settings.backoff_max_seconds is None
            else settings.backoff_max_seconds
        ),
        backoff_limit_count=settings.backoff_limit_count,
    )


def leader_election_enabled(
    args: argparse.Namespace,
    env: Mapping[str, str] | None = None,
    token_path: Path | None = None,
) -> bool:
    """``--leader-elect``/``--no-leader-elect`` if given, else :func:`leader_election_default`."""
    if args.leader_elect is not None:
        return bool(args.leader_elect)
    return leader_election_default(
        os.environ if env is None else env, token_path, kubeconfig=args.kubeconfig
    )
