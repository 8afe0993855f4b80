"""``/api/usage`` as the browser calls it, on the dashboard's own aiohttp app (no API server
is contacted: the local, insecure mode reviews no token and nothing is watched): without a
store it says how to give one; a bad window is refused naming it; with a store, the series."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from phalanx.dashboard.server import DashboardServer
from phalanx.store import db
from phalanx.store import events as ev


async def _get(store_url: str | None, query: str) -> tuple[int, dict[str, Any]]:
    server = DashboardServer(
        None,  # type: ignore[arg-type]  # never called: nothing is started or reviewed
        listen="127.0.0.1",
        port=0,
        insecure_local=True,
        store_url=store_url,
    )
    async with TestClient(TestServer(server.app())) as client:
        response = await client.get(f"/api/usage{query}")
        body = await response.json()
    server.usage.close()
    return response.status, body


def test_without_a_store_the_view_says_how_to_give_one() -> None:
    status, body = asyncio.run(_get(None, ""))
    assert status == 200 and body["store"] is False
    assert "--store URL" in body["problem"]


def test_a_bad_window_or_grouping_is_refused_naming_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    db.upgrade(db.open_engine(url))
    status, body = asyncio.run(_get(url, "?window=1y"))
    assert status == 400 and body["error"] == "window='1y': use one of 24h, 7d, 30d"
    status, body = asyncio.run(_get(url, "?by=flavor"))
    assert status == 400 and "by='flavor'" in body["error"]


def test_with_a_store_the_series_of_the_last_hours(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    engine = db.open_engine(url)
    db.upgrade(engine)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    at = start.strftime("%Y-%m-%dT%H:%M:%SZ")
    workload = {
        "metadata": {"uid": "u", "namespace": "team-a", "name": "w", "creationTimestamp": at},
        "spec": {"queueName": "lq", "podSets": []},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": at}],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 1,
                        "flavors": {"nvidia.com/gpu": "h100"},
                        "resourceUsage": {"nvidia.com/gpu": "8"},
                    }
                ],
            },
        },
    }
    db.write_events(engine, ev.events_of(workload))
    engine.dispose()
    status, body = asyncio.run(_get(url, "?window=24h&by=namespace"))
    assert status == 200 and body["store"] is True
    [series] = body["series"]
    assert series["group"] == "team-a" and len(series["hours"]) == 24
    assert 15.9 < series["total"] < 16.1, "8 GPUs held for two hours, up to now"
