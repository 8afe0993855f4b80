"""The webhook server reads AdmissionReviews far above aiohttp's 1 MiB default: an object the
API server accepts (up to 3 MiB) reaches the handlers, twice over on an UPDATE."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp

from phalanx.operator.webhooks import MAX_REVIEW_BYTES, PhalanxWebhookServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _post_review(size: int) -> tuple[int, Any]:
    seen: list[int] = []

    async def handler(request: Any, **_: Any) -> dict[str, Any]:
        seen.append(len(json.dumps(request)))
        return {"response": {"allowed": True}}

    server = PhalanxWebhookServer(addr="127.0.0.1", port=_free_port(), insecure=True)
    serving = server(handler)
    config = await anext(serving)
    review = {"request": {"object": {"data": "x" * size}, "oldObject": {"data": "y" * size}}}
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{config['url']}/validate", json=review) as response,
        ):
            body = await response.json() if response.status == 200 else await response.text()
            return response.status, (body, seen)
    finally:
        await serving.aclose()


def test_an_update_review_of_two_3_mib_objects_is_read() -> None:
    status, (body, seen) = asyncio.run(_post_review(3 * 1024 * 1024))
    assert status == 200, body
    assert body == {"response": {"allowed": True}}
    assert seen and seen[0] > 6 * 1024 * 1024


def test_the_limit_covers_two_objects_at_the_api_servers_request_limit() -> None:
    assert MAX_REVIEW_BYTES >= 2 * 3 * 1024 * 1024 + 1024 * 1024
