"""Bounds every request meets before any other work, authentication included.

- Headers: at most `max_header_bytes` in all, else 431.
- Bodies: a JSON body may be at most `max_json_body_bytes` (result reports a little
  more, to carry inline outputs; a challenge's commit and reveal the protocol's bound).
  A declared Content-Length over the limit is refused at once, without reading a
  byte; a body without one is counted as it arrives and refused as soon as it passes
  the limit, so nothing over it is ever buffered.
  Streaming routes (artifact uploads, agent outputs and checkpoints, session
  forwards) enforce their own, larger limits as they stream.
- NUL characters: refused in paths, queries and JSON strings (`\\u0000`). PostgreSQL
  cannot store them in text, and no id, name or URL of ours contains one.
"""

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.trust import MAX_ANSWER_BODY_BYTES

MiB = 1024 * 1024

# Routes whose bodies stream to storage or to a node and are bounded there.
STREAMING = [
    re.compile(r"^/v1/artifacts/?$"),
    re.compile(r"^/v1/agent/invokes/[^/]+/(outputs|checkpoint)$"),
    re.compile(r"^/v1/gpu/sessions/[^/]+/forward$"),
    re.compile(r"^/console/artifacts/upload$"),  # the browser's upload: the same limits
    re.compile(r"^/v1/agent/benchmarks/upload$"),  # read and dropped, bounded there
]
RESULT_REPORT = re.compile(r"^/v1/agent/invokes/[^/]+/result$")
# A challenge's sketches and revealed rows: bounded by the protocol (`protocol.trust`).
CHALLENGE_ANSWER = re.compile(r"^/v1/agent/challenges/[^/]+/(commit|reveal)$")
NUL_ESCAPE = b"\\u0000"
DRAIN_AT_MOST = 8 * MiB  # read and drop this much of a refused body, so its sender hears why


@dataclass(frozen=True)
class RequestLimits:
    max_header_bytes: int
    max_json_body_bytes: int
    max_result_report_bytes: int

    def body_limit(self, path: str) -> int | None:
        """The most this route's body may be; None for routes that bound it themselves."""
        if any(pattern.match(path) for pattern in STREAMING):
            return None
        if RESULT_REPORT.match(path):
            return self.max_result_report_bytes
        if CHALLENGE_ANSWER.match(path):
            return MAX_ANSWER_BODY_BYTES
        return self.max_json_body_bytes


class RequestLimitMiddleware:
    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if (
            sum(len(name) + len(value) + 4 for name, value in headers)
            > self.limits.max_header_bytes
        ):
            await _refuse(
                scope,
                send,
                431,
                ErrorCode.HEADERS_TOO_LARGE,
                f"request headers may be at most {self.limits.max_header_bytes} bytes in all",
            )
            return
        path: str = scope.get("path", "")
        if (
            "\x00" in path
            or b"%00" in scope.get("query_string", b"")
            or b"\x00" in scope.get("query_string", b"")
        ):
            await _refuse(
                scope, send, 422, ErrorCode.VALIDATION_ERROR, "the URL contains a NUL character"
            )
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = self.limits.body_limit(path)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(headers)
        if declared is not None and declared > limit:
            # Read (and drop) a modest excess so the client hears the answer; a huge one
            # is answered at once and the connection closed under it.
            if declared <= DRAIN_AT_MOST:
                await _drain(receive, DRAIN_AT_MOST)
            await _refuse(scope, send, 413, ErrorCode.PAYLOAD_TOO_LARGE, _too_large(limit))
            return
        await self.app(scope, _bounded(receive, limit), send)


def _bounded(receive: Receive, limit: int) -> Callable[[], Awaitable[Message]]:
    """`receive` that counts the body and refuses it once it passes `limit` or holds a NUL."""
    seen = 0
    tail = b""

    async def bounded_receive() -> Message:
        nonlocal seen, tail
        message = await receive()
        if message["type"] == "http.request":
            chunk: bytes = message.get("body", b"")
            seen += len(chunk)
            if seen > limit:
                if message.get("more_body", False):
                    await _drain(receive, DRAIN_AT_MOST - seen)
                raise HTTPException(413, _too_large(limit))
            if NUL_ESCAPE in tail + chunk:
                raise HTTPException(422, "JSON strings may not contain NUL characters (\\u0000)")
            tail = chunk[-(len(NUL_ESCAPE) - 1) :]
        return message

    return bounded_receive


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a refused body, up to `budget` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _too_large(limit: int) -> str:
    return f"a request body here may be at most {limit} bytes"


async def _refuse(scope: Scope, send: Send, status: int, code: ErrorCode, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    body = json.dumps({"error": {"code": code.value, "message": message, "details": None}})
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the unread body is not worth reading
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


def limits_of(settings: Settings) -> RequestLimits:
    return RequestLimits(
        max_header_bytes=settings.max_header_bytes,
        max_json_body_bytes=settings.max_json_body_bytes,
        # inline outputs travel base64-encoded inside the report
        max_result_report_bytes=settings.inline_output_limit_bytes * 4 // 3 + MiB,
    )
