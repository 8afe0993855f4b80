"""Writes whose outcome is unknown are read back, never forgotten or blindly repeated.

A scripted API stands in for the API server's Workload status endpoint: it keeps one object
with a resourceVersion, honours the write's resourceVersion precondition as the API server
does (409 when it moved), and fails in the ways a real connection does: after the write
landed (reset, 504, an unreadable answer) or before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from phalanx.operator.kube import ApiError, KubeApi, MalformedResponse, outcome_unknown
from phalanx.operator.kubeconfig import ClusterAuth
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import StatusWriter, WriteOutcome

KEY = "ns/w"
ADMISSION = {"clusterQueue": "cq", "podSetAssignments": []}

Fault = Callable[[], BaseException]


class ScriptedApi:
    """One Workload; each PATCH consumes the next scripted fault (None: answer normally)."""

    def __init__(self, *, patch_faults: list[tuple[str, Fault] | None], get_fails: int = 0):
        self.obj: dict[str, Any] = {
            "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "1"},
            "status": {},
        }
        self.patch_faults = list(patch_faults)
        self.get_fails = get_fails
        self.landed = 0
        self.patches = 0
        self.gets = 0

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        assert method == "PATCH" and path.endswith("/status")
        self.patches += 1
        body = kwargs["body"]
        fault = self.patch_faults.pop(0) if self.patch_faults else None
        if fault is not None and fault[0] == "before":
            raise fault[1]()
        precondition = body["metadata"].get("resourceVersion")
        if precondition is not None and precondition != self.obj["metadata"]["resourceVersion"]:
            raise ApiError(409, {"reason": "Conflict"}, method=method, path=path)
        version = int(self.obj["metadata"]["resourceVersion"]) + 1
        self.obj = {
            "metadata": {**self.obj["metadata"], "resourceVersion": str(version)},
            "status": body["status"],
        }
        self.landed += 1
        if fault is not None:
            raise fault[1]()
        return self.copy()

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> Any:
        self.gets += 1
        if self.get_fails:
            self.get_fails -= 1
            raise aiohttp.ServerDisconnectedError()
        return self.copy()

    def copy(self) -> dict[str, Any]:
        return {"metadata": dict(self.obj["metadata"]), "status": dict(self.obj["status"])}


def admit(current: dict[str, Any]) -> dict[str, Any] | None:
    """The admission builder's contract: None when the Workload already shows it."""
    if (current.get("status") or {}).get("admission") == ADMISSION:
        return None
    return {"admission": ADMISSION, "conditions": []}


def write(api: ScriptedApi) -> WriteOutcome:
    async def main() -> WriteOutcome:
        state = ClusterState()
        state.apply("Workload", None, api.copy())
        writer = StatusWriter(api, state, Metrics())  # type: ignore[arg-type]
        writer.backoff = type(writer.backoff)(initial=0.0, maximum=0.0)
        return await writer.apply_status(KEY, admit, verb="admit")

    return asyncio.run(main())


def reset() -> BaseException:
    return aiohttp.ServerDisconnectedError()


def gateway_timeout() -> BaseException:
    return ApiError(504, {"reason": "Timeout"}, method="PATCH", path="/status")


def unreadable() -> BaseException:
    return MalformedResponse("PATCH /status: HTTP 200 with a non-JSON body")


@pytest.mark.parametrize("fault", [reset, gateway_timeout, unreadable, TimeoutError])
def test_a_write_that_landed_before_the_failure_is_recognised_not_repeated(fault: Fault) -> None:
    api = ScriptedApi(patch_faults=[("after", fault)])
    outcome = write(api)
    assert outcome.ok, outcome
    assert api.landed == 1 and api.gets >= 1
    assert api.obj["status"]["admission"] == ADMISSION


def test_a_write_that_did_not_land_is_written_again_once() -> None:
    api = ScriptedApi(patch_faults=[("before", reset)])
    outcome = write(api)
    assert outcome.ok and api.landed == 1


def test_an_unreachable_api_leaves_the_outcome_unknown_not_failed() -> None:
    api = ScriptedApi(
        patch_faults=[("after", reset), ("before", reset), ("before", reset), ("before", reset)],
        get_fails=10,
    )
    outcome = write(api)
    assert outcome.unknown and not outcome.ok, outcome
    # The first write did land: reporting a failure would have made the core forget it.
    assert api.landed == 1


def test_a_retry_never_lands_on_top_of_a_write_that_landed_late() -> None:
    """The first write lands, its answer is lost and the read-back is cut too: the retry
    carries the old resourceVersion, so it conflicts instead of landing a second time."""
    api = ScriptedApi(patch_faults=[("after", reset)], get_fails=1)
    outcome = write(api)
    assert outcome.ok, outcome
    assert api.landed == 1


def test_a_definite_no_is_a_failure() -> None:
    api = ScriptedApi(
        patch_faults=[
            ("before", lambda: ApiError(422, {"reason": "Invalid"}, method="PATCH", path="/s"))
        ]
    )
    outcome = write(api)
    assert not outcome.ok and not outcome.unknown and outcome.status == 422


def test_which_errors_leave_the_outcome_unknown() -> None:
    assert outcome_unknown(reset())
    assert outcome_unknown(TimeoutError())
    assert outcome_unknown(unreadable())
    assert outcome_unknown(ApiError(500, None, method="PATCH", path="/"))
    assert not outcome_unknown(ApiError(409, None, method="PATCH", path="/"))
    assert not outcome_unknown(ApiError(422, None, method="PATCH", path="/"))


def test_a_non_json_answer_is_an_api_error_or_a_malformed_response() -> None:
    """Through a real HTTP server on loopback: a non-JSON body never escapes as ValueError
    (which the writer did not catch, stranding the admission in flight)."""

    async def main() -> tuple[BaseException | None, BaseException | None]:
        async def broken(request: web.Request) -> web.Response:
            status = 500 if request.path.endswith("/error") else 200
            return web.Response(status=status, text="<html>proxy says no</html>")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", broken)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        api = KubeApi(ClusterAuth(server=f"http://127.0.0.1:{port}"))
        errors: list[BaseException | None] = []
        for path in ("/apis/x/error", "/apis/x/ok"):
            try:
                await api.request("PATCH", path, body={})
                errors.append(None)
            except Exception as error:
                errors.append(error)
        await api.close()
        await runner.cleanup()
        return errors[0], errors[1]

    on_error, on_ok = asyncio.run(main())
    assert isinstance(on_error, ApiError) and on_error.status == 500
    assert isinstance(on_ok, MalformedResponse)
    assert outcome_unknown(on_error) and outcome_unknown(on_ok)
