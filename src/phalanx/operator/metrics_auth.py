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

__all__ = ["AccessReviewer", "Decision", "Identity", "MetricsAuthorizer", "ReviewFailed", "Verdict"]

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


@dataclass(frozen=True)
class Identity:
    """An authenticated caller, as its TokenReview named it."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class AccessReviewer:
    """TokenReview then SubjectAccessReviews on resources, both cached like
    :class:`MetricsAuthorizer`'s verdicts (by token hash; by user and attributes): for pages
    that show each caller only what it may ``list`` (the dashboard)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        ttl: float = 30.0,
        deny_ttl: float = 10.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.ttl = ttl
        self.deny_ttl = deny_ttl
        self.max_entries = max_entries
        self._clock = clock
        self._tokens: OrderedDict[str, tuple[float, Identity | None]] = OrderedDict()
        self._access: OrderedDict[tuple[Any, ...], tuple[float, bool]] = OrderedDict()
        self.reviews = 0

    async def identify(self, token: str) -> Identity | None:
        """Who the token belongs to; None when the API server does not accept it."""
        key = hashlib.sha256(token.encode()).hexdigest()
        found = self._cached(self._tokens, key)
        if found is not None:
            cached: Identity | None = found[0]
            return cached
        self.reviews += 1
        review = await _post(
            self.api,
            TOKEN_REVIEWS,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        identity = None
        if status.get("authenticated"):
            user = status.get("user") or {}
            identity = Identity(
                username=str(user.get("username") or ""),
                groups=tuple(str(g) for g in user.get("groups") or ()),
                uid=str(user.get("uid") or ""),
                extra=tuple(
                    (str(k), tuple(str(x) for x in v)) for k, v in (user.get("extra") or {}).items()
                ),
            )
        self._store(self._tokens, key, identity, allowed=identity is not None)
        return identity

    async def allowed(
        self, identity: Identity, *, verb: str, group: str, resource: str, namespace: str = ""
    ) -> bool:
        """Whether ``identity`` may ``verb`` the resource (in ``namespace``, or cluster-wide)."""
        key = (identity, verb, group, resource, namespace)
        found = self._cached(self._access, key)
        if found is not None:
            return bool(found[0])
        attributes: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
        if namespace:
            attributes["namespace"] = namespace
        spec: dict[str, Any] = {
            "user": identity.username,
            "groups": list(identity.groups),
            "resourceAttributes": attributes,
        }
        if identity.uid:
            spec["uid"] = identity.uid
        if identity.extra:
            spec["extra"] = {k: list(v) for k, v in identity.extra}
        access = await _post(
            self.api,
            SUBJECT_ACCESS_REVIEWS,
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        allowed = (access.get("status") or {}).get("allowed") is True
        self._store(self._access, key, allowed, allowed=allowed)
        return allowed

    def _cached(self, cache: OrderedDict[Any, tuple[float, Any]], key: Any) -> tuple[Any] | None:
        entry = cache.get(key)
        if entry is not None and entry[0] > self._clock():
            return (entry[1],)
        return None

    def _store(
        self, cache: OrderedDict[Any, tuple[float, Any]], key: Any, value: Any, *, allowed: bool
    ) -> None:
        cache[key] = (self._clock() + (self.ttl if allowed else self.deny_ttl), value)
        cache.move_to_end(key)
        while len(cache) > self.max_entries:
            cache.popitem(last=False)


async def _post(api: KubeApi, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return await api.request("POST", path, body=body, timeout=10.0)
    except Exception as error:
        raise ReviewFailed(f"POST {path}: {error}") from error
