"""A real uvicorn server on a free loopback port, inside the caller's event loop."""

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from gpu_share.coordinator.http.sockets import KEEP_ALIVE_SEC


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def serve(
    app: FastAPI, port: int | None = None, *, lifespan: bool = True
) -> AsyncIterator[str]:
    """Serve `app` until the block ends; yields its base URL.

    `lifespan=False` serves an app whose lifespan the caller already entered. A
    coordinator app takes WebSocket frames up to its settings' `websocket_max_bytes`,
    as `gpu-share server` serves it.
    """
    port = port or free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on" if lifespan else "off",
        timeout_graceful_shutdown=1,  # do not wait out agents' long-polls
        proxy_headers=False,  # as `gpu-share server`: the app decides whom to believe
        timeout_keep_alive=KEEP_ALIVE_SEC,  # as `gpu-share server`: no heartbeat meets a close
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("server stopped during startup")
        await asyncio.sleep(0.01)
    # The coordinator's settings are on its replica, built by the lifespan just run;
    # uvicorn reads the limit for each new connection, and none has come yet.
    replica = getattr(getattr(app, "state", None), "replica", None)  # a coordinator app
    if replica is not None:
        config.ws_max_size = replica.settings.websocket_max_bytes
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)
