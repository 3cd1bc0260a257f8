"""What the security headers cost a JSON answer: the same bare Starlette JSON route called
straight through ASGI, with and without `SecurityHeadersMiddleware`, 20,000 calls a round,
best of 15 rounds each. Prints the microseconds per call and the ratio.

    .venv/bin/python bench/security_headers.py
"""

import asyncio
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from gpu_share.coordinator.http.security_headers import SecurityHeadersMiddleware

CALLS = 20_000
ROUNDS = 15
SCOPE: dict[str, Any] = {
    "type": "http",
    "method": "GET",
    "path": "/v1/gpu/invokes/inv_x",
    "raw_path": b"/v1/gpu/invokes/inv_x",
    "query_string": b"",
    "headers": [(b"host", b"bench")],
    "http_version": "1.1",
    "scheme": "http",
    "server": ("bench", 80),
    "client": ("127.0.0.1", 1),
    "root_path": "",
}


async def invoke(_request: Request) -> JSONResponse:
    return JSONResponse({"id": "inv_x", "status": "queued"})


async def per_call_us(app: ASGIApp) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(_message: Any) -> None:
        pass

    started = time.perf_counter()
    for _ in range(CALLS):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - started) / CALLS * 1e6


async def main() -> None:
    bare = Starlette(routes=[Route("/v1/gpu/invokes/inv_x", invoke)])
    ours = SecurityHeadersMiddleware(bare)
    bare_us, ours_us = [], []
    for _ in range(ROUNDS):  # alternated, so a busy moment hits both
        bare_us.append(await per_call_us(bare))
        ours_us.append(await per_call_us(ours))
    b, o = min(bare_us), min(ours_us)
    print(f"bare {b:.2f} us/call, with the headers {o:.2f} us/call: {o / b:.3f} (+{o - b:.2f} us)")


if __name__ == "__main__":
    asyncio.run(main())
