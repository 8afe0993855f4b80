"""Who may read ``/metrics``: the caller's token, checked by the API server, as Kueue does.

Kueue (controller-runtime's ``WithAuthenticationAndAuthorization`` filter) authenticates a
scrape's bearer token with a TokenReview (``authentication.k8s.io/v1``) and authorizes the user
with a SubjectAccessReview (``authorization.k8s.io/v1``) for ``get`` on the non-resource URL
``/metrics``; the ``phalanx-metrics-reader`` ClusterRole grants exactly that. No token or a
token the API server does not accept is 401, an authenticated user without the permission 403.

A scrape every 15 s should not cost two API calls each time: verdicts are cached by a hash of
the token (never the token itself) for ``ttl`` seconds (allowed) or ``deny_ttl`` (refused), at
most ``max_entries`` of them. A review that fails (API server unreachable) is not cached.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx.operator.kube import KubeApi

__all__ = ["Decision", "MetricsAuthorizer", "ReviewFailed", "Verdict"]

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Verdict(enum.Enum):
    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    user: str | None = None
    reason: str = ""


class ReviewFailed(Exception):
    """The API server could not be asked; the scrape gets 503 and may retry."""


class MetricsAuthorizer:
    def __init__(
        self,
        api: KubeApi,
        *,
        path: str = "/metrics",
        ttl: float = 30.0,
        deny_ttl: float = 10.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.path = path
        self.ttl = ttl
        self.deny_ttl = deny_ttl
        self.max_entries = max_entries
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self.reviews = 0
        """TokenReviews sent (for tests and logs)."""

    async def check(self, authorization: str | None) -> Decision:
        """The decision for a request's ``Authorization`` header."""
        token = _bearer(authorization)
        if token is None:
            return Decision(Verdict.UNAUTHENTICATED, reason="no bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        decision = await self._review(token)
        ttl = self.ttl if decision.verdict is Verdict.ALLOWED else self.deny_ttl
        self._cache[key] = (now + ttl, decision)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return decision

    async def _review(self, token: str) -> Decision:
        self.reviews += 1
        review = await self._create(
            TOKEN_REVIEWS,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(Verdict.UNAUTHENTICATED, reason=str(status.get("error") or "invalid"))
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        spec: dict[str, Any] = {
            "user": username,
            "groups": list(user.get("groups") or ()),
            "nonResourceAttributes": {"path": self.path, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await self._create(
            SUBJECT_ACCESS_REVIEWS,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        allowed = (access.get("status") or {}).get("allowed") is True
        if allowed:
            return Decision(Verdict.ALLOWED, user=username)
        reason = (access.get("status") or {}).get("reason") or f"no get on {self.path}"
        return Decision(Verdict.FORBIDDEN, user=username, reason=str(reason))

    async def _create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.api.request("POST", path, body=body, timeout=10.0)
        except Exception as error:
            raise ReviewFailed(f"POST {path}: {error}") from error


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
