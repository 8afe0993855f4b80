"""The informer's decoding, dispatch, relist and backoff logic, without a server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from phalanx.operator import informer as informer_mod
from phalanx.operator.informer import (
    Backoff,
    Informer,
    LineSplitter,
    WatchGone,
    object_key,
    typed,
)
from phalanx.operator.kube import WORKLOADS, ApiError


def _wl(name: str, rv: int, ns: str = "team-a") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
        }
    }


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, object_key(obj)))


def _informer(handler: Recorder | None = None) -> Informer:
    return Informer(api=None, resource=WORKLOADS, handler=handler or Recorder())  # type: ignore[arg-type]


# -- line splitting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "lines", "pending"),
    [
        ([b'{"a":1}\n'], [b'{"a":1}'], b""),
        ([b'{"a":', b'1}\n{"b"', b":2}\n"], [b'{"a":1}', b'{"b":2}'], b""),
        ([b'{"a":1}\n\n{"b":2}'], [b'{"a":1}'], b'{"b":2}'),
        ([b"x" * 100_000, b"\n"], [b"x" * 100_000], b""),
    ],
)
def test_line_splitter_reassembles_lines_across_chunks(
    chunks: list[bytes], lines: list[bytes], pending: bytes
) -> None:
    splitter = LineSplitter()
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    assert out == lines
    assert splitter.pending == pending


# -- backoff ----------------------------------------------------------------------------------


def test_backoff_grows_exponentially_and_caps() -> None:
    backoff = Backoff(initial=0.5, factor=2.0, maximum=4.0)
    assert [backoff.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_backoff_honours_longer_retry_after_but_not_beyond_the_cap() -> None:
    backoff = Backoff(initial=0.5, factor=2.0, maximum=10.0)
    assert backoff.delay(0, retry_after=3) == 3
    assert backoff.delay(3, retry_after=1) == 4.0
    assert backoff.delay(0, retry_after=60) == 10.0


def test_retry_after_parses_seconds_and_ignores_dates() -> None:
    assert informer_mod.retry_after_seconds("7") == 7.0
    assert informer_mod.retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert informer_mod.retry_after_seconds(None) is None


# -- dispatch of watch lines ------------------------------------------------------------------


def test_watch_lines_are_dispatched_and_advance_the_resource_version() -> None:
    rec = Recorder()
    inf = _informer(rec)
    inf.feed_lines(
        [
            _line("ADDED", _wl("a", 10)),
            _line("MODIFIED", _wl("a", 11)),
            _line("ADDED", _wl("b", 12)),
            _line("DELETED", _wl("a", 13)),
        ]
    )
    assert rec.events == [
        ("ADDED", "team-a/a"),
        ("MODIFIED", "team-a/a"),
        ("ADDED", "team-a/b"),
        ("DELETED", "team-a/a"),
    ]
    assert inf.resource_version == "13"
    assert len(inf) == 1


def test_bookmark_moves_the_resource_version_without_an_event() -> None:
    rec = Recorder()
    inf = _informer(rec)
    inf.feed_line(_line("BOOKMARK", {"metadata": {"resourceVersion": "99"}}))
    assert rec.events == []
    assert inf.resource_version == "99"
    assert inf.stats.bookmarks == 1


def test_error_410_in_the_stream_asks_for_a_relist() -> None:
    inf = _informer()
    with pytest.raises(WatchGone):
        inf.feed_line(_line("ERROR", {"kind": "Status", "code": 410, "message": "too old"}))


def test_other_stream_errors_are_raised_for_backoff() -> None:
    inf = _informer()
    with pytest.raises(informer_mod.WatchStreamError, match="500"):
        inf.feed_line(_line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}))


def test_a_failing_handler_does_not_stop_the_stream() -> None:
    seen: list[str] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("boom")
        seen.append(obj["metadata"]["name"])

    inf = Informer(api=None, resource=WORKLOADS, handler=handler)  # type: ignore[arg-type]
    inf.feed_lines([_line("ADDED", _wl("bad", 1)), _line("ADDED", _wl("good", 2))])
    assert seen == ["good"]
    assert inf.stats.handler_errors == 1
    assert inf.resource_version == "2"


def test_cluster_scoped_keys_have_no_namespace() -> None:
    assert object_key({"metadata": {"name": "node-1"}}) == "node-1"
    assert object_key(_wl("a", 1, ns="ns")) == "ns/a"


# -- relist -----------------------------------------------------------------------------------


class Pages:
    """Serves list pages in order; an ApiError in the sequence is raised instead."""

    def __init__(self, pages: list[dict[str, Any] | ApiError]) -> None:
        self.pages = list(pages)
        self.params: list[dict[str, str]] = []

    async def __call__(self, params: dict[str, str]) -> dict[str, Any]:
        self.params.append(dict(params))
        page = self.pages.pop(0)
        if isinstance(page, ApiError):
            raise page
        return page


def _page(items: list[dict[str, Any]], *, rv: str, cont: str | None = None) -> dict[str, Any]:
    metadata: dict[str, str] = {"resourceVersion": rv}
    if cont:
        metadata["continue"] = cont
    return {"items": items, "metadata": metadata}


def test_relist_paginates_and_reports_vanished_objects_as_deleted() -> None:
    rec = Recorder()
    inf = _informer(rec)
    inf.feed_lines([_line("ADDED", _wl("gone", 1)), _line("ADDED", _wl("kept", 2))])
    rec.events.clear()
    pages = Pages(
        [
            _page([_wl("kept", 5)], rv="", cont="tok1"),
            _page([_wl("new", 6)], rv="7"),
        ]
    )
    inf._get_json = pages  # type: ignore[method-assign]
    asyncio.run(inf._relist())
    assert rec.events == [
        ("MODIFIED", "team-a/kept"),
        ("ADDED", "team-a/new"),
        ("DELETED", "team-a/gone"),
    ]
    assert pages.params[0]["limit"] == "500" and "continue" not in pages.params[0]
    assert pages.params[1]["continue"] == "tok1"
    assert inf.resource_version == "7"
    assert inf.synced.is_set()


def test_relist_restarts_when_the_continue_token_expires() -> None:
    rec = Recorder()
    inf = _informer(rec)
    gone = ApiError(410, {"reason": "Expired"}, method="GET", path="/x")
    pages = Pages(
        [
            _page([_wl("a", 1)], rv="", cont="tok1"),
            gone,
            _page([_wl("a", 3), _wl("b", 4)], rv="9"),
        ]
    )
    inf._get_json = pages  # type: ignore[method-assign]
    asyncio.run(inf._relist())
    assert "continue" not in pages.params[2]
    assert inf.resource_version == "9"
    assert len(inf) == 2


def test_on_synced_is_called_once() -> None:
    calls: list[int] = []
    inf = Informer(
        api=None,  # type: ignore[arg-type]
        resource=WORKLOADS,
        handler=Recorder(),
        on_synced=lambda: calls.append(1),
    )
    inf._get_json = Pages([_page([], rv="1"), _page([], rv="2")])  # type: ignore[method-assign]
    asyncio.run(inf._relist())
    asyncio.run(inf._relist())
    assert calls == [1]


# -- the run loop: resume, relist on Gone, backoff on errors ----------------------------------


def _run_scripted(
    inf: Any,
    outcomes: list[BaseException | None],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[str], list[float]]:
    """Run the informer's loop with relist/watch replaced by a script of outcomes (None: the
    watch ends normally) until it raises CancelledError; returns the calls and the sleeps."""
    script: list[str] = []
    sleeps: list[float] = []

    async def relist() -> None:
        script.append("list")
        inf.resource_version = "100"

    async def watch() -> None:
        script.append(f"watch@{inf.resource_version}")
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    inf._relist = relist
    inf._watch = watch
    monkeypatch.setattr(informer_mod.asyncio, "sleep", fake_sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(inf.run())
    return script, sleeps


def test_run_backs_off_on_errors_relists_on_gone_and_resumes_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inf = _informer()
    inf.backoff = Backoff(initial=1.0, factor=2.0, maximum=8.0)
    outcomes: list[BaseException | None] = [
        None,  # watch ends normally (server timeout): resume with the same resourceVersion
        ApiError(503, {}, method="GET", path="/x"),
        ApiError(429, {"_retry_after": "5"}, method="GET", path="/x"),
        WatchGone("compacted"),
        None,
        asyncio.CancelledError(),
    ]
    script, sleeps = _run_scripted(inf, outcomes, monkeypatch)
    assert script == [
        "list",
        "watch@100",
        "watch@100",
        "watch@100",
        "watch@100",
        "list",
        "watch@100",
        "watch@100",
    ]
    assert sleeps == [1.0, 5.0]
    assert inf.stats.relists_on_gone == 1
    assert inf.stats.errors == 2


def test_a_retry_after_from_a_restarted_server_ends_the_connection_error_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An API-server restart: refused connections grow the backoff; the first answer (429,
    # "storage is (re)initializing", Retry-After: 1) says the server is back.
    inf = _informer()
    inf.backoff = Backoff(initial=0.5, factor=2.0, maximum=30.0)
    outcomes: list[BaseException | None] = [
        *(ConnectionRefusedError() for _ in range(5)),
        ApiError(429, {"_retry_after": "1"}, method="GET", path="/x"),
        ConnectionRefusedError(),
        asyncio.CancelledError(),
    ]
    _, sleeps = _run_scripted(inf, outcomes, monkeypatch)
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 1.0, 1.0]


def test_list_items_get_the_kind_and_api_version_the_list_leaves_out() -> None:
    # A list's items carry no kind: an Event written about a Job first seen in the initial
    # list named it a kueue.x-k8s.io Workload (the writer's default), so `kubectl describe
    # job` never showed it.
    page = {"kind": "JobList", "apiVersion": "batch/v1", "items": []}
    item: dict[str, Any] = {"metadata": {"name": "train"}}
    assert typed(item, page) == {
        "kind": "Job",
        "apiVersion": "batch/v1",
        "metadata": {"name": "train"},
    }
    kept = {"kind": "Other", "apiVersion": "x/v1", "metadata": {}}
    assert typed(dict(kept), page) == kept
