"""The baseline for bench/upload.py: a bare ASGI app that hashes the body and discards it.

Run as `uvicorn bench.bare_upload_app:app`. No framework, no auth, no database, no disk.
"""

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]


async def app(
    scope: Scope,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    hasher = hashlib.sha256()
    size = 0
    while True:
        message = await receive()
        body = message.get("body", b"")
        hasher.update(body)
        size += len(body)
        if not message.get("more_body"):
            break
    payload = json.dumps({"sha256": hasher.hexdigest(), "size": size}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": payload})
