"""The relay app (`api.relay`) served on a socket of its own, in the coordinator's event
loop, so that peers reach this process's hub even when several processes share the
public port (`gpu-share server --workers N`)."""

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

from gpu_share.coordinator.http.sockets import KEEP_ALIVE_SEC, bound_tcp

_IN_RELAY = contextvars.ContextVar("in_relay_listener", default=False)


class _QuietRelay(logging.Filter):
    """uvicorn's loggers are global: its start and stop lines from the relay listener
    ("Started server process", "Shutting down"…) would repeat the public server's. They
    are dropped; its warnings and errors are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _IN_RELAY.get()


_QUIET = _QuietRelay()


class RelayListener:
    def __init__(self, app: ASGIApp, host: str, port: int, advertise_host: str = "") -> None:
        self._sock = bound_tcp(host, port)
        bound_port = self._sock.getsockname()[1]
        name = advertise_host or host
        self.url = f"http://[{name}]:{bound_port}" if ":" in name else f"http://{name}:{bound_port}"
        # log_config and log_level None: uvicorn leaves logging as the process set it (a
        # level here would apply to the public server's lines too: uvicorn's loggers are global)
        config = uvicorn.Config(
            app,
            access_log=False,
            log_config=None,
            log_level=None,
            lifespan="off",
            proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_SEC,  # peers forward on kept-alive connections
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        logger = logging.getLogger("uvicorn.error")
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)
        # The server's task, and the tasks it starts, run with this set (`_QuietRelay`).
        context = contextvars.copy_context()
        context.run(_IN_RELAY.set, True)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), context=context)
        while not self._server.started and not self._task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if not self._server.started:
            await self._task  # raises what stopped it
            raise RuntimeError(f"the relay listener on {self.url} did not start")

    async def stop(self) -> None:
        if self._task is None:
            self._sock.close()
            return
        self._server.should_exit = True
        await self._task


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process's own server handles signals
