"""What the API server serves and what this operator may do there, asked once at start.

The operator watches a kind it does not integrate (or one whose integration is disabled) only
to tell its queued objects they are left alone. It does so only where the kind is served
(discovery) and where it may list and watch it (SelfSubjectAccessReviews, which every
authenticated user may create), so that the default install never makes a refused call.

Discovery is fetched once per API group, however many kinds are asked about. A transport
failure or a 5xx is asked again with backoff, a few times: an answer that cannot be had is
then a *no* (the kind is not watched until the next start, and the log says so), never a
crash, because what hangs on it is an Event, not scheduling. Once one question has gone
unanswered that way, later ones are asked once each, so an API server away at start delays
the start by one question's backoff, not by every question's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from phalanx.operator.kube import API_ERRORS, ApiError, Resource
from phalanx.operator.retry import Backoff

__all__ = ["AccessProbe", "Requester"]

logger = logging.getLogger("phalanx.operator")

ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class Requester(Protocol):
    def __call__(
        self, method: str, path: str, *, body: Any = None
    ) -> Awaitable[dict[str, Any]]: ...


class _NoAnswer(Exception):
    """Every attempt failed; the last error was logged."""


class AccessProbe:
    """Start-up questions to the API server, with a per-group discovery cache."""

    def __init__(
        self,
        request: Requester,
        *,
        namespaces: Sequence[str] = (),
        attempts: int = 4,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``namespaces`` are those the operator watches (empty: all). A question is asked
        up to ``attempts`` times while the answer is a transport failure or a 5xx."""
        self._request = request
        self._namespaces = tuple(namespaces)
        self._attempts = max(1, attempts)
        self._backoff = backoff or Backoff(initial=0.5, maximum=4.0)
        self._sleep = sleep
        self._groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
        self._away = False  # a question went unanswered after every attempt

    async def served(self, group: str, plural: str) -> Resource | None:
        """``plural`` of ``group`` in the version the API server prefers among those that
        serve it, or None when no version does (its CRD is not installed) or discovery
        could not be had."""
        versions = await self._group(group)
        for version, resources in versions or ():
            for entry in resources:
                if entry.get("name") == plural:
                    return Resource(group, version, plural, bool(entry.get("namespaced", True)))
        return None

    async def may_watch(self, resource: Resource) -> bool:
        """Whether this operator may list and watch ``resource`` everywhere it looks."""
        namespaces: tuple[str | None, ...] = (
            self._namespaces if resource.namespaced and self._namespaces else (None,)
        )
        for namespace in namespaces:
            for verb in ("list", "watch"):
                attributes = {"group": resource.group, "resource": resource.plural, "verb": verb}
                if namespace is not None:
                    attributes["namespace"] = namespace
                body = {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attributes},
                }
                try:
                    review = await self._ask("POST", ACCESS_REVIEWS, body=body)
                except _NoAnswer:
                    return False
                if not (review.get("status") or {}).get("allowed"):
                    logger.info(
                        "event=disabled_kind_not_watched resource=%s.%s verb=%s"
                        " reason=not_permitted",
                        resource.plural,
                        resource.group,
                        verb,
                    )
                    return False
        return True

    async def _group(self, group: str) -> list[tuple[str, list[dict[str, Any]]]] | None:
        if group in self._groups:
            return self._groups[group]
        found: list[tuple[str, list[dict[str, Any]]]] = []
        try:
            listing = await self._ask("GET", f"/apis/{group}", absent_ok=True)
            preferred = (listing.get("preferredVersion") or {}).get("version")
            names = [str(v.get("version")) for v in listing.get("versions") or ()]
            for version in sorted(names, key=lambda v: v != preferred):
                resources = await self._ask("GET", f"/apis/{group}/{version}", absent_ok=True)
                found.append((version, list(resources.get("resources") or ())))
        except _NoAnswer:
            return None  # not cached: a later question about the group asks again
        self._groups[group] = found
        return found

    async def _ask(
        self, method: str, path: str, *, body: Any = None, absent_ok: bool = False
    ) -> dict[str, Any]:
        """The answer, asked again on a transport failure or a 5xx. A 404 on a discovery
        path (``absent_ok``) is an empty answer; any other 4xx, or the last failure, is
        logged and raises :class:`_NoAnswer`."""
        attempts = 1 if self._away else self._attempts
        for attempt in range(attempts):
            try:
                answer = await self._request(method, path, body=body)
            except API_ERRORS as error:
                if absent_ok and isinstance(error, ApiError) and error.status == 404:
                    return {}
                retry = not isinstance(error, ApiError) or error.status >= 500
                if retry and attempt + 1 < attempts:
                    await self._sleep(self._backoff.delay(attempt))
                    continue
                self._away = self._away or retry
                logger.warning(
                    "event=start_question_failed method=%s path=%s attempts=%d error=%r",
                    method,
                    path,
                    attempt + 1,
                    error,
                )
                raise _NoAnswer from error
            self._away = False
            return answer
        raise AssertionError("unreachable")
