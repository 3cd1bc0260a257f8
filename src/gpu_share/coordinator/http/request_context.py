"""Every HTTP request gets an id, said back in `X-Request-Id` and bound to the log lines
it causes (`gpu_share.logs`), with the invoke or session its path names; and is counted
and timed for /metrics by the route it matched (`core.metrics`), so the labels stay the
routes' templates, never the ids in a path.

A caller's own `X-Request-Id` (a proxy's, say) is kept when it is a plain token of at most
64 characters, so one id follows the request through both logs; anything else is
replaced.
"""

import re
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpu_share import logs
from gpu_share.coordinator.core import metrics

HEADER = b"x-request-id"
_ACCEPTED = re.compile(rb"[A-Za-z0-9._:-]{1,64}")
_INVOKE = re.compile(r"/invokes/([A-Za-z0-9_-]{1,64})")
_SESSION = re.compile(r"/sessions/([A-Za-z0-9_-]{1,64})")
UNMATCHED = "unmatched"  # the route label of a request no route took (a 404)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        path: str = scope["path"]
        invoke = _INVOKE.search(path)
        session = _SESSION.search(path)
        started = time.perf_counter()
        status = 500  # what the server answers a request that ends without a response

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (HEADER, request_id)]
            await send(message)

        with logs.bound(
            request_id=request_id.decode(),
            invoke_id=invoke.group(1) if invoke else None,
            session_id=session.group(1) if session else None,
            node_id=None,  # bound by `principals` once the caller is known to be a node
        ):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                route = _route_of(scope)
                metrics.HTTP_REQUESTS.labels(scope["method"], route, str(status)).inc()
                metrics.HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)


def _request_id(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == HEADER and _ACCEPTED.fullmatch(value):
            return bytes(value)
    return secrets.token_hex(8).encode()


def _route_of(scope: Scope) -> str:
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED
