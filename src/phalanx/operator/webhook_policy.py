"""The settings every webhook of the operator's configurations carries, as the manifests ship
them: ``failurePolicy: Fail``, a timeout of at most 10 s, and a namespaceSelector that leaves
out ``kube-system`` and the operator's own namespace.

kopf (``settings.admission.managed``) rewrites the whole ``webhooks`` list of the two
configurations whenever its client config changes, from ``build_webhooks`` in
``kopf._core.engines.admission``, which has no setting for either: it writes a 30 s timeout
and no namespaceSelector. A running operator would so overwrite a re-applied manifest with
weaker settings (a 30 s timeout holds API requests three times longer than Kueue allows; no
selector makes the operator's own pods wait on its webhooks). kopf looks the builder up in its
module when it (re)configures, so :func:`install` wraps it there, for the configuration names
given only; a kopf release that stops doing so is refused at start rather than run with
kopf's values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kopf._core.engines import admission as kopf_admission

__all__ = [
    "MAX_TIMEOUT_SECONDS",
    "WebhookPolicy",
    "build_configuration",
    "default_namespace_selector",
    "install",
    "installed",
    "operator_namespace",
]

MAX_TIMEOUT_SECONDS = 10
"""Kueue's and the manifests' bound; the API server allows 30."""

SYSTEM_NAMESPACE = "kube-system"


def default_namespace_selector(own_namespace: str | None) -> dict[str, Any]:
    """Every namespace but ``kube-system`` and, when the operator runs in one, its own: its
    pods must be able to start while no replica serves the webhooks (failurePolicy Fail)."""
    values = [SYSTEM_NAMESPACE]
    if own_namespace and own_namespace != SYSTEM_NAMESPACE:
        values.append(own_namespace)
    return {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": values}
        ]
    }


def operator_namespace(
    *, env: Mapping[str, str], service_account_dir: Path, service: str | None
) -> str | None:
    """The namespace the operator runs in: ``$POD_NAMESPACE`` (the manifests set it from the
    downward API), else the mounted ServiceAccount's ``namespace`` file (in a pod), else the
    namespace of the ``--webhook-service`` it is reached through; ``None`` for a process beside
    the cluster (the local control plane), which has no namespace to leave out."""
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        namespace = (service_account_dir / "namespace").read_text().strip()
    except OSError:
        namespace = ""
    if namespace:
        return namespace
    if service and "/" in service:
        return service.partition("/")[0] or None
    return None


@dataclass(frozen=True)
class WebhookPolicy:
    """What :func:`install` sets on every webhook kopf builds for a configuration."""

    timeout_seconds: int = MAX_TIMEOUT_SECONDS
    namespace_selector: Mapping[str, Any] = field(
        default_factory=lambda: default_namespace_selector(None)
    )

    def __post_init__(self) -> None:
        if not 1 <= self.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise ValueError(
                f"webhook timeout: {self.timeout_seconds} s is outside 1..{MAX_TIMEOUT_SECONDS}; "
                f"give --webhook-timeout-seconds between 1 and {MAX_TIMEOUT_SECONDS}"
            )

    def apply(self, webhooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                **webhook,
                "failurePolicy": "Fail",
                "timeoutSeconds": self.timeout_seconds,
                "namespaceSelector": _plain(self.namespace_selector),
            }
            for webhook in webhooks
        ]


def _plain(value: Any) -> Any:
    """A JSON-ready copy (the selector may come from a read-only mapping of the config file)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


Builder = Callable[..., list[dict[str, Any]]]

_KOPF_BUILD: Builder = kopf_admission.build_webhooks
_POLICIES: dict[str, WebhookPolicy] = {}


def build_configuration(
    handlers: Any,
    *,
    resources: Any,
    name_suffix: str,
    client_config: Any,
    persistent_only: bool = False,
) -> list[dict[str, Any]]:
    """kopf's ``build_webhooks`` with the policy installed for ``name_suffix`` (the managed
    configuration's name) applied; other configurations are left as kopf builds them."""
    webhooks = _KOPF_BUILD(
        handlers,
        resources=resources,
        name_suffix=name_suffix,
        client_config=client_config,
        persistent_only=persistent_only,
    )
    policy = _POLICIES.get(name_suffix)
    return policy.apply(webhooks) if policy else webhooks


def install(configuration_name: str, policy: WebhookPolicy) -> None:
    """Make kopf's managed configuration ``configuration_name`` carry ``policy``."""
    manager = cast(Any, kopf_admission.configuration_manager)
    if "build_webhooks" not in manager.__code__.co_names:
        raise RuntimeError(
            "this kopf release builds its webhook configurations without "
            "kopf._core.engines.admission.build_webhooks, so Phalanx cannot set their "
            "timeout and namespaceSelector; install the kopf version pyproject.toml names"
        )
    _POLICIES[configuration_name] = policy
    setattr(kopf_admission, "build_webhooks", build_configuration)  # noqa: B010


def installed(configuration_name: str) -> WebhookPolicy | None:
    """The policy :func:`install` set for a configuration (for tests and logs)."""
    return _POLICIES.get(configuration_name)
